// mmvq.cu's kernels for float weights (x stays f32), included after its shared helpers
// (warp_sum, store_out).
#pragma once
#include "pdl.cuh"

// Float weights: x stays f32 (no reason to round it when W is not quantized). One warp per
// row (or KW warps: mmv_float_rows), lanes over chunks of VEC elements (VEC 8: 16-byte loads of
// f16/bf16, 2 x 16 of f32, when rows are 16-aligned and K % 8 == 0; else VEC 1, scalar).
template <int TYPE>
__device__ __forceinline__ void load8(const u8* p, float* v) {
  if constexpr (TYPE == T_F32) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y); v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);
    v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y); v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);
  } else {
    const uint4 a = ldw128(p);
    const u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (TYPE == T_F16) {
        v[2 * i] = h2f((u16)w[i]); v[2 * i + 1] = h2f((u16)(w[i] >> 16));
      } else {  // BF16
        v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    }
  }
}

// A CTA is 4 warps: one row each (KW 1), or KW warps splitting a row's K between them and adding up
// through shared memory (a router's 32-128 rows: on 8-32 CTAs a warp walked all of K alone).
template <int TYPE, int NC, int VEC, int KW = 1>
__device__ __forceinline__ void mmv_float_rows(const u8* __restrict__ W, i64 row_bytes, int nrows, int K,
                                               const float* __restrict__ x, int ncols, float* __restrict__ out,
                                               const float* __restrict__ bias, const float* __restrict__ res) {
  static_assert(4 % KW == 0, "K-split warps divide the CTA's 4");
  constexpr int UNR = 2, ES = Blk<TYPE>::BB, STEP = 32 * KW * VEC;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = warp % KW;
  const int row = blockIdx.x * (4 / KW) + warp / KW;
  if (KW == 1 && row >= nrows) return;  // with KW > 1 every warp must reach __syncthreads
  const u8* rp = W + (i64)min(row, nrows - 1) * row_bytes;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
  for (int e00 = (kw * 32 + lane) * VEC; e00 < K; e00 += STEP * UNR) {
    float v[UNR][VEC];
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int e0 = e00 + STEP * k;
      if (e0 < K) {
        if constexpr (VEC == 8) load8<TYPE>(rp + (i64)e0 * ES, v[k]);
        else Blk<TYPE>::dec(rp, e0, 1, v[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int e0 = e00 + STEP * k;
      if (e0 < K) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            const float* xc = x + (i64)c * K + e0;
            if constexpr (VEC == 8) {
              const float4 a = __ldg(reinterpret_cast<const float4*>(xc)), b = __ldg(reinterpret_cast<const float4*>(xc) + 1);
              acc[c] += v[k][0] * a.x + v[k][1] * a.y + v[k][2] * a.z + v[k][3] * a.w +
                        v[k][4] * b.x + v[k][5] * b.y + v[k][6] * b.z + v[k][7] * b.w;
            } else {
              acc[c] += v[k][0] * __ldg(xc);
            }
          }
        }
      }
    }
  }
  if constexpr (KW == 1) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float s = warp_sum(acc[c]);
      if (lane == 0 && c < ncols) store_out(out, bias, res, nrows, c, row, s);
    }
  } else {
    __shared__ float red[4][NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float s = warp_sum(acc[c]);
      if (lane == 0) red[warp][c] = s;
    }
    __syncthreads();
    if (kw == 0 && lane < NC && lane < ncols && row < nrows) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < KW; ++j) s += red[warp + j][lane];
      store_out(out, bias, res, nrows, lane, row, s);
    }
  }
}

template <int TYPE, int NC, int VEC, int KW = 1>
__global__ void __launch_bounds__(128)
mmv_float(const u8* __restrict__ W, i64 row_bytes, int nrows, int K, const float* __restrict__ x,
          int ncols, float* __restrict__ out, const float* __restrict__ bias, const float* __restrict__ res) {
  pdl_enter();
  mmv_float_rows<TYPE, NC, VEC, KW>(W, row_bytes, nrows, K, x, ncols, out, bias, res);
}

// mmvq_ids for float experts: x's row p / xdiv in f32 (blockIdx.z: W2 into out2, as there).
template <int TYPE, int VEC>
__global__ void __launch_bounds__(128)
mmv_float_ids(const u8* __restrict__ W, const u8* __restrict__ W2, i64 expert_bytes, int nrows,
              const int* __restrict__ ids, int xdiv, float* __restrict__ out, float* __restrict__ out2,
              const float* __restrict__ B, const float* __restrict__ B2, i64 row_bytes, int K,
              const float* __restrict__ x) {
  pdl_enter();
  const int p = blockIdx.y, e = __ldg(ids + p);
  const u8* __restrict__ w = blockIdx.z ? W2 : W;
  float* __restrict__ o = blockIdx.z ? out2 : out;
  const float* __restrict__ b = blockIdx.z ? B2 : B;
  mmv_float_rows<TYPE, 1, VEC>(w + (i64)e * expert_bytes, row_bytes, nrows, K, x + (i64)(p / xdiv) * K,
                               1, o + (i64)p * nrows, b ? b + (i64)e * nrows : nullptr, nullptr);
}
