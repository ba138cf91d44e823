"""What the host holds per loaded file and per loaded model (the pool sees LoadedModel as a tenant)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from minferd.devices import MatmulPath
from minferd.model.arch.llama import MATMUL
from minferd.model.loader import ModelFile
from minferd.pool.planner import Plan
from minferd.worker import ModelWorker


@dataclass(eq=False)
class WeightSet:
    """One file's tensors on the device, shared (refcounted) by every model loaded from it."""

    key: tuple
    tag: str
    file: ModelFile
    weights: dict
    tokenizer: object
    plan: Plan
    users: list = field(default_factory=list)
    demoted: bool = False  # planned W16 but its f16 copy was given back under pressure

    def w16_bytes(self) -> int:
        return sum(w.w16.nbytes for w in self.weights.values() if w.w16 is not None)

    def matmul_weights(self):
        return [self.weights[n] for n, (_, role) in self.file.tensors.items() if role == MATMUL]

    def waiting_for_w16(self) -> bool:
        """Planned W16 and demoted, or quantized only because the copy did not fit: either
        gets the copy when memory frees (Host.promote_waiting)."""
        return (self.demoted or self.plan.wants_w16) and not self.w16_bytes()

    def current_path(self, traits) -> MatmulPath:
        """The path requests take now: the f16 copy where one is held (planned, or promoted
        later); a demoted W16 set runs its quantized path."""
        if self.w16_bytes():
            return MatmulPath.W16
        if self.plan.matmul_path == MatmulPath.W16:
            est_types = frozenset(w.qtype.name for w in self.matmul_weights())
            missing = est_types - traits.path_types[MatmulPath.MMQ]
            return MatmulPath.FUSED_B if missing else MatmulPath.MMQ
        return self.plan.matmul_path


@dataclass(eq=False)
class LoadedModel:
    name: str
    ws: WeightSet
    model: object
    cache: object
    ctx: int
    pinned: bool
    keep_alive: float
    host: object  # the Host, which carries out demote and unload
    worker: ModelWorker = None
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)
    requests: int = 0
    tokens: int = 0

    def __post_init__(self):
        if self.worker is None:
            self.worker = ModelWorker(self.name)

    @property
    def busy(self) -> bool:
        return self.worker.pending > 0

    # ---- the pool's view (manager.Tenant) -----------------------------------------------------
    def idle(self) -> bool:
        return not any(u.busy for u in self.ws.users)

    def expired(self, now: float) -> bool:
        return self.keep_alive >= 0 and now - self.last_used >= self.keep_alive

    def w16_bytes(self) -> int:
        # A shared weight set is demoted once, through its first user.
        return self.ws.w16_bytes() if self.ws.users and self.ws.users[0] is self else 0

    def footprint(self) -> int:
        ledger = self.host.ledger
        own = ledger.held(self.name)
        return own + (ledger.held(self.ws.tag) if self.ws.users == [self] else 0)

    def demote(self) -> int:
        return self.host.demote(self.name)

    def unload(self) -> int:
        self.host.event("evicted", self.name)
        return self.host.unload(self.name)


