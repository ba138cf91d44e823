"""What a model will cost, by kind, from its GGUF header alone (nothing is read or allocated)."""
from __future__ import annotations

from dataclasses import dataclass

from minferd.config import KV_BLOCK_TOKENS
from minferd.devices import DeviceTraits
from minferd.model.arch.llama import MATMUL, MOE_ROLES, VECTOR
from minferd.model.loader import ModelFile

VECTOR_ELEM_BYTES = 4  # norms and biases are held as f32 on every backend


@dataclass(frozen=True, slots=True)
class Estimate:
    weights: int  # quantized matrices (MoE experts and routers included) as stored, vectors as f32
    w16: int  # what a W16 plan adds: 2 bytes per matmul element (MoE tensors get no f16 copy)
    kv: int
    scratch: int
    matmul_bytes: int  # quantized bytes of the matmul weights an f16 copy covers (with expert_bytes: the W16 size gate)
    matmul_types: frozenset  # type names of the matmul weights, MoE ones included (the quantized path runs them)
    ctx: int
    expert_bytes: int = 0  # quantized bytes of a MoE's experts and routers: never in an f16 copy

    def total(self, with_w16: bool) -> int:
        return self.weights + self.kv + self.scratch + (self.w16 if with_w16 else 0)

    def by_kind(self, with_w16: bool) -> dict[str, int]:
        return {"weights": self.weights, "w16": self.w16 if with_w16 else 0, "kv": self.kv, "scratch": self.scratch}


def kv_blocks(kv_tokens: int, block_size: int = KV_BLOCK_TOKENS) -> int:
    """Blocks of a model's paged KV: its tokens' worth, and one a padded decode batch writes to."""
    return -(-kv_tokens // block_size) + 1


def kv_bytes(mf: ModelFile, kv_tokens: int, elem_bytes: int) -> int:
    s = mf.spec
    return kv_blocks(kv_tokens) * KV_BLOCK_TOKENS * s.n_layers * s.kv_dim * 2 * elem_bytes


def estimate(mf: ModelFile, traits: DeviceTraits, ctx: int, kv_tokens: int | None = None) -> Estimate:
    """kv_tokens: positions the paged KV holds for all sequences together (None: one ctx)."""
    weights = w16 = mm_bytes = expert_bytes = 0
    types = set()
    for t, role in mf.tensors.values():
        weights += t.n_elems * VECTOR_ELEM_BYTES if role == VECTOR else t.n_bytes
        if role == MATMUL:
            w16 += 2 * t.n_elems
            mm_bytes += t.n_bytes
        if role == MATMUL or role in MOE_ROLES:
            types.add(t.qtype.name)
        if role in MOE_ROLES:
            expert_bytes += t.n_bytes
    scratch = traits.scratch_bytes(mf.spec, ctx, traits.max_batch)
    kv = kv_bytes(mf, kv_tokens or ctx, traits.kv_elem_bytes)
    return Estimate(weights, w16, kv, scratch, mm_bytes, frozenset(types), ctx, expert_bytes)
