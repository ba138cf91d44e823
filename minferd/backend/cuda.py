"""The CUDA backend: the op set with CuPy, the project's kernels and cuBLAS.

Memory: every long-lived buffer comes from the pool's allocator (weights, w16, kv, and one
scratch arena per model); a forward pass's temporaries come from a per-model CuPy MemoryPool
whose only source is that arena, so a pass can never take more than its model reserved.
Decode of one token runs as a CUDA graph per (model, cache), captured on first use: the project's
own kernels only (CuPy refuses cuBLAS inside capture), positions read from a device buffer.
"""
from __future__ import annotations

import contextlib
import logging

import cupy as cp
import numpy as np

from minferd.backend import cuda_attention, cuda_sample, gates, pending
from minferd.config import valve
from minferd.backend.base import Backend, KVCache, Sampled, Weight, reads_history
from minferd.backend.cuda_graph import BUCKETS, PREFILL_BUCKETS, DecodeGraph, PrefillGraph, decode_bucket, prefill_bucket
from minferd.backend.cuda_memory import Arena, DeviceMemory  # noqa: F401 - DeviceMemory: the backend's memory
from minferd.backend.cuda_matmul import MMVQ_MAX_BATCH, CudaMatmuls
from minferd.backend.cuda_moe import CudaMoe
from minferd.backend.cuda_ops import CudaOps
from minferd.kernels import mmvq_rope_kv, tcgemv
from minferd.kernels.dequant import dequant_f16, dequant_rows
from minferd.kernels.launch import programmatic, rows_limit
from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quant import QuantType, by_id, row_bytes

from minferd.devices import CUDA_GRAPH_ROWS, CUDA_MAX_BATCH, PROMPT_GRAPH_ROWS, device_moe

log = logging.getLogger("minferd")


def device_name(device_id: int | None = None) -> str:
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id if device_id is None else device_id)["name"].decode()


