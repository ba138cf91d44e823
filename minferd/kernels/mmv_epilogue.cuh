// What the mat-vec kernels (mmvq.cu, mmvq_xs.cu) share after their dot products: the warp's
// sum, and the store that folds in the projection bias and the residual add (two kernels a
// layer of a decode step saved).
#pragma once
#include "blocks.cuh"

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out = x.W (+ bias[row]) (+ res[c, row])
__device__ __forceinline__ void store_out(float* out, const float* bias, const float* res, int nrows, int c,
                                          int row, float v) {
  const i64 o = (i64)c * nrows + row;
  if (bias) v += bias[row];
  if (res) v += res[o];
  out[o] = v;
}
