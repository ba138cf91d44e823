// Quantized matrix x a small batch on the f16 tensor cores, the weights decoded in registers
// straight into mma fragments:
//   out (M, N) f32 = x (M, K) @ dequant(W)(N, K).T (+ bias[n]) (+ res[m, n]),  M <= 64,
// W = raw GGUF rows of Q4_K, Q6_K or Q8_0. For decode steps of many sequences (and short
// prefill chunks): such a step is bound by reading W, which this reads once, as its quantized
// bytes, for all M tokens.
//
// Why not mmq_small.cu (int8 mma): it round-trips every decoded block through shared memory
// behind a barrier and scales its int32 results per (row, token, 32-chunk); bench/mmq_small.py
// measured it issue-bound at ~1 TB/s. Here a warp owns 16*RT rows and a share of K, decodes each
// weight once into f16 (y = d*sc*q - dmin*m in one f16 FMA from the exact 1024 + q of a magic
// OR), and feeds mma.sync m16n8k16 (f16 in, f32 accumulators): no shared memory in the loop, no
// per-chunk epilogue, the block's scale applied in the decode.
//
// Fragments: A = 16 weight rows x 16 k (row-major), B = 16 k x 8 tokens. Lane (g = lane/4,
// c = lane%4) holds rows g, g+8 at logical k {2c, 2c+1} and {2c+8, 2c+9}. A k-step may take any
// 16 elements of a row as its logical k, so long as x's fragments take the same ones: lane c
// takes 4 physical elements e0..e3 that lie together in the block (four nibbles or bytes of one
// u32), (e0, e2) as logical {2c, 2c+1} and (e1, e3) as {2c+8, 2c+9} (the magic OR splits a word
// into bytes 0,2 and 1,3). x is the f16 copy of the activations the cuBLAS path reads too (rmsnorm
// and the gated activation write it): one 8-byte load of e0..e3 and two byte permutes give a lane
// both of its B registers (x_frag). Each type says which elements step k gives lane c
// (TcW<T>::xoff) and how to make them (frag).
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_tcgemv.py).
#include "blocks.cuh"
#ifndef MINFERD_HOST_TEST  // tests/host/kernels_host.cpp has host twins of these, and of the mma
#include "mma.cuh"

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
  u32 r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
#endif
__device__ __forceinline__ u32 h2_of(float v) { return pack_h2(v, v); }
// (1024 + lo) as two f16: bytes 0 and 2 of v (under the mask) OR'd into the exponent of 1024.
constexpr u32 MAGIC_H2 = 0x64006400u;

template <int TYPE> struct TcW;

// Q4_K, 144 B (16-aligned): d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
// sub-block j's element i is the low (j even) or high nibble of qs[32*(j/2) + i]. Step k: sub-block
// j = k/2, elements 8c + 4(k%2) .. +3: one u32 of the uint2 a lane loads per pair of sub-blocks.
template <> struct TcW<T_Q4_K> {
  static constexpr int QK = 256, BB = 144, STEPS = 16;
  uint4 hdr;
  uint2 q[4];
  __device__ __forceinline__ static int xoff(int k, int c) { return 32 * (k >> 1) + 8 * c + 4 * (k & 1); }
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    hdr = ld128_a16(b);
#pragma unroll
    for (int p = 0; p < 4; ++p) q[p] = ld64_a8(b + 16 + 32 * p + 8 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int j = k >> 1, p = j >> 1;
    const u32 scw = p < 2 ? (hdr.y & 0x3F3F3F3Fu) : ((hdr.w & M4) | ((hdr.y >> 2) & 0x30303030u));
    const u32 mw = p < 2 ? (hdr.z & 0x3F3F3F3Fu) : (((hdr.w >> 4) & M4) | ((hdr.z >> 2) & 0x30303030u));
    const int sh = 8 * (j & 3);  // ggml's get_scale_min_k4: sub-block j's byte in its word
    const float d = h2f((u16)hdr.x), dmin = h2f((u16)(hdr.x >> 16));
    const u32 s = h2_of(d * (float)((scw >> sh) & 0xFF)), nm = h2_of(-dmin * (float)((mw >> sh) & 0xFF));
    const u32 w = ((k & 1) ? q[p].y : q[p].x) >> (4 * (j & 1));
    p0 = hfma2(hsub2((w & 0x000F000Fu) | MAGIC_H2, MAGIC_H2), s, nm);
    p1 = hfma2(hsub2(((w >> 8) & 0x000F000Fu) | MAGIC_H2, MAGIC_H2), s, nm);
  }
};