class CudaBackend(CudaOps, CudaMatmuls, CudaMoe, Backend):
    name = "cuda"
    kv_dtype = "f16"
    max_batch = CUDA_MAX_BATCH
    launches_async = True  # a pass returns once it is queued on the stream
    computes_on_host = False  # the engine's thread keeps the daemon's priority (base.Backend)

    def __init__(self, memory: DeviceMemory, w16_min_tokens: int = MMVQ_MAX_BATCH + 1, matmul_path: str = "mmq"):
        self.memory, self.w16_min_tokens = memory, w16_min_tokens
        self.bind_thread()  # the load's thread: the stream and the uploads belong to this device
        self.matmul_path = str(getattr(matmul_path, "value", matmul_path))
        # One kernel for every matmul past 8 rows it can run (bench and tests; else the gate table's).
        self.prefill_kernel = valve("MINFERD_PREFILL_KERNEL")
        self.small_batch = valve("MINFERD_SMALL_BATCH") != "off"
        self.tc_config = valve("MINFERD_TCGEMV_CONFIG") or tcgemv.CONFIG
        if self.tc_config not in tcgemv.CONFIGS:
            raise ValueError(f"MINFERD_TCGEMV_CONFIG={self.tc_config!r}: not one of {', '.join(tcgemv.CONFIGS)}")
        rows = valve("MINFERD_GRAPH_ROWS") or str(CUDA_GRAPH_ROWS)
        if not (rows.isdigit() and 1 <= int(rows) <= BUCKETS[-1]):
            raise ValueError(f"MINFERD_GRAPH_ROWS={rows[:40]!r}: not a whole number in 1..{BUCKETS[-1]}")
        self.graph_rows = int(rows)
        self.pdl_rows = rows_limit()  # graphs of up to this many rows launch programmatically
        self.moe_on_device = device_moe()  # cuda_moe's paths (off: expert by expert)
        self.in_graph = False  # a decode graph is being captured (see capturing)
        self.gate_table = gates.table_path()
        gates.check_device(device_name(memory.device_id), self.gate_table)
        self.arena: Arena | None = None
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graphs: dict = {}
        self._prefill_pool = None  # what every prefill graph of this backend allocates from
        # The converted form of the latest matmul input, (key, array, converted): q/k/v and
        # gate/up read one input back to back, which is quantized (or cast to f16) once. One
        # slot: a pass's scratch must not grow with its layers. The slot holds the array, so
        # its memory cannot be reused while it is there; nothing writes such an input in place.
        self._xq: tuple | None = None
        self._x16: tuple | None = None
        self._xm: tuple | None = None  # the same for mmq_small's format
        # (sum, weight, eps, normed, its _xq slot): an MoE's output normalised in its combine's
        # launch, for the rmsnorm call that asks for it next (cuda_ops.combine_norm).
        self._normed_ahead: tuple | None = None
        self._cublas_ws = None

    # ---- memory --------------------------------------------------------------------------
    def upload(self, mem, name, qtype: QuantType, shape, raw) -> Weight:
        w = Weight(name, qtype, tuple(shape), None, mem)
        if len(shape) == 1 or w.n_rows == 1:
            host = dequantize(qtype, np.asarray(raw), 1, w.row_elems * w.n_rows)[0]
            w.data = mem.empty("weights", host.shape, np.float32)
        else:
            host = np.ascontiguousarray(raw).reshape(w.n_rows, row_bytes(qtype, w.row_elems))
            w.data = mem.empty("weights", host.shape, np.uint8)
        # On the model's stream, as the f16 copy below: the passes run there, and a non-blocking
        # stream does not wait for the null stream's copies and kernels.
        with self.stream:
            w.data.set(host)
        return w

    def make_w16(self, w: Weight) -> int:
        if w.w16 is None:
            w16 = w.mem.empty("w16", (w.n_rows, w.row_elems), np.float16)
            with self.stream:
                dequant_f16(w.qtype, w.data, w16)
            w.w16 = w16
        return w.w16.nbytes

    def alloc_scratch(self, mem, nbytes: int) -> None:
        self._arena_buf = mem.empty("scratch", (nbytes,), np.uint8)
        self.arena = Arena(self._arena_buf)

    def weights_changed(self) -> None:
        """A captured graph reads the weights it was captured with (a cuBLAS product the f16
        copy): after the copy is dropped or built, every graph goes, and their memory with them
        (a new arena over the same buffer: the old one's chunks are never given back one by one).
        Called with no pass running (the host holds the model's workers)."""
        self._forget_graphs()
        self._xq = self._x16 = self._xm = self._normed_ahead = None
        if self.arena is not None:
            self.arena.close()  # its chunks back at once; the new arena carves the same buffer afresh
            self.arena = Arena(self._arena_buf)

    def _forget_graphs(self) -> None:
        self.graphs.clear()
        self._prefill_pool = None
        self._cublas_ws = None

    def free(self, *objs) -> None:
        """Backend.free; a KV cache's graphs go with it (they write its blocks, and a cache made
        later may get its id: bench.py makes one a repetition)."""
        gone = {id(o) for o in objs if isinstance(o, KVCache)}
        for key in [k for k in self.graphs if k[0] in gone]:
            del self.graphs[key]
        super().free(*objs)

    def free_scratch(self, mem) -> None:
        self._forget_graphs()
        if self.arena is not None:
            self.arena.close()
            mem.release(self._arena_buf)
            self.arena = self._arena_buf = None

    @contextlib.contextmanager
    def scope(self):
        """Temporaries of one pass come from the model's arena, work runs on the model's stream."""
        with self.stream:
            try:
                if self.arena is None:
                    yield
                else:
                    with cp.cuda.using_allocator(self.arena.malloc):
                        yield
            finally:
                self._xq = self._x16 = self._xm = self._normed_ahead = None

    @contextlib.contextmanager
    def capturing(self, rows: int):
        """While a graph of `rows` rows is captured: its buffers live as long as the graph
        (cuda_graph), and the project's kernels may launch as programmatic dependents of the node
        before (kernels/launch.py)."""
        self.in_graph = True
        try:
            with programmatic(rows <= self.pdl_rows):
                yield
        finally:
            self.in_graph = False

    def to_device(self, a):
        return cp.asarray(a)

    def to_host(self, a):
        return cp.asnumpy(a, stream=self.stream) if isinstance(a, cp.ndarray) else np.asarray(a)

    def prepare(self, batch) -> None:
        """The batch's index arrays on the device, in one copy (a captured graph's batch comes
        with its own buffers); a mixed step's also what its attention reads (cuda_attention)."""
        if batch.dev:
            return
        last = batch.last_rows().astype(np.int32)
        parts = (batch.ids, batch.positions, batch.slots, batch.ctx_lens, last, batch.block_tables.ravel())
        flat = cp.asarray(np.concatenate(parts).astype(np.int32, copy=False))
        names, at = ("ids", "positions", "slots", "ctx_lens", "last_rows", "block_tables"), 0
        for name, part in zip(names, parts):
            batch.dev[name] = flat[at:at + part.size]
            at += part.size
        batch.dev["block_tables"] = batch.dev["block_tables"].reshape(batch.block_tables.shape)
        if not batch.is_decode:
            cuda_attention.prepare_mixed(batch)

    def embed(self, ids, w: Weight):
        ids = cp.asarray(ids, dtype=cp.int32)
        out = cp.empty((ids.shape[0], w.row_elems), cp.float32)
        dequant_rows(w.qtype, w.data, ids, out)
        return out

    def graph_safe(self, model, rows: int) -> bool:
        """Whether a graph may hold a pass of `rows` tokens: any model's that says it never reads
        results on the host; an MoE's decode rows where they route on the device, and its prefill
        graphs' rows where the grouped GEMMs' layout stays on the device too. The MoE steps of
        9-256 rows between stay eager: each decode bucket's graph would keep grouped buffers of its
        own (~200 MB a bucket for the 30b-a3b), which devices.cuda_scratch_bytes does not hold."""
        if getattr(model, "graph_safe", True):
            return True
        return getattr(model, "device_moe", False) and (
            self.routes_on_device(rows, model.spec.n_expert_used) or (rows > self.graph_rows and self.prefill_on_device(model)))

    def precompile(self, type_ids, head_dims) -> None:
        # Side by side: a first pass compiles the parts it lacks one after another (the 7B's took
        # 21.8 s so, s14). From CuPy's disk cache where warmup put them; each once a process.
        from minferd.kernels.precompile import compile_parts, parts_for
        try:
            compile_parts(parts_for(set(type_ids) | {0, 1}, head_dims), self.memory.device_id)
            if pending.ready("qkv_rope"):  # compiled apart while pending: loaded before a capture needs them
                mmvq_rope_kv.load([by_id(t).name for t in type_ids])
        except Exception as e:  # noqa: BLE001 - the pass that needs a failed part compiles it and raises there
            log.warning("compiling the kernels ahead failed (%s: %s); they compile when first run",
                        type(e).__name__, str(e)[:200])

    def bind_thread(self) -> None:
        # CuPy launches on the thread's current device; each model's threads must name its own.
        cp.cuda.Device(self.memory.device_id).use()

    # ---- decode as a graph, sampling on the device ----------------------------------------------
    def run(self, model, batch, cache: KVCache):
        """A step of up to graph_rows tokens replays a decode graph, prefill chunks included (each
        token a row: Batch.as_rows); one sequence's prefill a prefill graph (past its largest
        bucket, in pieces). Eagerly, such a pass is ~400 launches from Python, 20-40 ms whatever its
        size (a prefix-cache hit's few tokens, a short prompt)."""
        n = len(batch.ids)
        if batch.is_decode:
            return super().run(model, batch, cache)
        if n <= self.graph_rows:
            if self._one_row(batch):
                return self.decode(model, batch.as_rows(), cache, one_row=True)
            logits = self.decode(model, batch.as_rows(), cache)
            if batch.n_seqs == 1:  # a view: no index copied in, no gather launched after the graph
                return logits[n - 1:n]
            with self.stream:
                return logits[cp.asarray(batch.last_rows().astype(np.int64))]
        if not self._prefill_graphs(model, batch):
            return super().run(model, batch, cache)
        top = PREFILL_BUCKETS[-1]
        if n > top:  # pieces of the largest bucket (0.5B, 2048 tokens: 49.9 ms eager, 2 x 12.8 so)
            for a in range(0, n, top):
                logits = self.run(model, batch.chunk(a, min(n, a + top)), cache)
            return logits
        key = self._prefill_key(batch, cache)
        bucket = key[2]
        g = self.graphs.get(key)
        if g is None:
            if self._prefill_pool is None:
                self._prefill_pool = self.arena.graph_pool()
            g = self.graphs[key] = PrefillGraph(self, model, cache, bucket, batch.block_tables.shape[1],
                                                self._prefill_pool)
        return g.run(batch)

    def decode(self, model, batch, cache: KVCache, one_row: bool = False):
        """Logits (B, vocab) of a decode batch through the graph of its size bucket (captured on
        first use per cache, bucket and block-table width); one_row: a prompt as rows, the last
        row's logits (1, vocab) alone, through graphs of their own."""
        key = self._decode_key(batch.n_seqs, batch, cache, one_row)
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = DecodeGraph(self, model, cache, key[1], batch.block_tables.shape[1], one_row)
        return g.run(batch)

    # Which graph `run` replays for a step: keys by (cache, bucket, block-table width).
    @staticmethod
    def _decode_key(rows: int, batch, cache: KVCache, one_row: bool = False) -> tuple:
        return (id(cache), decode_bucket(rows), batch.block_tables.shape[1]) + (("one_row",) if one_row else ())

    @staticmethod
    def _prefill_key(batch, cache: KVCache) -> tuple:
        return (id(cache), "prefill", prefill_bucket(len(batch.ids)), batch.block_tables.shape[1])

    @staticmethod
    def _one_row(batch) -> bool:
        return batch.n_seqs == 1 and len(batch.ids) <= PROMPT_GRAPH_ROWS

    def _prefill_graphs(self, model, batch) -> bool:
        """Whether a step past the decode graphs' rows runs prefill graphs (one sequence; the graph
        runs its bucket's rows, which is what decides an MoE's path inside it)."""
        return batch.n_seqs == 1 and self.graph_safe(model, prefill_bucket(min(len(batch.ids), PREFILL_BUCKETS[-1]))) \
            and model.spec.head_dim in cuda_attention.PREFILL_HEAD_DIMS

    # A request's own thread runs its first step where the engine is idle (engine.py's turn): under
    # a host load the engine's thread waits for a core to wake on, the request's is running already
    # (s31, H100, 16 busy loops: the 7B's 1-token TTFT 8.7-11.6 ms -> 3.5; the 0.5B's 4.8-5.0 -> 1.6;
    # at rest within the spread).
    caller_steps = True

    def runs_anywhere(self, model, batch, cache: KVCache) -> bool:
        """Only a replay of one graph captured already: a capture or an eager pass would make the
        calling thread's own cuBLAS handle (and its workspace, outside the pool) and hold
        thread-local capture state."""
        n = len(batch.ids)
        if batch.is_decode:
            key = self._decode_key(batch.n_seqs, batch, cache)
        elif n <= self.graph_rows:
            key = self._decode_key(n, batch, cache, self._one_row(batch))
        elif n <= PREFILL_BUCKETS[-1] and self._prefill_graphs(model, batch):
            key = self._prefill_key(batch, cache)
        else:
            return False
        g = self.graphs.get(key)
        return g is not None and g.graph is not None

    def sample(self, logits, seqs) -> list[int]:
        """On the device, only the ids back, where the kernel covers every row (cuda_sample.py)."""
        if all(cuda_sample.on_device(s) for s in seqs):
            with self.scope():
                return cuda_sample.sample_on_device(logits, seqs, self.stream).tokens()
        return super().sample(logits, seqs)

    # The GPU idled between tokens while the host read one and launched the next (s32, H100,
    # bench/decode_gap.py: 0.5B 0.729 ms a token back to back against 0.795 waited; the daemon's
    # tg128 0.907).
    runs_ahead = True

    def sample_async(self, logits, seqs) -> Sampled | None:
        if not all(cuda_sample.on_device(s) and not reads_history(s) for s in seqs):
            return None
        with self.scope():
            return cuda_sample.sample_on_device(logits, seqs, self.stream)
