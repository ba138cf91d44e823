"""The op set every backend implements, and the objects it hands to models.

A model holds only `Weight`s and `KVCache`s from its backend and calls the ops below; it never
sees NumPy or CuPy directly except through plain arithmetic on the arrays the ops return.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minferd.kernels.quant import QuantType


class Untracked:
    """Memory outside any pool (the `run` command, unit tests): allocates straight from the device."""

    def __init__(self, device):
        self.device = device

    def empty(self, kind: str, shape, dtype):
        return self.device.empty(shape, dtype)

    def release(self, array) -> None:
        pass


@dataclass(slots=True, eq=False)
class Weight:
    """One tensor on a backend: its quantized bytes, and for W16 models an f16 copy."""

    name: str
    qtype: QuantType
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length (K for a matmul)
    data: object  # backend array of the raw bytes, (rows, row_bytes) uint8; or f32 for vectors
    mem: object  # the ModelMemory it was allocated from (and is released to)
    w16: object = None  # backend f16 array (rows, K), present only under the W16 plan

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1

    @property
    def row_elems(self) -> int:
        return self.shape[0]


@dataclass(slots=True, eq=False)
class KVCache:
    """Per-layer K and V arrays, each (n_blocks * block_size, n_kv_heads, head_dim): a pool of
    fixed-size blocks that sequences address through block tables (backend/batch.py). A cache
    used by one sequence alone (`forward(ids, cache)`) keeps position p at slot p."""

    k: list
    v: list
    block_size: int
    n_blocks: int
    mem: object
    n_tokens: int = 0  # one-sequence use: positions [0, n_tokens) have been written

    @property
    def ctx(self) -> int:
        return self.n_blocks * self.block_size


def allocate_all(mem, kind: str, shapes, dtype) -> list:
    """One buffer per shape from `mem`, or none at all: a failure part-way releases the others."""
    made = []
    try:
        for shape in shapes:
            made.append(mem.empty(kind, shape, dtype))
    except BaseException:
        for a in made:
            mem.release(a)
        raise
    return made


@dataclass(frozen=True, slots=True)
class Sampled:
    """A step's sampled token ids: `ids` where the next step may read them (the device), and
    tokens() on the host once they are there (it waits for them)."""
    ids: object
    tokens: Callable[[], list[int]]


def reads_history(seq) -> bool:
    """Whether its sampler reads the tokens so far (a repeat penalty), which a step run ahead lacks."""
    return seq.params.repeat_penalty != 1.0 and seq.params.repeat_last_n != 0


class Backend(ABC):
    name: str
    memory: object  # the device's raw memory: empty(shape, dtype), used_bytes()
    kv_dtype: str  # "f32" | "f16"
    matmul_path: str = "mmq"  # the plan's prefill path, "w16" | "mmq" | "fused_b", fixed when it is made
    max_batch: int = 512  # tokens per forward pass (the device traits' max_batch)

    def untracked(self) -> Untracked:
        return Untracked(self.memory)

    def scope(self):
        """Where a forward pass runs (the CUDA backend: its stream and scratch arena)."""
        return contextlib.nullcontext()

    def prepare(self, batch) -> None:
        """Put what the ops read of a Batch where they read it (the CUDA backend: device arrays)."""

    def run(self, model, batch, cache: KVCache):
        """Logits (B, vocab) of each sequence's last token of a step (the engine's forward)."""
        return self.decode(model, batch, cache) if batch.is_decode else model.forward_batch(batch, cache)

    def decode(self, model, batch, cache: KVCache):
        """Logits (B, vocab) of a decode batch, one new token per sequence (the CUDA backend
        replays a graph captured for the batch's size bucket)."""
        if batch.ids_from is not None:  # a step run ahead, here where it gains nothing (the tests')
            batch.ids = np.asarray(self.to_host(batch.ids_from), np.int32)
        return model.forward_batch(batch, cache)

    # Whether a pass's arithmetic runs on the engine's thread (and its helpers): then that thread
    # runs at a lower priority, so that status answers first on a machine the model keeps busy. A
    # device backend's engine thread only launches and waits: niced, any host load (a build, a test
    # suite's workers) keeps it off the cores while the GPU idles (s29 on an H100, llama.cpp
    # compiling on the host: first tokens of 57-116 ms against 1.8-2.5 from a thread not niced).
    computes_on_host = True

    # Whether a step may ever run on a request's own thread (engine.py's turn; runs_anywhere says
    # which). Not the CPU backend's: its passes compute on the calling thread, which is the
    # engine's, at a lower priority, so that status answers first.
    caller_steps = False

    def runs_anywhere(self, model, batch, cache: KVCache) -> bool:
        """Whether `run` and `sample` of this step may run on a thread other than the engine's (a
        request's own): where nothing they do belongs to the thread that does it."""
        return False

    def sample(self, logits, seqs) -> list[int]:
        """The next token of each sequence from its row of logits: its own Sampler on the host
        (the CUDA backend samples on the device and brings back only the ids)."""
        rows = self.to_host(logits)
        return [s.sampler.sample(rows[i], s.tokens) for i, s in enumerate(seqs)]

    # Whether the engine runs decode steps ahead by default: the next step launched with its token
    # ids read on the device from this one's sampler, before this one's tokens reach the host
    # (engine.py). Where launches return at once (CUDA) the GPU then never waits on the host
    # between tokens; here a step computes as it is called, so it gains nothing (the tests turn
    # it on with MINFERD_RUN_AHEAD=1 to check the engine's side).
    runs_ahead = False

    def sample_async(self, logits, seqs) -> Sampled | None:
        """The tokens as sample() gives them, where the next step can read them before the host
        does; None where it cannot (a sampler that reads the tokens so far)."""
        if any(reads_history(s) for s in seqs):
            return None
        tokens = self.sample(logits, seqs)
        return Sampled(np.asarray(tokens, np.int32), lambda: tokens)

    # ---- memory --------------------------------------------------------------------------
    @abstractmethod
    def upload(self, mem, name: str, qtype: QuantType, shape: tuple[int, ...], raw: np.ndarray) -> Weight:
        """Copy a tensor's raw bytes (rows, row_bytes) into memory from `mem`. Vectors become f32."""

    @abstractmethod
    def make_w16(self, w: Weight) -> int:
        """Build the resident f16 copy of a matmul weight (from w.mem); returns its bytes."""

    def drop_w16(self, w: Weight) -> int:
        """Free the f16 copy; returns the bytes freed."""
        if w.w16 is None:
            return 0
        n = w.w16.nbytes
        w.mem.release(w.w16)
        w.w16 = None
        return n

    def weights_changed(self) -> None:
        """Weights' f16 copies were dropped or built: what was captured over them goes (CUDA
        graphs). Called with no pass running."""

    def alloc_kv(self, mem, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int) -> KVCache:
        dtype = np.float32 if self.kv_dtype == "f32" else np.float16
        shape = (n_blocks * block_size, n_kv_heads, head_dim)
        made = allocate_all(mem, "kv", [shape] * (2 * n_layers), dtype)
        return KVCache(made[:n_layers], made[n_layers:], block_size, n_blocks, mem)

    @abstractmethod
    def alloc_scratch(self, mem, nbytes: int) -> None:
        """The model's scratch (what its forward passes work in), from `mem`."""

    @abstractmethod
    def free_scratch(self, mem) -> None: ...

    def bind_thread(self) -> None:
        """Make this backend's device the calling thread's (its engine thread calls it first)."""

    def close(self) -> None:
        """Let go of what the backend holds beside device memory (the CPU backend's threads)."""

    def free(self, *objs) -> None:
        """Release Weights and KVCaches to the memory they came from, now."""
        for o in objs:
            if isinstance(o, Weight):
                self.drop_w16(o)
                if o.data is not None:
                    o.mem.release(o.data)
                o.data = None
            elif isinstance(o, KVCache):
                for a in o.k + o.v:
                    o.mem.release(a)
                o.k.clear()
                o.v.clear()

    @abstractmethod
    def to_device(self, a: np.ndarray): ...

    @abstractmethod
    def to_host(self, a) -> np.ndarray: ...

    # ---- ops -----------------------------------------------------------------------------
    @abstractmethod
    def matmul(self, x, w: Weight, bias: Weight | None = None, residual=None):
        """x (n, K) f32 times w's rows, plus the bias vector and the residual (n, rows) where
        given: (n, rows) f32. (A backend may fold the adds into the product's kernel.)"""

    @abstractmethod
    def embed(self, ids: np.ndarray, w: Weight):
        """Rows `ids` of an embedding table, dequantized: (n, K) f32."""

    @abstractmethod
    def rmsnorm(self, x, weight: Weight, eps: float):
        """RMS-normalise over the last axis, times weight (broadcast over leading axes)."""

    def precompile(self, type_ids, head_dims) -> None:
        """Get ready the kernels a model of these tensor types (ggml ids) and head dims runs, before
        its first pass needs them (the CUDA backend compiles them side by side)."""

    def rmsnorm_pair(self, a, wa: Weight, b, wb: Weight, eps: float):
        """rmsnorm of a and of b (q's and k's heads); the CUDA backend runs both in one launch."""
        return self.rmsnorm(a, wa, eps), self.rmsnorm(b, wb, eps)

    @abstractmethod
    def rope(self, x, positions: np.ndarray, base: float, scale: float, neox: bool, freq_factors=None):
        """Rotate x (n, heads, head_dim) in place or not; returns the rotated array: pair i of a
        head at position p by p * scale * base^(-2i/d) / freq_factors[i] (YaRN is such factors:
        model/spec.py's Yarn)."""

    @abstractmethod
    def kv_write(self, cache: KVCache, layer: int, batch, k, v) -> None:
        """k and v (n, kv_heads, head_dim) of the batch's tokens into their slots."""

    def matmuls(self, x, ws: list[Weight], biases: list | None = None) -> list:
        """x times each of several weights (q/k/v, gate/up: one input, several products); the
        CUDA backend runs a decode step's group as one launch."""
        return [self.matmul(x, w, b) for w, b in zip(ws, biases or [None] * len(ws))]

    def rope_kv(self, q, k, v, cache: KVCache, layer: int, batch, base: float, scale: float, neox: bool,
                freq_factors=None, qk_norm: tuple | None = None):
        """Rope q and k, write k and v to the batch's slots; returns the rotated q. qk_norm (wq, wk,
        eps): q's and k's heads rms-normed first (qwen3). (The CUDA backend does it in one kernel,
        the norms inside it for prefills.)"""
        if qk_norm is not None:
            q, k = self.rmsnorm_pair(q, qk_norm[0], k, qk_norm[1], qk_norm[2])
        q = self.rope(q, batch.positions, base, scale, neox, freq_factors)
        k = self.rope(k, batch.positions, base, scale, neox, freq_factors)
        self.kv_write(cache, layer, batch, k, v)
        return q

    def qkv_rope_kv(self, x, ws: list[Weight], biases: list, cache: KVCache, layer: int, batch, base: float,
                    scale: float, freq_factors=None):
        """q / k / v's products with rope_kv's work done inside them (the CUDA backend's decode
        mat-vec epilogue: kernels/mmvq_rope_kv.py): the rotated q (n, Hq * D), K and V written; or
        None where this step cannot, and the caller runs matmuls then rope_kv."""
        return None

    # Whether a model's q and k rows are stored reordered for adjacent rope pairs (model/rope_rows.py:
    # what qkv_rope_kv needs of a neox model); the model then runs normal rope.
    def pairs_rope_rows(self, spec) -> bool:
        return False

    @abstractmethod
    def attention(self, q, cache: KVCache, layer: int, batch, window: int, scale: float, sinks: Weight | None = None):
        """Causal GQA attention of q (n, Hq, D), each sequence of the batch over its own keys in
        this layer's cache, keys `window` or more positions back masked (0 = no window);
        returns (n, Hq * D). sinks (Hq,): a logit per head that joins each softmax's denominator
        and adds no value (gpt-oss; only the CPU backend has it so far)."""

    @abstractmethod
    def swiglu(self, gate, up): ...

    @abstractmethod
    def gelu_gate(self, gate, up):
        """gelu_tanh(gate) * up (Gemma's GeGLU)."""

    def moe(self, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
            residual=None, router_bias: Weight | None = None, exps_bias: tuple | None = None,
            oai_glu: tuple[float, float] | None = None, norm_topk: bool = True, then_norm: tuple | None = None):
        """A mixture-of-experts SwiGLU MLP on x (n, hidden), plus the residual: each token's top-k
        experts by softmax(x @ router + router_bias), their weights renormalized to sum 1 (the
        softmax of the k logits alone), and the sum of those experts' down(silu(gate x) * up x),
        weighted. The *_exps weights stack the experts on their third axis. gpt-oss adds
        exps_bias, (gate, up, down) biases of shape (rows, n_expert), and in place of SwiGLU
        swiglu_oai with oai_glu = (alpha, limit). norm_topk False (qwen2moe): the top k keep
        their softmax-over-all weights. then_norm (weight, eps): the rmsnorm that reads the output
        next (the next layer's input norm); a backend may make it in the same launch and hand it to
        that rmsnorm call (CUDA, decode), or ignore it. Here expert by expert through this backend's own ops
        (backend/moe.py); the CPU backend has its own."""
        from minferd.backend.moe import by_expert
        return by_expert(self, x, router, gate_exps, up_exps, down_exps, k, residual, router_bias, exps_bias, oai_glu,
                         norm_topk)

    def sigmoid_dot(self, x, v: Weight):
        """sigmoid(x . v) (n, 1) f32 for x (n, K) and a vector v (K,): qwen2moe's shared-expert gate."""
        raise NotImplementedError(f"the {self.name} backend has no sigmoid_dot")

    # ---- what backend/moe.py's expert-by-expert MLP needs besides the ops above -----------------
    def take_rows(self, x, rows: np.ndarray):
        """x[rows] (rows: an int array, on the host or this backend's device) as a new C-contiguous f32 array."""
        raise NotImplementedError(f"the {self.name} backend has no row gather")

    def add_rows(self, out, rows: np.ndarray, y, weights: np.ndarray) -> None:
        """out[rows] += weights[:, None] * y in place, rows distinct (arrays as take_rows's)."""
        raise NotImplementedError(f"the {self.name} backend has no row scatter")

    def bias_row(self, w: Weight, r: int):
        """Row r of a 2-D tensor as (1, row_elems) f32 (an expert's bias)."""
        raise NotImplementedError(f"the {self.name} backend has no row dequantizer")

    def residual_out(self, residual, shape):
        """A fresh f32 array of `shape`: the residual's copy, or zeros."""
        raise NotImplementedError(f"the {self.name} backend has no residual copy")

    def swiglu_oai(self, gate, up, alpha: float, limit: float):
        """gpt-oss's clamped SwiGLU (ggml_swiglu_oai): g = min(gate, limit), u = clamp(up, ±limit),
        g * sigmoid(alpha g) * (u + 1)."""
        raise NotImplementedError(f"the {self.name} backend has no swiglu_oai op")
