"""What the planner needs to know about a device kind, importable without CuPy or a GPU: the
matmul paths, which tensor types each path covers, KV element size, and scratch per batch.
(`minferd plan --device cuda --budget 80GiB` runs on a laptop.)"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from minferd.kernels.quant import CUDA_TYPES, TYPES

# The tensor types each device kind's backend decodes: the CPU's NumPy dequantizers cover the
# whole table, the CUDA kernels their own list. A load is refused up front where a tensor's type
# is not its kind's (model/loader.py check_tensor_types).
TENSOR_TYPES = {"cpu": frozenset(TYPES), "cuda": frozenset(CUDA_TYPES)}
ALL_TYPES = TENSOR_TYPES["cpu"]
QUANT_TYPES = ALL_TYPES - {"F32", "F16", "BF16"}


class MatmulPath(str, enum.Enum):
    """How a model's prefill matmuls read quantized weights (DESIGN.md, "The problem it solves")."""

    W16 = "w16"  # resident f16 copy, dense GEMM
    MMQ = "mmq"  # int8-quantized activations x quantized weights
    FUSED_B = "fused_b"  # dequantize weight tiles inside the GEMM


CUDA_MAX_BATCH = 2048
# A step of at most this many tokens (any mix of prefill and decode) replays a decode graph, each
# token a row (bench/results/s11-latency: a 128-token prompt's TTFT on the 7B 42.1 ms eager, 9.0 so).
CUDA_GRAPH_ROWS = 256
# A one-sequence prompt of 2 .. this many tokens replays a graph of its rows of its own, with the
# last row's logits alone (cuda_graph.DecodeGraph's one_row): buckets 2 .. 32, 62 rows in all.
PROMPT_GRAPH_ROWS = 32
PREFILL_GRAPH_TOKENS = 1024  # one sequence's prefill of up to this many tokens replays a prefill graph
GRAPH_UNPACK_BYTES = 16 << 20  # MMQ's unpacked-weight slice (or a dequantized tile) inside a captured graph, which keeps it
DECODE_PARTIAL_ROWS = 4096  # split-K partials of decode attention: splits x sequences at most (kernels/attn_decode.py)
CUBLAS_WORKSPACE_BYTES = 32 << 20  # cuBLAS's own workspace per model, set so its calls can be captured (Hopper's size)
LOGITS_ROWS = 64  # a pass that wants every position's logits makes them this many rows at a time
DEQUANT_ROWS = 4096  # rows per temporary f16 tile when a model without W16 prefills through cuBLAS


@dataclass(frozen=True, slots=True)
class DeviceTraits:
    kind: str  # "cpu" | "cuda"
    kv_elem_bytes: int
    path_types: dict  # MatmulPath -> frozenset of type names the path's kernels cover
    scratch_fixed: int = 0  # bytes of scratch whatever the model (the CPU's dequant buffers)
    default_headroom: int = 0
    max_batch: int = 512  # tokens per forward pass: sizes sliding-window rings and scratch

    def scratch_bytes(self, spec, ctx: int, max_batch: int | None = None) -> int:
        if self.kind == "cpu":
            return self.scratch_fixed
        return cuda_scratch_bytes(spec, ctx, max_batch or self.max_batch)


def device_moe() -> bool:
    """MoE routing and grouped prefill on the device (backend/cuda_moe.py; MINFERD_DEVICE_MOE=0 turns
    it off, back to backend/moe.py's expert-by-expert path), read where a backend is made and where its
    scratch is estimated, so both agree."""
    from minferd.config import valve
    return valve("MINFERD_DEVICE_MOE") != "0"


def moe_grouped_bytes(spec, n: int) -> int:
    """A mixture's prefill of n tokens as grouped GEMMs (backend/cuda_moe.prefill): its n * k picks
    laid out by expert in whole tiles (at most BM - 1 padding rows an expert), the gathered f16
    input, gate, up, the activation (f32 and f16), down, and the picks' outputs taken back; the
    routing's ids, weights and layout."""
    if not spec.n_expert:
        return 0
    from minferd.kernels.gemm_f16 import CONFIGS, GROUPED_CONFIG  # NumPy only
    from minferd.kernels.moe import layout_rows  # NumPy only
    picks = n * spec.n_expert_used
    rows = layout_rows(picks, spec.n_expert, CONFIGS[GROUPED_CONFIG][0])
    routing = picks * 4 * 3 + rows * 4 * 2  # ids, weights, pick rows; token rows, row experts
    return routing + rows * (spec.hidden * 2 + spec.expert_ffn * (3 * 4 + 2) + spec.hidden * 4) + picks * spec.hidden * 4


