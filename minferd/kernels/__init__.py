"""CUDA kernels: each .cu file in this folder is one cupy.RawModule, compiled through NVRTC on
first use for the device's architecture and cached by CuPy on disk. A `#line` directive makes
compiler errors point into the .cu file. Importing this package needs no CuPy; `module()` does.
Launchers take their kernels from `kernel()`, never from a module's get_function (launch.py)."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def module(name: str, name_expressions: tuple[str, ...] = (), options: tuple[str, ...] = ()):
    """The compiled RawModule of minferd/kernels/<name>.cu (headers in this folder may be included)."""
    import cupy
    path = DIR / f"{name}.cu"
    # CuPy keys its disk cache on the source text, which does not show the headers it includes:
    # their digest goes in, so a changed header can never bring back a stale cubin.
    code = f"// headers {_headers_digest()}\n#line 1 \"{path}\"\n" + path.read_text()
    opts = ("-std=c++17", f"-I{DIR}") + tuple(options)
    return cupy.RawModule(code=code, options=opts, name_expressions=name_expressions or None)


@functools.lru_cache(maxsize=None)
def _headers_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(DIR.glob("*.cuh")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def kernel(name: str, fn_name: str, name_expressions: tuple[str, ...] = (), smem: int = 0):
    """One kernel of minferd/kernels/<name>.cu, launched through launch.Kernel; `smem` above the
    default 48 KB raises the function's dynamic shared memory limit to it."""
    from minferd.kernels.launch import Kernel
    f = module(name, name_expressions).get_function(fn_name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    return Kernel(f, fn_name)
