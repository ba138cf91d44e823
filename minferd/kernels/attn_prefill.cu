// Prefill attention, flash style: out = softmax(q k^T * scale, causal + window mask) v for n
// queries at consecutive positions first..first+n-1 against the f16 KV cache (keys at slot
// p % slots), GQA, head dims 64 / 128 / 256.
//
// Why a kernel of our own: the cuBLAS version wrote every score (hq x n x L f32: 470 MB a
// layer at 2048 tokens), softmaxed it in place and multiplied again in f32 SIMT GEMMs; on the
// H200 that was 50 ms of a 135 ms pp2048. Here scores live in registers: f16 tensor-core
// products (mma.sync m16n8k16, f32 accumulation), an online softmax in f32, and the K/V
// tiles staged once per CTA in shared memory.
//
// Work split: a CTA owns 64 queries of one head (4 warps x 16 rows); it walks the key tiles
// its queries can see (causal end, window start). Per tile: S = Q K^T (Q pre-scaled by
// scale * log2(e), so p = exp2(s - m)), mask, online softmax per row (a row's 4 lanes share
// it through two shuffles), then O += P V with P re-packed from the S accumulators as the
// A operand (their layouts coincide) and V read transposed by ldmatrix.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g+8 x cols 2t,
// 2t+1, 2t+8, 2t+9; B (k x n) k 2t.., n g; C rows g, g+8 x cols 2t, 2t+1. Shared rows are
// padded by 8 halves so those 32-bit reads hit 32 different banks.
//
// PAGED: the keys of one sequence through its block table (slot of position p: table[p / bs] *
// bs + p % bs), and first and the query count read from the device (dims[0], dims[1]), so a
// captured prefill graph replays for any prompt up to its n rows; rows from dims[1] to n are
// written as zeros (they are the graph's padding).
//
// CPU reference: the NumPy attention of backend/cpu.py (tests/cuda/test_backend.py).
#include "pdl.cuh"
#include <cuda_fp16.h>

typedef unsigned int u32;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const __half* p) {
  const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ u32 pack_h2(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);  // a in the low half: the lower column
  return *reinterpret_cast<u32*>(&h);
}

__device__ __forceinline__ u32 ld_s32(const __half* p) { return *reinterpret_cast<const u32*>(p); }

// Shared memory (halves) of a CTA: Q (64 rows) then K and V (BK rows each), rows of D + 8.
template <int D, int BK>
struct Smem {
  static constexpr int ROW = D + 8, BQ = 64;
  static constexpr int BYTES = (BQ + 2 * BK) * ROW * 2;
};

