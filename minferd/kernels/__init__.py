"""CUDA kernels: each .cu file in this folder is one cupy.RawModule, compiled through NVRTC on
first use for the device's architecture and cached by CuPy on disk. A `#line` directive makes
compiler errors point into the .cu file. Importing this package needs no CuPy; `module()` does."""
from __future__ import annotations

import functools
from pathlib import Path

DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def module(name: str, name_expressions: tuple[str, ...] = (), options: tuple[str, ...] = ()):
    """The compiled RawModule of minferd/kernels/<name>.cu (headers in this folder may be included)."""
    import cupy
    path = DIR / f"{name}.cu"
    code = f'#line 1 "{path}"\n' + path.read_text()
    opts = ("-std=c++17", f"-I{DIR}") + tuple(options)
    return cupy.RawModule(code=code, options=opts, name_expressions=name_expressions or None)