// Q6_K, 210 B (2-aligned: u16 loads only): ql[128], qh[64], 16 int8 scales (one per 16), d.
// Element 128h + 32r + l (l < 32) is (ql[64h + 32(r&1) + l] >> 4(r>>1)) & 15 | ((qh[32h + l] >>
// 2r) & 3) << 4, minus 32, times d * scales[8h + 2r + l/16]. Step k = (h, r, l/16): a 16-element
// group of one scale, lane c's elements l = 16(l/16) + 4c .. +3.
template <> struct TcW<T_Q6_K> {
  static constexpr int QK = 256, BB = 210, STEPS = 16;
  u32 ql[2][2][2], qh[2][2], sc[4];
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) {
    return 128 * (k >> 3) + 32 * ((k >> 1) & 3) + 16 * (k & 1) + 4 * c;
  }
  __device__ __forceinline__ void fetch(const u8* b, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int is = 0; is < 2; ++is) {
        qh[h][is] = ld32_a2(b + 128 + 32 * h + 16 * is + 4 * c);
#pragma unroll
        for (int r1 = 0; r1 < 2; ++r1) ql[h][r1][is] = ld32_a2(b + 64 * h + 32 * r1 + 16 * is + 4 * c);
      }
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = ld32_a2(b + 192 + 4 * i);
    dh = ld16(b + 208);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int h = k >> 3, r = (k >> 1) & 3, is = k & 1, si = 8 * h + 2 * r + is;
    const u32 lw = ql[h][r & 1][is] >> (4 * (r >> 1)), hw = qh[h][is] >> (2 * r);
    const u32 s = h2_of(h2f(dh) * (float)(int)(i8)(sc[si >> 2] >> (8 * (si & 3))));
    const u32 off = 0x64206420u;  // 1024 + 32 in each half: (1024 + q) - 1056 = q - 32, exact
    p0 = hmul2(hsub2((lw & 0x000F000Fu) | ((hw & 0x00030003u) << 4) | MAGIC_H2, off), s);
    p1 = hmul2(hsub2(((lw >> 8) & 0x000F000Fu) | (((hw >> 8) & 0x00030003u) << 4) | MAGIC_H2, off), s);
  }
};

// Q8_0, 34 B (2-aligned): d, 32 int8. Step k (0, 1): elements 16k + 4c .. +3. q + 128 < 256 keeps
// 1024 + q + 128 exact in f16.
template <> struct TcW<T_Q8_0> {
  static constexpr int QK = 32, BB = 34, STEPS = 2;
  u32 q[2];
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dh = ld16(b);
    q[0] = ld32_a2(b + 2 + 4 * c);
    q[1] = ld32_a2(b + 18 + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const u32 s = h2_of(h2f(dh)), w = q[k] ^ 0x80808080u, off = 0x64806480u;  // 1024 + 128
    p0 = hmul2(hsub2((w & 0x00FF00FFu) | MAGIC_H2, off), s);
    p1 = hmul2(hsub2(((w >> 8) & 0x00FF00FFu) | MAGIC_H2, off), s);
  }
};

// B registers of a lane from 4 consecutive f16 of x at p (8-aligned): (e0, e2) and (e1, e3).
__device__ __forceinline__ void x_frag(const u16* p, u32& b0, u32& b1) {
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  b0 = __byte_perm(v.x, v.y, 0x5410);
  b1 = __byte_perm(v.x, v.y, 0x7632);
}

