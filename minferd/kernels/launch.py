"""The one way this folder's kernels are launched: `Kernel`, a compiled function called like CuPy's.

Inside a captured CUDA graph of up to MAX_ROWS rows (`programmatic()`, entered by the backend's
capture) each launch carries programmatic stream serialization (sm_90's programmatic dependent
launch): the node may start while the node before it finishes. Every kernel here opens with
pdl_enter() (pdl.cuh), which waits for the previous node's results before it reads anything and
then lets the next node start launching, so results still flow in order while a node's launch
latency hides behind the previous one's tail. Graph nodes cost ~2.5 us each without it (bench/NOTES.md, session 2),
and a decode token is ~300 of them. Eager launches take CuPy's own path: there the host is the
bottleneck, and CuPy's Cython launch is cheaper than ctypes.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import numpy as np

from minferd.config import valve

_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)
_local = threading.local()


class _AttrValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("pad", ctypes.c_char * 64)]


class _Attr(ctypes.Structure):  # CUlaunchAttribute: a 4-byte id, padded to 8, then a 64-byte value
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("n_attrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuLaunchKernelEx
    f.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


# Graphs of more rows than this launch the ordinary way. s12, H200, bench/latency.py, medians:
# programmatic launch took the 0.5B's 1-row decode from 1094 to 1134-1189 tok/s and its 16-token
# prefill from 3.36 to 3.02-3.23 ms, the 7B's decode from 363 to 377-389 tok/s; but the 0.5B's
# 128-1024-token graphs lost 0.5-1.5 ms with it (the 7B's moved by under 0.4 ms either way),
# with or without the attribute after cuBLAS's kernels (cause not found).
MAX_ROWS = 64


def rows_limit() -> int:
    """MINFERD_PDL: the most rows (tokens) of a graph launched programmatically; 0 turns it off."""
    v = valve("MINFERD_PDL")
    if v is None:
        return MAX_ROWS
    if not v.isdigit():
        raise ValueError(f"MINFERD_PDL={v[:40]!r}: not a whole number of rows (0 turns it off)")
    return int(v)


@functools.lru_cache(maxsize=None)
def sm_count(dev: int) -> int:
    """The device's SMs: what a persistent grid or a split-K choice sizes itself by."""
    import cupy
    return int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def _sm90() -> bool:
    import cupy as cp
    return cp.cuda.Device().compute_capability >= "90"


@contextlib.contextmanager
def programmatic(on: bool = True):
    """While a graph is captured: this thread's launches carry the programmatic attribute where
    `on` (the graph's rows within rows_limit(): the backend's call) and the device has it."""
    before = getattr(_local, "on", False)
    _local.on = bool(on) and _sm90()
    try:
        yield
    finally:
        _local.on = before


def _arg(a):
    """A kernel argument as the ctypes value CuPy would pass: arrays by their device pointer,
    NumPy scalars by their bytes, Python ints and floats as int64 / float64 (CuPy's rule)."""
    if isinstance(a, np.generic):
        return (ctypes.c_char * a.nbytes).from_buffer_copy(a.tobytes())
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return ctypes.c_int64(a) if isinstance(a, int) else ctypes.c_double(a)
    ptr = getattr(getattr(a, "data", None), "ptr", None)  # a cupy.ndarray's device memory
    if isinstance(ptr, int):
        return ctypes.c_void_p(ptr)
    raise TypeError(f"kernel argument of type {type(a).__name__} is not an array or a number")


class Kernel:
    """A compiled kernel; `k(grid, block, args, shared_mem=0)` launches it on the current stream."""

    def __init__(self, fn, name: str):
        self.fn, self.name = fn, name

    def __call__(self, grid, block, args, shared_mem: int = 0):
        if not getattr(_local, "on", False):
            self.fn(grid, block, args, shared_mem=shared_mem)
            return
        self._launch_programmatic(tuple(grid), tuple(block), args, shared_mem)

    def _function_ptr(self) -> int:
        """The CUfunction: CuPy's RawModule hands out RawKernels, whose .kernel is the Function."""
        return getattr(self.fn, "kernel", self.fn).ptr

    def ctas_per_sm(self, threads: int, shared_mem: int = 0) -> int:
        """CTAs of this kernel one SM holds at `threads` a CTA (CUDA's occupancy calculator):
        what a grid's waves are counted in (bench/tc_splits.py)."""
        from cupy_backends.cuda.api import driver
        return driver.occupancyMaxActiveBlocksPerMultiprocessor(self._function_ptr(), threads, shared_mem)

    def _launch_programmatic(self, grid, block, args, shared_mem):
        import cupy as cp
        grid, block = (grid + (1, 1))[:3], (block + (1, 1))[:3]
        values = [_arg(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        attr = _Attr(id=_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value.i = 1
        cfg = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                      cp.cuda.get_current_stream().ptr, ctypes.pointer(attr), 1)
        rc = _driver()(ctypes.byref(cfg), self._function_ptr(), params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx({self.name}, grid {grid}, block {block}, "
                               f"{shared_mem} B shared) failed: CUresult {rc}")
