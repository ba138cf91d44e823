"""CUDA kernels: each .cu file in this folder is one cupy.RawModule, compiled through NVRTC on
first use for the device's architecture and cached by CuPy on disk. A `#line` directive makes
compiler errors point into the .cu file. Importing this package needs no CuPy; `module()` does.
Launchers take their kernels from `kernel()`, never from a module's get_function (launch.py).

A launcher names every template instance its module may need (its names()); `kernel()` compiles
only the part of them that shares the requested kernel's first template argument, which in every
templated launcher is the quant type (or the head dim): a model compiles its own types' kernels,
not all thirteen types' (the mat-vec module alone is 223 instances). extern "C" kernels are in
every part; they are taken from the part of no instances. CuPy caches each part on disk by its
source and its name expressions (cupy/cuda/compiler.py, 14.x)."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from minferd.config import valve

DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def module(name: str, name_expressions: tuple[str, ...] = (), options: tuple[str, ...] = ()):
    """The compiled RawModule of minferd/kernels/<name>.cu (headers in this folder may be included)."""
    import cupy
    path = DIR / f"{name}.cu"
    # CuPy keys its disk cache on the source text, which does not show the headers it includes:
    # their digest goes in, so a changed header can never bring back a stale cubin.
    code = f"// headers {_headers_digest()}\n#line 1 \"{path}\"\n" + path.read_text()
    opts = ("-std=c++17", f"-I{DIR}") + tuple(options) + valve_defines(name)
    return cupy.RawModule(code=code, options=opts, name_expressions=name_expressions or None)


def valve_defines(name: str) -> tuple[str, ...]:
    """Compile options a module takes from the environment (CuPy keys its disk cache on them too).
    MINFERD_X_PLANES=1: the decode mat-vecs read x's first int8 plane only (mmvq_units.cuh's comb)."""
    planes = valve("MINFERD_X_PLANES") or "2"
    if planes not in ("1", "2"):
        raise ValueError(f"MINFERD_X_PLANES={planes[:20]!r}: 1 or 2 (planes of x the decode mat-vecs read)")
    return ("-DMINFERD_X_ONE_PLANE",) if name == "mmvq" and planes == "1" else ()


@functools.lru_cache(maxsize=None)
def _headers_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(DIR.glob("*.cuh")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def part_key(expression: str) -> str | None:
    """The first template argument of a name expression ("mmvq<12, 1, ...>" -> "12"); None for a
    plain (extern "C") name."""
    _, lt, rest = expression.partition("<")
    return rest.split(",")[0].strip(" >") if lt else None


def part(name_expressions: tuple[str, ...], fn_name: str) -> tuple[str, ...]:
    """The name expressions compiled together with fn_name: those of its part (module doc)."""
    key = part_key(fn_name)
    if key is None:
        return ()
    got = tuple(e for e in name_expressions if part_key(e) == key)
    if fn_name not in got:
        raise KeyError(f"{fn_name} is not among the module's {len(name_expressions)} name expressions")
    return got


def parts(name_expressions: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every part of a module, the one of no instances (its extern "C" kernels) first."""
    keys = dict.fromkeys(part_key(e) for e in name_expressions)
    return [()] + [tuple(e for e in name_expressions if part_key(e) == k) for k in keys]


@functools.lru_cache(maxsize=None)
def kernel(name: str, fn_name: str, name_expressions: tuple[str, ...] = (), smem: int = 0):
    """One kernel of minferd/kernels/<name>.cu, launched through launch.Kernel; `smem` above the
    default 48 KB raises the function's dynamic shared memory limit to it."""
    from minferd.kernels.launch import Kernel
    f = module(name, part(name_expressions, fn_name)).get_function(fn_name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    return Kernel(f, fn_name)