// Grid (ceil(N / (16 RT)), splits); a CTA is KW warps on the same 16 RT rows, warp w taking the
// blocks b = b0 + w, b0 + w + KW, ... of its split's range [z*bps, (z+1)*bps), UNR at a time. x16: f16
// (M, K); the token rows of a tile past M read row M-1 again, and their sums are never stored (a
// column of the mma's output depends on its own column of B only). part == nullptr: one split,
// out gets bias and residual; else part[z][m][n].
template <int TYPE, int NT8, int RT, int KW, int UNR>
__global__ void __launch_bounds__(KW * 32)
tcgemv(const u8* __restrict__ W, i64 row_bytes, int nb, int N, int M, int K, int bps, const u16* __restrict__ x16,
       float* __restrict__ out, const float* __restrict__ bias, const float* __restrict__ res,
       float* __restrict__ part) {
  typedef TcW<TYPE> T;
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * 16 * RT, z = blockIdx.y;
  const int b0 = z * bps, b1 = min(nb, b0 + bps);
  const u8* rp[RT][2];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) rp[t][h] = W + (i64)min(row0 + 16 * t + g + 8 * h, N - 1) * row_bytes;
  const u16* xr[NT8];
#pragma unroll
  for (int n = 0; n < NT8; ++n) xr[n] = x16 + (i64)min(8 * n + g, M - 1) * K;

  float acc[RT][NT8][4];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][n][e] = 0.f;

  // UNR blocks' loads are issued before any of them is decoded: more bytes in flight per warp.
  for (int b = b0 + kw; b < b1; b += KW * UNR) {
    T w[UNR][RT][2];
#pragma unroll
    for (int u = 0; u < UNR; ++u)
      if (b + u * KW < b1) {
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h) w[u][t][h].fetch(rp[t][h] + (i64)(b + u * KW) * T::BB, c);
      }
#pragma unroll
    for (int u = 0; u < UNR; ++u) {
      if (b + u * KW >= b1) break;
#pragma unroll
      for (int k = 0; k < T::STEPS; ++k) {
        u32 a[RT][4];
#pragma unroll
        for (int t = 0; t < RT; ++t) {
          w[u][t][0].frag(k, a[t][0], a[t][2]);
          w[u][t][1].frag(k, a[t][1], a[t][3]);
        }
        const i64 xo = (i64)(b + u * KW) * T::QK + T::xoff(k, c);
#pragma unroll
        for (int n = 0; n < NT8; ++n) {
          u32 b0, b1;
          x_frag(xr[n] + xo, b0, b1);
#pragma unroll
          for (int t = 0; t < RT; ++t) mma16816(acc[t][n], a[t], b0, b1);
        }
      }
    }
  }

  // The KW warps' sums of the same outputs, added in a fixed tree (deterministic): each round the
  // upper half of the warps still holding sums hands them to the lower half.
  if constexpr (KW > 1) {
    static_assert((KW & (KW - 1)) == 0, "KW must be a power of two");
    __shared__ float red[KW / 2][RT * NT8 * 4][32];
#pragma unroll
    for (int half = KW / 2; half >= 1; half /= 2) {
      if (kw >= half && kw < 2 * half) {
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
          for (int n = 0; n < NT8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[kw - half][(t * NT8 + n) * 4 + e][lane] = acc[t][n][e];
      }
      __syncthreads();
      if (kw < half) {
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
          for (int n = 0; n < NT8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][n][e] += red[kw][(t * NT8 + n) * 4 + e][lane];
      }
      __syncthreads();
    }
    if (kw > 0) return;
  }
  // Accumulator (t, n): e = 0, 1 row g, tokens 2c, 2c+1 of tile n; e = 2, 3 row g + 8.
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + 16 * t + g + 8 * (e >> 1), m = 8 * n + 2 * c + (e & 1);
        if (row >= N || m >= M) continue;
        const float v = acc[t][n][e];
        if (part) {
          part[((i64)z * M + m) * N + row] = v;
        } else {
          const i64 o = (i64)m * N + row;
          out[o] = v + (bias ? __ldg(bias + row) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
        }
      }
}