def cuda_scratch_bytes(spec, ctx: int, max_batch: int) -> int:
    """An upper bound of what one forward pass of max_batch tokens holds at once on the CUDA
    backend (its arena): activations in f32 and f16, the attention's buffers, a dequantized
    weight tile, a chunk of logits; then a quarter more for the pool's rounding, and an eighth
    more for the MMQ kernel's slice of unpacked weights (CudaBackend gives it an eighth). The flash
    prefill kernel keeps scores in registers; only head dims it lacks pay for f32 scores over
    the whole context (at 32k tokens of context that term alone was 7.5 GB for a 7B model)."""
    from minferd.kernels import mmq_small, tcgemv  # NumPy only
    from minferd.kernels.attn_prefill import HEAD_DIMS  # NumPy only
    n, f32, f16 = max_batch, 4, 2
    widest = max(spec.hidden, spec.ffn, spec.q_dim)
    act = n * (6 * spec.hidden * f32 + 4 * spec.q_dim * f32 + 4 * spec.kv_dim * f32
               + spec.ffn * (3 * f32 + 2 * f16))
    if spec.head_dim in HEAD_DIMS:
        attn = n * spec.q_dim * 4 * f32
    else:
        attn = spec.n_heads * n * ctx * f32 + 2 * ctx * spec.kv_dim * (f16 + f32) + n * spec.q_dim * 4 * f32
    tile = DEQUANT_ROWS * widest * f16 + n * DEQUANT_ROWS * (f16 + f32)
    attn += 2 * ctx * spec.kv_dim * f16  # a prefill sequence's keys and values, gathered from their blocks
    logits = LOGITS_ROWS * spec.n_vocab * (f16 + 2 * f32)
    # Decode graphs, one per batch bucket (1 .. 256 sequences, 511 rows in all), each keeping its
    # activations, logits and attention partials for good.
    row = 6 * spec.hidden * f32 + 4 * spec.q_dim * f32 + 4 * spec.kv_dim * f32 + spec.ffn * (3 * f32 + 2 * f16)
    partials = DECODE_PARTIAL_ROWS * spec.q_dim * f32 + (2 << 20)
    decode = 511 * (row + spec.n_vocab * f32 + 2 * spec.hidden) + 9 * partials
    # The prompts' one-row-logits graphs (PROMPT_GRAPH_ROWS): their rows, a logits row each
    prompt_rows = 2 * PROMPT_GRAPH_ROWS - 2
    decode += prompt_rows * (row + 2 * spec.hidden) + 5 * (spec.n_vocab * f32 + partials)
    # mmq_small's (or tcgemv's) x and split partials: the eager pool's, the 4- to 64-row graphs'
    # own (tcgemv from 3 rows: cuda_matmul.MATVEC_ROWS) and the 4- to 32-row prompt graphs'
    decode += 10 * max(mmq_small.scratch_bound(widest), tcgemv.scratch_bound(widest))
    # The prefill graphs' one pool (backend/cuda_graph.PrefillGraph): a pass of the largest bucket
    # (its dequantized tile counted below; one logits row). Graphs of more than 64 rows may run MMQ,
    # whose unpacked slice each keeps: the 128- and 256-row decode graphs' and the prefill pool's.
    decode += PREFILL_GRAPH_TOKENS * (row + 2 * widest * f16) + spec.n_vocab * f32
    decode += 3 * GRAPH_UNPACK_BYTES
    # Dequantized tiles inside graphs (cuda_matmul._tile_rows): at most GRAPH_UNPACK_BYTES or the
    # largest matrix in f16, kept by each graph of more than 8 rows (the 16- to 256-row decode
    # graphs, the 16- and 32-row prompt graphs) and the prefill graphs' pool.
    decode += 8 * min(GRAPH_UNPACK_BYTES, f16 * widest * max(spec.n_vocab, widest))
    if device_moe():  # the prefill graphs' MoE layers (CudaBackend.graph_safe)
        decode += moe_grouped_bytes(spec, PREFILL_GRAPH_TOKENS)
    total = int(1.25 * (act + attn + tile + logits + decode + (moe_grouped_bytes(spec, n) if device_moe() else 0))) + (16 << 20) \
        + CUBLAS_WORKSPACE_BYTES
    return total + total // 7  # the arena is total * 8/7: an eighth of it is total / 7


def cpu_traits(threads: int) -> DeviceTraits:
    from minferd.backend.cpu import scratch_bytes  # NumPy only
    every = {p: ALL_TYPES for p in MatmulPath}
    return DeviceTraits("cpu", 4, every, scratch_fixed=scratch_bytes(threads))


def cuda_traits() -> DeviceTraits:
    # What each path covers is what its kernels say (NumPy-only imports: no CuPy needed to plan).
    # A model with no type in MMQ's set goes FUSED_B (planner.quantized_path).
    from minferd.kernels import gemm_f16, mmq
    paths = {MatmulPath.W16: TENSOR_TYPES["cuda"], MatmulPath.MMQ: frozenset(mmq.SUPPORTED),
             MatmulPath.FUSED_B: frozenset(gemm_f16.SUPPORTED)}
    # Big prefill batches: each pass costs Python a few hundred launches, so fewer, larger passes.
    return DeviceTraits("cuda", 2, paths, default_headroom=1 << 30, max_batch=CUDA_MAX_BATCH)
