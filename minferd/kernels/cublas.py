"""cuBLAS for the prefill GEMMs of the W16 path: f16 operands, f32 accumulation and f32 output.

cupy.matmul of two f16 arrays returns f16, and casting that back to f32 cost as much as a quarter
of a 2048-token prefill on the H200; GemmEx writes f32 directly and rounds no product to f16.

The calls go to libcublas through ctypes, on CuPy's handle for this thread: CuPy's own wrappers
refuse to run while a stream is being captured, and a decode graph of more than eight sequences
multiplies through cuBLAS. cuBLAS itself captures, given a workspace of its own (set on every
call, since setting the stream resets it): no cudaMalloc may happen inside a capture.
"""
from __future__ import annotations

import ctypes
import functools

import cupy as cp
import numpy as np

from minferd.devices import CUBLAS_WORKSPACE_BYTES as WORKSPACE_BYTES
_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)
_p, _i = ctypes.c_void_p, ctypes.c_int


@functools.lru_cache(maxsize=None)
def _lib():
    """The libcublas CuPy loaded (the same library, so the same handle is valid here)."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads libcublas into the process
    with open("/proc/self/maps") as f:
        path = next((line.split()[-1] for line in f if "/libcublas.so" in line), None)
    if path is None:
        raise RuntimeError("libcublas is not loaded in this process (CuPy's cuBLAS module failed to load it)")
    lib = ctypes.CDLL(path)
    lib.cublasSetStream_v2.argtypes = [_p, _p]
    lib.cublasSetWorkspace_v2.argtypes = [_p, _p, ctypes.c_size_t]
    lib.cublasGemmEx.argtypes = [_p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _p, _i, _i, _p, _p, _i, _i, _i, _i]
    return lib


@functools.lru_cache(maxsize=None)
def _consts():
    from cupy_backends.cuda.libs import cublas
    return cublas, cp.cuda.runtime


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: cublasStatus {status}")


def gemm_f32(a16, b16, out=None, workspace=None):
    """out (m, n) f32 = a16 (m, k) @ b16 (n, k).T through cuBLAS GemmEx: f16 in, f32 accumulate
    AND f32 out. out may be a column slice. workspace: a device buffer of at least
    WORKSPACE_BYTES (needed when the call is captured into a graph)."""
    m, k = a16.shape
    n = b16.shape[0]
    if out is None:
        out = cp.empty((m, n), cp.float32)
    if a16.strides[1] != 2 or b16.strides[1] != 2 or out.strides[1] != 4 or b16.shape[1] != k or out.shape != (m, n):
        raise ValueError(f"gemm_f32: {a16.shape} x {b16.shape}.T -> {out.shape}: rows must be contiguous")
    if a16.dtype != cp.float16 or b16.dtype != cp.float16 or out.dtype != cp.float32:
        raise ValueError(f"gemm_f32: f16 x f16 -> f32, got {a16.dtype} x {b16.dtype} -> {out.dtype}")
    if workspace is not None and workspace.nbytes < WORKSPACE_BYTES:
        raise ValueError(f"gemm_f32: a workspace of {workspace.nbytes} bytes, under {WORKSPACE_BYTES}")
    lib, handle = _lib(), cp.cuda.device.get_cublas_handle()
    _check(lib.cublasSetStream_v2(handle, cp.cuda.get_current_stream().ptr), "cublasSetStream")
    if workspace is not None:
        _check(lib.cublasSetWorkspace_v2(handle, workspace.data.ptr, workspace.nbytes), "cublasSetWorkspace")
    # Row-major out = a @ b.T is column-major out.T = b.T^T @ a.T: cuBLAS sees b as (k, n) and a as (k, m).
    cb, rt = _consts()
    _check(lib.cublasGemmEx(handle, cb.CUBLAS_OP_T, cb.CUBLAS_OP_N, n, m, k, _ONE.ctypes.data,
                            b16.data.ptr, rt.CUDA_R_16F, b16.strides[0] // 2, a16.data.ptr, rt.CUDA_R_16F,
                            a16.strides[0] // 2, _ZERO.ctypes.data, out.data.ptr, rt.CUDA_R_32F, out.strides[0] // 4,
                            cb.CUBLAS_COMPUTE_32F, cb.CUBLAS_GEMM_DEFAULT), "cublasGemmEx")
    return out
