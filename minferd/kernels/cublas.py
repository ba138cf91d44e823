"""cuBLAS for the prefill GEMMs of the W16 path: f16 operands, f32 accumulation and f32 output.

cupy.matmul of two f16 arrays returns f16, and casting that back to f32 cost as much as a quarter
of a 2048-token prefill on the H200; GemmEx writes f32 directly and rounds no product to f16."""
from __future__ import annotations

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas


_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)


def gemm_f32(a16, b16, out=None):
    """out (m, n) f32 = a16 (m, k) @ b16 (n, k).T through cuBLAS GemmEx: f16 in, f32 accumulate
    AND f32 out, so no f16 product is rounded and then cast back (cupy.matmul of f16 returns
    f16: the cast cost as much as a quarter of a prefill). out may be a column slice."""
    m, k = a16.shape
    n = b16.shape[0]
    if out is None:
        out = cp.empty((m, n), cp.float32)
    if a16.strides[1] != 2 or b16.strides[1] != 2 or out.strides[1] != 4 or b16.shape[1] != k or out.shape != (m, n):
        raise ValueError(f"gemm_f32: {a16.shape} x {b16.shape}.T -> {out.shape}: rows must be contiguous")
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    # Row-major out = a @ b.T is column-major out.T = b.T^T @ a.T: cuBLAS sees b as (k, n) and a as (k, m).
    cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k, _ONE.ctypes.data,
                  b16.data.ptr, cp.cuda.runtime.CUDA_R_16F, b16.strides[0] // 2,
                  a16.data.ptr, cp.cuda.runtime.CUDA_R_16F, a16.strides[0] // 2, _ZERO.ctypes.data,
                  out.data.ptr, cp.cuda.runtime.CUDA_R_32F, out.strides[0] // 4,
                  cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    return out
