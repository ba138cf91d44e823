// The integer tensor-core tile of the MMQ kernels (mmq.cu for prefill, mmq_small.cu for
// decode batches): the shared-memory stage layout, the copies of x's quantized planes into it,
// and one 32-chunk of m16n8k32 (or two m16n8k16) s8 mmas with its scaling. mmq.cu's header
// describes the formats and the arithmetic.
#pragma once
#include "mma.cuh"

#ifndef MMQ_ABLATE
#define MMQ_ABLATE 0  // bench/mmq_probe.py: 1 = the per-chunk epilogue cut to the mmas' unbias
#endif
#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f  // 1.5 * 2^23

constexpr int BK = 128;          // K elements per pipeline step (4 chunks of 32)
constexpr int ROWB = BK + 16;    // bytes per smem row (padding: conflict-free ldmatrix)
constexpr int MP_ALIGN = 128;    // x rows and unpacked W rows are padded to this (the largest BM, BN)

// The int8 mma (mma.cuh has the loads and copies).
// d = a (16x32 s8, row) * b (32x8 s8, col) + MAGIC: float bits of 1.5*2^23 + the dot product.
__device__ __forceinline__ void mma_k32(int* d, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC_I));
}
__device__ __forceinline__ void mma_k16(int* d, u32 a0, u32 a1, u32 b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(MAGIC_I));
}
// The f32 value hi + lo/128 of two MAGIC-biased accumulators: the FADD constant folds both
// biases, and the FMA rounds once.
__device__ __forceinline__ float unbias2(int h, int l) {
  return fmaf(__int_as_float(l), 1.0f / 128.0f, __int_as_float(h) - (MAGIC_F + MAGIC_F / 128.0f));
}

// Shared-memory stage layout (bytes), shared with mmq.py's smem_bytes().
template <int BN, int BM, int NS, int KIND> struct Stage {
  static constexpr int W = 0;                                  // int8 [BN][ROWB]
  static constexpr int X = W + BN * ROWB;                      // int8 [2][BM][ROWB] (hi, lo)
  static constexpr int WS = X + 2 * BM * ROWB;                 // f32 [BN][4][NS]
  static constexpr int XS = WS + 4 * BN * NS * 4;              // f32 [4][BM] (KIND 1)
  static constexpr int XS16 = XS + (KIND == 1 ? 4 * BM * 4 : 0);  // f32x2 [4][BM] (KIND 3)
  static constexpr int BYTES = XS16 + (KIND == 3 ? 4 * BM * 8 : 0);
};


// The copies of x's tiles for one K step into a stage: both int8 planes (BM rows x BK), and the
// chunk sums the type's min terms need. Every copy is 16 bytes from a 16-aligned source; a
// thread's copies sit at the same places in every step, so their addresses are set up once.
template <int BM, int NS, int KIND, int NT>
struct XTiles {
  static constexpr int CPR = BK / 16, RPS = NT / CPR;  // copies per row; rows per pass of the CTA
  static_assert(BM % RPS == 0 && 2 * BM <= NT, "whole passes");
  const i8* src;
  const float* xs_src;
  const float2* x16_src;
  i64 plane, pass, Mp4;
  u32 dx, dxs, dx16;
  bool xs_ok, x16_ok;
  template <int BN>
  __device__ __forceinline__ void init_at(const i8* xq, const float* xs, const float2* xs16, int m0, int Mp, int Kp, int tid) {
    typedef Stage<BN, BM, NS, KIND> S;
    const int rq = tid / CPR, cq = tid % CPR;
    const int xc = tid / (BM / 4), xq4 = tid % (BM / 4), yc = tid / (BM / 2), yq = tid % (BM / 2);
    src = xq + (i64)(m0 + rq) * Kp + 16 * cq;
    xs_src = xs + (i64)xc * Mp + m0 + 4 * xq4;
    x16_src = xs16 + (i64)yc * Mp + m0 + 2 * yq;
    plane = (i64)Mp * Kp, pass = (i64)RPS * Kp, Mp4 = (i64)4 * Mp;
    dx = S::X + rq * ROWB + 16 * cq;
    dxs = S::XS + (xc * BM + 4 * xq4) * 4, dx16 = S::XS16 + (yc * BM + 2 * yq) * 8;
    xs_ok = tid < BM, x16_ok = tid < 2 * BM;
  }
  // st: the stage's shared address; s: the K step.
  __device__ __forceinline__ void issue(u32 st, int s) const {
    const i64 k0 = (i64)s * BK;
#pragma unroll
    for (int pl = 0; pl < 2; ++pl)
#pragma unroll
      for (int i = 0; i < BM / RPS; ++i) cp16(st + dx + (pl * BM + i * RPS) * ROWB, src + pl * plane + i * pass + k0, 16);
    // Braces on every `if constexpr`: NVCC 13.0 dropped the statements after a discarded
    // `if constexpr` whose body was an unbraced for loop (the copies that followed vanished).
    if constexpr (KIND == 1) {
      if (xs_ok) { cp16(st + dxs, xs_src + Mp4 * s, 16); }  // 4 chunks x BM/4 float4
    }
    if constexpr (KIND == 3) {
      if (x16_ok) { cp16(st + dx16, x16_src + Mp4 * s, 16); }  // 4 chunks x BM/2 float4
    }
  }
};

