"""Every part of every kernel module (kernels/__init__.py), compiled at once into CuPy's disk cache:
what `minferd warmup` and `serve --warmup` do before any model runs; and a model's own parts (its
tensor types', its head dim's), which a CUDA load compiles the same way before its first pass.

NVRTC compiles without the GIL (CuPy's nvrtc.compileProgram runs `with nogil`), so parts compile
side by side in threads: the warmup then waits for its largest part, not for the sum of them
(bench/nvrtc_check.py --parts times them). The modules are not kept: a model's own parts are
loaded from the cache when it first runs them, so a daemon holds only the code its models use.
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from minferd.kernels import DIR, module, part_key, parts

MAX_THREADS = 8  # a part of the largest module (tcgemv) peaks at ~190 MB of host memory in NVRTC
HEAD_DIM_MODULES = ("attn_decode", "attn_prefill")  # their parts are keyed by head dim
# Every part of these: sample's are keyed by neither, mmq's GEMMs by their scale count (the
# parts that share a type's key do not hold all a type needs there).
ALWAYS = ("sample", "mmq")
W16_KEY = "-1"  # gemm_f16's f16-weight instances (gemm_f16.py's W16)
_done: set = set()  # (device, module, name expressions) compiled or found in the cache by this process
_done_lock = threading.Lock()


def module_names() -> list[str]:
    return sorted(p.stem for p in DIR.glob("*.cu"))


def name_expressions(stem: str) -> tuple[str, ...]:
    """Every template instance kernels/<stem>.py may ask of its module (none without a launcher
    or a names())."""
    try:
        mod = importlib.import_module(f"minferd.kernels.{stem}")
    except ModuleNotFoundError:
        return ()
    return tuple(mod.names()) if hasattr(mod, "names") else ()


def every_part() -> list[tuple[str, tuple[str, ...]]]:
    """(module, name expressions) for each part, largest modules first (they set the wall time)."""
    got = [(stem, p) for stem in module_names() for p in parts(name_expressions(stem))]
    return sorted(got, key=lambda sp: -len(sp[1]))


def parts_for(type_ids, head_dims) -> list[tuple[str, tuple[str, ...]]]:
    """The parts a model of these tensor types (ggml ids) and head dims can run: its types' in the
    typed modules, its head dims' in attention, every extern "C" part, and ALWAYS's."""
    types = {str(t) for t in type_ids} | {W16_KEY}
    dims = {str(d) for d in head_dims}
    return [(stem, exprs) for stem, exprs in every_part()
            if not exprs or stem in ALWAYS or part_key(exprs[0]) in (dims if stem in HEAD_DIM_MODULES else types)]


def compile_every_part(device_id: int = 0, threads: int | None = None, say=print) -> float:
    """Compile every part for device `device_id`'s architecture; returns the seconds it took.
    A part that fails to compile raises (CuPy's CompileException names the module and the log)."""
    todo, threads = every_part(), threads or min(MAX_THREADS, os.cpu_count() or 1)
    took = compile_parts(todo, device_id, threads)
    say(f"warmup: {len(todo)} kernel parts compiled in {took:.1f} s ({threads} at once)")
    return took


def compile_parts(todo, device_id: int = 0, threads: int | None = None) -> float:
    """Compile (or find in the disk cache) each (module, name expressions) part of `todo` for
    device `device_id`, side by side; returns the seconds it took."""
    import cupy
    threads = threads or min(MAX_THREADS, os.cpu_count() or 1)
    with _done_lock:
        todo = [(stem, exprs) for stem, exprs in todo if (device_id, stem, exprs) not in _done]
    t0 = time.perf_counter()

    def one(item):
        stem, exprs = item
        with cupy.cuda.Device(device_id):
            module.__wrapped__(stem, exprs).compile()  # not module()'s cache: nothing stays loaded
        with _done_lock:
            _done.add((device_id, stem, exprs))

    with ThreadPoolExecutor(threads, thread_name_prefix="nvrtc") as pool:
        for _ in pool.map(one, todo):
            pass
    return time.perf_counter() - t0
