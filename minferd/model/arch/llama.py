"""The llama decoder: pre-norm attention (GQA, rope) and a SwiGLU MLP. Qwen2 and Qwen3 are
small variations of it (arch/qwen2.py, arch/qwen3.py); Gemma 3 reuses its plumbing.

A model is given its weights already on a backend; reading files is the loader's job.
"""
from __future__ import annotations

import numpy as np

from minferd.backend.base import Backend, KVCache, Weight
from minferd.backend.batch import Batch
from minferd.config import KV_BLOCK_TOKENS
from minferd.devices import LOGITS_ROWS
from minferd.model.spec import ModelSpec

# Tensor roles decide which types are acceptable: matmul and embedding weights may be any type
# of kernels/quant.py; norms and biases are small vectors kept in float.
MATMUL, EMBED, VECTOR = "matmul", "embed", "vector"
# MoE matmuls, any type too, that never get an f16 copy: stacked experts are most of a MoE's
# bytes and are priced apart; the router picks experts by the order of its logits, which f16
# rounding of an f32 router would change (llama.cpp keeps routers in f32).
EXPERTS, ROUTER = "experts", "router"
MOE_ROLES = (EXPERTS, ROUTER)


class LlamaModel:
    backends = ("cpu", "cuda")  # the backends with kernels for every op its forward pass calls
    graph_safe = True  # a pass never reads the device's results on the host (a CUDA graph can hold it)

    def __init__(self, spec: ModelSpec, weights: dict[str, Weight], backend: Backend):
        self.spec, self.w, self.be = spec, weights, backend
        self.max_batch = backend.max_batch  # tokens per forward call: sizes rings and scratch
        self.output = weights.get("output.weight") or weights["token_embd.weight"]
        ff = weights.get("rope_freqs.weight")
        self.freq_factors = None if ff is None else ff.data

    # ---- the tensors a file must hold -----------------------------------------------------
    @classmethod
    def expected_tensors(cls, s: ModelSpec) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (GGUF shape, role) of every tensor the forward pass reads."""
        t = {"token_embd.weight": ((s.hidden, s.n_vocab), EMBED),
             "output_norm.weight": ((s.hidden,), VECTOR)}
        if not s.tied_embeddings:
            t["output.weight"] = ((s.hidden, s.n_vocab), MATMUL)
        for i in range(s.n_layers):
            t.update(cls.layer_tensors(s, f"blk.{i}."))
        return t

    @classmethod
    def optional_tensors(cls, s: ModelSpec) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"rope_freqs.weight": ((s.head_dim // 2,), VECTOR)}

    @classmethod
    def layer_tensors(cls, s: ModelSpec, p: str) -> dict:
        return {
            p + "attn_norm.weight": ((s.hidden,), VECTOR),
            p + "attn_q.weight": ((s.hidden, s.q_dim), MATMUL),
            p + "attn_k.weight": ((s.hidden, s.kv_dim), MATMUL),
            p + "attn_v.weight": ((s.hidden, s.kv_dim), MATMUL),
            p + "attn_output.weight": ((s.q_dim, s.hidden), MATMUL),
            p + "ffn_norm.weight": ((s.hidden,), VECTOR),
            p + "ffn_gate.weight": ((s.hidden, s.ffn), MATMUL),
            p + "ffn_up.weight": ((s.hidden, s.ffn), MATMUL),
            p + "ffn_down.weight": ((s.ffn, s.hidden), MATMUL),
        }

    # ---- forward ---------------------------------------------------------------------------
    def new_cache(self, mem, ctx: int, block_size: int = KV_BLOCK_TOKENS) -> KVCache:
        """A cache of at least ctx positions (whole blocks)."""
        s = self.spec
        return self.be.alloc_kv(mem, s.n_layers, -(-ctx // block_size), block_size, s.n_kv_heads, s.head_dim)

    def forward(self, ids, cache: KVCache, all_logits: bool = False):
        """One sequence alone: tokens `ids` at positions cache.n_tokens.., appended to the cache.
        Logits (n, vocab) of every position if all_logits, else (1, vocab) of the last."""
        n = len(ids)
        if cache.n_tokens + n > cache.ctx or n > self.max_batch:
            raise ValueError(f"{n} tokens at position {cache.n_tokens}: past the context of {cache.ctx} "
                             f"or the batch of {self.max_batch}")
        out = self.forward_batch(Batch.solo(ids, cache.n_tokens, cache), cache, all_logits)
        cache.n_tokens += n
        return out

    def forward_batch(self, batch: Batch, cache: KVCache, all_logits: bool = False):
        """Run a batch of sequences' new tokens, writing their K and V to the batch's slots.
        Returns logits (B, vocab) of each sequence's last token, or (n, vocab) of every token."""
        s, be = self.spec, self.be
        with be.scope():
            be.prepare(batch)
            x = be.embed(batch.dev.get("ids", batch.ids), self.w["token_embd.weight"])
            if s.embed_scale != 1.0:
                x = x * np.float32(s.embed_scale)
            for i in range(s.n_layers):
                x = self.layer(i, x, batch, cache)
            if "logit_rows" in batch.dev:  # a prompt's rows in a graph: the last one's logits alone
                x = x[batch.dev["logit_rows"]]
            elif not all_logits and not batch.is_decode:
                x = x[batch.dev.get("last_rows", batch.last_rows())]
            x = be.rmsnorm(x, self.w["output_norm.weight"], s.norm_eps)
            if x.shape[0] <= LOGITS_ROWS or not all_logits:
                return be.matmul(x, self.output)
            # Every position's logits: a vocabulary-wide row block at a time, gathered on the host.
            return np.concatenate([be.to_host(be.matmul(x[r:r + LOGITS_ROWS], self.output))
                                   for r in range(0, x.shape[0], LOGITS_ROWS)])

    def qkv(self, i: int, x):
        """Layer i's q (n, Hq, D), k and v (n, Hkv, D): projected, biased where the file has biases
        (q's and k's head norms, where the architecture has them, come in rope_kv: qk_norm)."""
        s, be, p = self.spec, self.be, f"blk.{i}."
        n = x.shape[0]
        names = [p + "attn_q", p + "attn_k", p + "attn_v"]
        q, k, v = be.matmuls(x, [self.w[m + ".weight"] for m in names], [self.w.get(m + ".bias") for m in names])
        q = q.reshape(n, s.n_heads, s.head_dim)
        k = k.reshape(n, s.n_kv_heads, s.head_dim)
        v = v.reshape(n, s.n_kv_heads, s.head_dim)
        return q, k, v

    def qk_norm(self, i: int) -> tuple | None:
        """(q's head norm, k's, eps) where the architecture norms them (rope_kv applies them)."""
        if not self.spec.qk_norm:
            return None
        p = f"blk.{i}."
        return self.w[p + "attn_q_norm.weight"], self.w[p + "attn_k_norm.weight"], self.spec.norm_eps

    def attention(self, i: int, x, batch: Batch, cache: KVCache):
        """Project, rope, cache and attend; returns the attention output before attn_output."""
        s, be = self.spec, self.be
        swa = s.swa_layers[i]
        base = s.rope_base_swa if swa else s.rope_base
        scale = 1.0 if swa else s.rope_scale
        neox = s.rope_type == "neox"
        q = None
        if not neox and not s.qk_norm:  # rope pairs in adjacent rows: the products may end in rope_kv's work
            names = [f"blk.{i}.attn_{m}" for m in "qkv"]
            q = be.qkv_rope_kv(x, [self.w[m + ".weight"] for m in names], [self.w.get(m + ".bias") for m in names],
                               cache, i, batch, base, scale, self.freq_factors)
        if q is None:
            q, k, v = self.qkv(i, x)
            q = be.rope_kv(q, k, v, cache, i, batch, base, scale, neox, self.freq_factors, self.qk_norm(i))
        q = q.reshape(x.shape[0], s.n_heads, s.head_dim)
        window = s.sliding_window if swa else 0
        return be.attention(q, cache, i, batch, window, s.attn_scale)

    def layer(self, i: int, x, batch: Batch, cache: KVCache):
        s, be, p = self.spec, self.be, f"blk.{i}."
        h = be.rmsnorm(x, self.w[p + "attn_norm.weight"], s.norm_eps)
        x = be.matmul(self.attention(i, h, batch, cache), self.w[p + "attn_output.weight"], residual=x)
        h = be.rmsnorm(x, self.w[p + "ffn_norm.weight"], s.norm_eps)
        return self.mlp(p, h, residual=x)

    def norm_after(self, i: int) -> tuple:
        """(weight, eps) of the rmsnorm that reads layer i's output: the next layer's input norm, or
        the output norm (Backend.moe's then_norm)."""
        name = f"blk.{i + 1}.attn_norm.weight" if i + 1 < self.spec.n_layers else "output_norm.weight"
        return self.w[name], self.spec.norm_eps

    def mlp(self, p: str, h, residual):
        """The feed-forward half of layer `p`, its output added to the residual."""
        be = self.be
        g, u = be.matmuls(h, [self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"]])
        return be.matmul(be.swiglu(g, u), self.w[p + "ffn_down.weight"], residual=residual)