// One 32-chunk c of the stage at st: acc (this warp's TN x TM tiles) += the chunk's scaled dot products.
template <int NS, int KIND, int WN, int WM, int TN, int TM>
__device__ __forceinline__ void mmq_chunk(const u8* st, int c, float (&acc)[TN][TM][4], int lane, int wn, int wm) {
  constexpr int BN = 16 * TN * WN, BM = 8 * TM * WM;
  typedef Stage<BN, BM, NS, KIND> S;
  const int g = lane >> 2, t = lane & 3;
  u32 a[TN][4], b[2][TM][2];
  const u32 sw = saddr(st + S::W), sx = saddr(st + S::X);
#pragma unroll
  for (int i = 0; i < TN; ++i) {
    const int r = wn * TN * 16 + 16 * i + (lane & 7) + ((lane >> 3) & 1) * 8;
    ldsm4(sw + r * ROWB + 32 * c + (lane >> 4) * 16, a[i][0], a[i][1], a[i][2], a[i][3]);
  }
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int jj = 0; jj < TM / 2; ++jj) {
      const int r = wm * TM * 8 + 16 * jj + (lane & 7) + (lane >> 4) * 8;
      ldsm4(sx + (pl * BM + r) * ROWB + 32 * c + ((lane >> 3) & 1) * 16,
            b[pl][2 * jj][0], b[pl][2 * jj][1], b[pl][2 * jj + 1][0], b[pl][2 * jj + 1][1]);
    }
  const float* wsf = reinterpret_cast<const float*>(st + S::WS) + c * NS;
  const float* sxs = reinterpret_cast<const float*>(st + S::XS) + c * BM;
  const float4* sxs16 = reinterpret_cast<const float4*>(st + S::XS16) + c * BM / 2;
  float sc[TN][2][NS];  // row scales of rows g (h = 0) and g + 8 of each 16-row tile
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* rs = wsf + (wn * TN * 16 + 16 * i + g + 8 * h) * 4 * NS;
      if constexpr (NS == 1) { sc[i][h][0] = rs[0]; }
      if constexpr (NS == 2) { const float2 v = *reinterpret_cast<const float2*>(rs); sc[i][h][0] = v.x; sc[i][h][1] = v.y; }
      if constexpr (NS == 4) {
        const float4 v = *reinterpret_cast<const float4*>(rs);
        sc[i][h][0] = v.x; sc[i][h][1] = v.y; sc[i][h][2] = v.z; sc[i][h][3] = v.w;
      }
    }
#pragma unroll
  for (int j = 0; j < TM; ++j) {
    const int col = wm * TM * 8 + 8 * j + 2 * t;  // tokens col, col + 1
    float2 sx = make_float2(0.f, 0.f);
    float4 s16 = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (KIND == 1) { sx = *reinterpret_cast<const float2*>(sxs + col); }
    if constexpr (KIND == 3) { s16 = sxs16[col / 2]; }  // (a, b) of col, then of col + 1
#pragma unroll
    for (int i = 0; i < TN; ++i) {
      float f[2][4];  // [half][element] (one half for KIND 0/1)
      if constexpr (KIND <= 1) {
        int ch[4], cl[4];
        mma_k32(ch, a[i], b[0][j][0], b[0][j][1]);
        mma_k32(cl, a[i], b[1][j][0], b[1][j][1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) f[0][e] = unbias2(ch[e], cl[e]);
      } else {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          int ch[4], cl[4];
          mma_k16(ch, a[i][2 * hf], a[i][2 * hf + 1], b[0][j][hf]);
          mma_k16(cl, a[i][2 * hf], a[i][2 * hf + 1], b[1][j][hf]);
#pragma unroll
          for (int e = 0; e < 4; ++e) f[hf][e] = unbias2(ch[e], cl[e]);
        }
      }
#if MMQ_ABLATE & 1
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] += f[0][e] + (KIND >= 2 ? f[1][e] : 0.0f);
#else
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // row g (h = 0) or g + 8
        const float* r = sc[i][h];
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // token col + e
          const int ei = 2 * h + e;
          float v = fmaf(f[0][ei], r[0], acc[i][j][ei]);
          if constexpr (KIND == 1) { v = fmaf(r[1], e ? sx.y : sx.x, v); }
          if constexpr (KIND >= 2) { v = fmaf(f[1][ei], r[1], v); }
          if constexpr (KIND == 3) {
            v = fmaf(r[2], e ? s16.z : s16.x, v);
            v = fmaf(r[3], e ? s16.w : s16.y, v);
          }
          acc[i][j][ei] = v;
        }
      }
#endif
    }
  }
}