template <int D, int BK, bool PAGED>
__global__ void __launch_bounds__(128)
attn_prefill(const float* __restrict__ q, const __half* __restrict__ Kc, const __half* __restrict__ Vc,
             float* __restrict__ out, int n, int hq, int hkv, int slots, int first, int lo, int window,
             float qscale, const int* __restrict__ table, int bs, const int* __restrict__ dims,
             const float* __restrict__ sinks) {
  pdl_enter();
  typedef Smem<D, BK> S;
  constexpr int ROW = S::ROW, BQ = S::BQ, NT = BK / 8, DT = D / 8, KS = D / 16;
  // Q fragments stay in registers where they fit beside the O accumulators (D <= 128).
  constexpr bool QREG = D <= 128;
  extern __shared__ __align__(16) __half smem[];
  __half* Qs = smem;
  __half* Ks = smem + BQ * ROW;
  __half* Vs = Ks + BK * ROW;

  const int h = blockIdx.y, kvh = h / (hq / hkv), q0 = blockIdx.x * BQ;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const long long qstride = (long long)hq * D, kvstride = (long long)hkv * D;
  int nv = n;  // queries with a position (the rest are padding)
  if constexpr (PAGED) {
    first = dims[0];
    nv = dims[1];
    lo = 0;
  }
  if (q0 >= nv) {  // a tile of padding rows only
    for (int c = tid; c < BQ * D; c += 128) {
      const int r = q0 + c / D;
      if (r < n) out[r * qstride + (long long)h * D + c % D] = 0.f;
    }
    return;
  }

  // Q tile -> shared, scaled and rounded to f16 (rows past n are zeros and never written out).
  for (int c = tid; c < BQ * D / 4; c += 128) {
    const int r = c / (D / 4), e = (c % (D / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (q0 + r < nv) v = *reinterpret_cast<const float4*>(q + (q0 + r) * qstride + (long long)h * D + e);
    *reinterpret_cast<u32*>(Qs + r * ROW + e) = pack_h2(v.x * qscale, v.y * qscale);
    *reinterpret_cast<u32*>(Qs + r * ROW + e + 2) = pack_h2(v.z * qscale, v.w * qscale);
  }
  __syncthreads();
  const int wr = warp * 16;  // this warp's first row in the tile
  u32 qf[QREG ? KS : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      qf[kk][0] = ld_s32(Qs + (wr + g) * ROW + kk * 16 + 2 * t);
      qf[kk][1] = ld_s32(Qs + (wr + g + 8) * ROW + kk * 16 + 2 * t);
      qf[kk][2] = ld_s32(Qs + (wr + g) * ROW + kk * 16 + 8 + 2 * t);
      qf[kk][3] = ld_s32(Qs + (wr + g + 8) * ROW + kk * 16 + 8 + 2 * t);
    }
  }

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qp[2] = {first + q0 + wr + g, first + q0 + wr + g + 8};  // positions of this lane's two rows

  const int last = first + nv - 1;
  const int kmax = min(last, first + q0 + BQ - 1);
  int kmin = lo;
  if (window > 0) kmin = max(kmin, first + q0 - window + 1);

  for (int k0 = kmin; k0 <= kmax; k0 += BK) {
    // K, V tile -> shared, 16 bytes at a time; keys past kmax are zeros (masked below; zero V
    // keeps 0 * garbage from making a NaN).
    for (int c = tid; c < BK * DT; c += 128) {
      const int r = c / DT, e = (c % DT) * 8, kp = k0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (kp <= kmax) {
        const long long slot = PAGED ? (long long)table[kp / bs] * bs + kp % bs : kp % slots;
        const long long src = slot * kvstride + (long long)kvh * D + e;
        kv = *reinterpret_cast<const uint4*>(Kc + src);
        vv = *reinterpret_cast<const uint4*>(Vc + src);
      }
      *reinterpret_cast<uint4*>(Ks + r * ROW + e) = kv;
      *reinterpret_cast<uint4*>(Vs + r * ROW + e) = vv;
    }
    __syncthreads();

    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      u32 a0, a1, a2, a3;
      if constexpr (QREG) {
        a0 = qf[kk][0]; a1 = qf[kk][1]; a2 = qf[kk][2]; a3 = qf[kk][3];
      } else {
        a0 = ld_s32(Qs + (wr + g) * ROW + kk * 16 + 2 * t);
        a1 = ld_s32(Qs + (wr + g + 8) * ROW + kk * 16 + 2 * t);
        a2 = ld_s32(Qs + (wr + g) * ROW + kk * 16 + 8 + 2 * t);
        a3 = ld_s32(Qs + (wr + g + 8) * ROW + kk * 16 + 8 + 2 * t);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __half* kr = Ks + (nt * 8 + g) * ROW + kk * 16 + 2 * t;
        mma16816(s[nt], a0, a1, a2, a3, ld_s32(kr), ld_s32(kr + 8));
      }
    }

    // Mask, then the online softmax of rows g (j = 0) and g + 8 (j = 1).
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = e >> 1, kp = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = kp <= qp[j] && kp <= kmax && (window == 0 || qp[j] - kp < window);
        s[nt][e] = ok ? s[nt][e] : -INFINITY;
        mt[j] = fmaxf(mt[j], s[nt][e]);
      }
    float alpha[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mt[j] = fmaxf(mt[j], __shfl_xor_sync(0xffffffffu, mt[j], 1));
      mt[j] = fmaxf(mt[j], __shfl_xor_sync(0xffffffffu, mt[j], 2));
      const float mn = fmaxf(m[j], mt[j]);
      alpha[j] = mn == -INFINITY ? 1.f : exp2f(m[j] - mn);  // m = -inf: nothing to rescale
      m[j] = mn;
      l[j] *= alpha[j];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = e >> 1;
        const float p = m[j] == -INFINITY ? 0.f : exp2f(s[nt][e] - m[j]);
        s[nt][e] = p;
        l[j] += p;
      }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
    }

    // O += P V: 16 keys per step; ldmatrix.trans gives V's B fragments for two d tiles at once.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const u32 a0 = pack_h2(s[2 * kk][0], s[2 * kk][1]), a1 = pack_h2(s[2 * kk][2], s[2 * kk][3]);
      const u32 a2 = pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]), a3 = pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      const int vrow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int dt = 0; dt < DT; dt += 2) {
        u32 b0, b1, b2, b3;
        ldmatrix_x4_trans(b0, b1, b2, b3, Vs + vrow * ROW + dt * 8 + (lane >> 4) * 8);
        mma16816(o[dt], a0, a1, a2, a3, b0, b1);
        mma16816(o[dt + 1], a0, a1, a2, a3, b2, b3);
      }
    }
    __syncthreads();  // the next tile overwrites Ks / Vs
  }

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int row = q0 + wr + g + 8 * j;
    if (row >= n) continue;
    // gpt-oss's sink joins the denominator (unscaled; m is in the log2 domain of the scores).
    const float lj = sinks ? l[j] + exp2f(__ldg(sinks + h) * 1.4426950408889634f - m[j]) : l[j];
    // Every query sees at least its own key: l > 0. A padding row (PAGED) is zeros.
    const float inv = row < nv ? 1.0f / lj : 0.f;
    float* dst = out + row * qstride + (long long)h * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * j] * inv, o[dt][2 * j + 1] * inv);
  }
}
