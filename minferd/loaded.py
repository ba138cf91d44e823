"""What the host holds per loaded file (WeightSet) and per loaded model (LoadedModel)."""
from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field

from minferd.devices import MatmulPath
from minferd.model.arch.llama import MATMUL
from minferd.model.loader import ModelFile
from minferd.pool.planner import Plan, quantized_path
from minferd.config import MAX_RUNNING_SEQS
from minferd.engine.engine import ModelEngine


def weight_set_id(identity: tuple) -> str:
    """A short stable name for an opened file's identity (device, inode, size, mtime)."""
    return hashlib.sha1(repr(identity).encode()).hexdigest()[:12]


@dataclass(eq=False)
class WeightSet:
    """One file's tensors on the device, shared by every model loaded from it. Keyed by the opened
    file's identity, not its name: a file replaced under the same name is another weight set."""

    key: tuple  # the file's identity
    file: ModelFile
    plan: Plan  # fixed at its first load; every model of the set runs it
    weights: dict = field(default_factory=dict)
    tokenizer: object = None
    users: list = field(default_factory=list)  # loaded models reading it
    refs: int = 0  # users + loads in progress that will read it; freed at 0
    demoted: bool = False  # planned W16 but its f16 copy was given back under pressure
    changing: bool = False  # an f16 copy is being built or dropped
    ready: object = None  # threading.Event set once its first load committed (or failed)
    backend: object = None  # the backend that uploaded it (frees it)
    type_mix: dict = field(init=False)  # tensor type name -> count, for status

    def __post_init__(self):
        self.type_mix = dict(Counter(t.qtype.name for t, _ in self.file.tensors.values()))

    @property
    def id(self) -> str:
        return weight_set_id(self.key)

    @property
    def tag(self) -> str:
        # The ledger's owner of its weights and f16 copy; the space keeps it apart from model names.
        return f"weights {self.id}"

    def w16_bytes(self) -> int:
        return sum(w.w16.nbytes for w in self.weights.values() if w.w16 is not None)

    def matmul_weights(self):
        return [self.weights[n] for n, (_, role) in self.file.tensors.items() if role == MATMUL]

    def wants_w16(self) -> bool:
        return self.plan.matmul_path == MatmulPath.W16 or self.plan.wants_w16

    def waiting_for_w16(self) -> bool:
        """Planned W16 and demoted, or quantized only because the copy did not fit: either
        gets the copy when memory frees (Host.promote_waiting)."""
        return (self.demoted or self.plan.wants_w16) and not self.w16_bytes()

    def current_path(self, traits, w16_held: int | None = None) -> MatmulPath:
        """The path requests take now: the f16 copy where one is held (planned, or promoted
        later); a demoted W16 set runs its quantized path. w16_held: the ledger's figure, where
        the caller has a snapshot."""
        if self.w16_bytes() if w16_held is None else w16_held:
            return MatmulPath.W16
        if self.plan.matmul_path == MatmulPath.W16:
            return quantized_path(self.file.matmul_types(), traits)[0]
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
    kv_tokens: int = 0  # positions the paged KV holds for all its sequences
    worker: ModelEngine = None  # runs its requests, batched
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)

    def __post_init__(self):
        if self.worker is None:
            self.worker = ModelEngine(self.name, self.model, self.cache, self.ctx, MAX_RUNNING_SEQS)

    @property
    def requests(self) -> int:
        """Requests that ran (a cancelled one included, once it started)."""
        return self.worker.requests

    @property
    def tokens(self) -> int:
        return self.worker.tokens

    @property
    def busy(self) -> bool:
        return self.worker.pending > 0

    def idle(self) -> bool:
        return not any(u.busy for u in self.ws.users)

    def expires_at(self) -> float:
        return float("inf") if self.keep_alive < 0 else self.last_used + self.keep_alive
