// Token t's MoE output at column h: its residual (or 0) plus its k picks' rows of y (P, H),
// weighted, in pick order. moe.cu's moe_combine and ops.cu's combine_rmsnorm_q both sum with
// this, so the residual stream is the same bits whichever of them ran.
#pragma once

__device__ __forceinline__ float picks_sum(const float* __restrict__ y, const float* __restrict__ wts,
                                           const float* __restrict__ res, int t, int k, int H, int h) {
  float v = res ? res[(long long)t * H + h] : 0.0f;
  for (int j = 0; j < k; ++j) v += wts[t * k + j] * y[((long long)t * k + j) * H + h];
  return v;
}
