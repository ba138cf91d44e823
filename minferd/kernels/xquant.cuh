// The activation format of the mat-vec kernels (mmvq.cu), written by quantize_x and by the
// fused ops that end where a matmul begins (ops.cu: rmsnorm_q, act_gate_q): one
// implementation, so a fused producer gives bit-for-bit what quantize_x would.
//
// Per 32 elements of a column: d = amax/127, x = d * (hi + lo/254) with hi = rint(x/d) and lo
// the rounded residual (two int8 planes; mmvq.cu's header says why), plus the block's exact
// f32 sum. Layout of a column c of K elements: block kb's hi values at xq[c*2K + 32 pos + i]
// and lo at xq[c*2K + K + 32 pos + i], pos = xq_block_pos(kb, K/32) (xlayout.cuh: the
// blocks of each group of 8 stored evens first); xds[c*kbp + kb] = (d, sum) in block order,
// kbp >= K/32 a multiple of 4 (32-byte aligned rows).
#pragma once
#include "xlayout.cuh"

// One warp quantizes block kb of a column (xq_col, xds_col): lane i holds its element i, all 32
// lanes call.
__device__ __forceinline__ void quantize_block32(float v, int lane, signed char* xq_col, int K, int kb,
                                                 float2* xds_col) {
  float amax = fabsf(v), sum = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  const float d = amax / 127.0f;
  int hi = 0, lo = 0;
  if (amax > 0.0f) {
    hi = max(-127, min(127, __float2int_rn(v / d)));
    lo = max(-127, min(127, __float2int_rn(fmaf(-(float)hi, d, v) / d * 254.0f)));  // |residual| <= d/2
  }
  signed char* xq_block = xq_col + 32 * xq_block_pos(kb, K >> 5);
  xq_block[lane] = (signed char)hi;
  xq_block[K + lane] = (signed char)lo;
  if (lane == 0) xds_col[kb] = make_float2(d, sum);
}
