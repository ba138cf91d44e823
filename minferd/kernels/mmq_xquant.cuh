// The MMQ kernel's activation format (mmq.cu): x as two int8 planes with one scale per token
// row, plus per-32 sums for the min terms (mmq.cu's header says why). mmvq.cu's mat-vec format,
// one scale per 32 elements, is xquant.cuh.
#pragma once
#include "pdl.cuh"
#include "blocks.cuh"

// ---------------------------------------------------------------------------------------
// x's scale per token row: xd[m] = max |x[m, :]| / 127 (0 for the padding rows m >= M).
extern "C" __global__ void __launch_bounds__(256)
mmq_row_scale(const float* __restrict__ x, int M, int K, int Mp, float* __restrict__ xd) {
  pdl_enter();
  __shared__ float part[8];
  const int m = blockIdx.x;
  float amax = 0.0f;
  if (m < M)
    for (int k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {  // K % 32 == 0
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + (i64)m * K + k));
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) amax = fmaxf(amax, part[w]);
    xd[m] = amax / 127.0f;
  }
}

// x quantizer. Thread = 8 consecutive elements, 4 threads = one 32-block. With d = xd[m] (the
// row's scale, mmq_row_scale) writes, for x rows m < Mp (rows >= M and columns >= K are zeros):
//   xq  int8 [2][Mp][Kp]      plane 0 = hi, plane 1 = lo (x ~= d*(hi + lo/128))
//   xs  f32  [Kp/32][Mp]      sum of the block's quantized values, hi + lo/128
//   xs16 f32x2 [Kp/32][Mp]    the same per 16-element half (Q2_K's mins)
extern "C" __global__ void __launch_bounds__(256)
mmq_quantize_x(const float* __restrict__ x, int M, int K, int Mp, int Kp, i8* __restrict__ xq,
               const float* __restrict__ xd, float* __restrict__ xs, float2* __restrict__ xs16) {
  pdl_enter();
  const i64 gt = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const int kq = Kp >> 3;
  if (gt >= (i64)Mp * kq) return;  // Kp % 128 == 0: whole warps leave together
  const int m = (int)(gt / kq), k = (int)(gt % kq) * 8;
  float v[8];
  if (m < M && k < K) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + (i64)m * K + k));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + (i64)m * K + k + 4));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  const float d = xd[m], id = d > 0.0f ? 1.0f / d : 0.0f;
  u32 h0 = 0, h1 = 0, l0 = 0, l1 = 0;
  int shi = 0, slo = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float t = v[i] * id;
    const int hi = max(-127, min(127, __float2int_rn(t)));
    const int lo = max(-64, min(64, __float2int_rn((t - (float)hi) * 128.0f)));
    shi += hi;
    slo += lo;
    if (i < 4) { h0 |= (u32)(hi & 0xFF) << (8 * i); l0 |= (u32)(lo & 0xFF) << (8 * i); }
    else { h1 |= (u32)(hi & 0xFF) << (8 * (i - 4)); l1 |= (u32)(lo & 0xFF) << (8 * (i - 4)); }
  }
  const i64 o = (i64)m * Kp + k;
  *reinterpret_cast<uint2*>(xq + o) = make_uint2(h0, h1);
  *reinterpret_cast<uint2*>(xq + (i64)Mp * Kp + o) = make_uint2(l0, l1);
  // per-16 sums (lanes 4i, 4i+1: first half; 4i+2, 4i+3: second), then the whole block
  const int hhi = shi + __shfl_xor_sync(0xffffffffu, shi, 1), hlo = slo + __shfl_xor_sync(0xffffffffu, slo, 1);
  const int ohi = __shfl_xor_sync(0xffffffffu, hhi, 2), olo = __shfl_xor_sync(0xffffffffu, hlo, 2);
  if ((threadIdx.x & 3) == 0) {
    const i64 i = (i64)(k >> 5) * Mp + m;
    xs[i] = (float)(hhi + ohi) + (float)(hlo + olo) * (1.0f / 128.0f);
    xs16[i] = make_float2((float)hhi + (float)hlo * (1.0f / 128.0f), (float)ohi + (float)olo * (1.0f / 128.0f));
  }
}
