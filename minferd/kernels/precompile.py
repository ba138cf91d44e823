"""Every part of every kernel module (kernels/__init__.py), compiled at once into CuPy's disk cache:
what `minferd warmup` and `serve --warmup` do before any model runs.

NVRTC compiles without the GIL (CuPy's nvrtc.compileProgram runs `with nogil`), so parts compile
side by side in threads: the warmup then waits for its largest part, not for the sum of them
(bench/nvrtc_check.py --parts times them). The modules are not kept: a model's own parts are
loaded from the cache when it first runs them, so a daemon holds only the code its models use.
"""
from __future__ import annotations

import importlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

from minferd.kernels import DIR, module, parts

MAX_THREADS = 8  # a part of the largest module (tcgemv) peaks at ~190 MB of host memory in NVRTC


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


def compile_every_part(device_id: int = 0, threads: int | None = None, say=print) -> float:
    """Compile every part for device `device_id`'s architecture; returns the seconds it took.
    A part that fails to compile raises (CuPy's CompileException names the module and the log)."""
    import cupy
    todo = every_part()
    threads = threads or min(MAX_THREADS, os.cpu_count() or 1)
    t0 = time.perf_counter()

    def one(item):
        stem, exprs = item
        with cupy.cuda.Device(device_id):
            module.__wrapped__(stem, exprs).compile()  # not module()'s cache: nothing stays loaded

    with ThreadPoolExecutor(threads, thread_name_prefix="nvrtc") as pool:
        for _ in pool.map(one, todo):
            pass
    took = time.perf_counter() - t0
    say(f"warmup: {len(todo)} kernel parts compiled in {took:.1f} s ({threads} at once)")
    return took
