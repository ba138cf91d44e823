// Quantized prefill GEMM (llama.cpp's MMQ idea on integer tensor cores):
//   out (M, N) f32 = x (M, K) f32 @ dequant(W)(N, K).T,  W = raw GGUF rows of a quantized type.
//
// 1. mmq_row_scale + mmq_quantize_x: x -> int8 with ONE scale per token row, d = amax/127,
//    and TWO planes, x ~= d * (hi + lo/128) (hi = rint(x/d), lo = rint of the residual in
//    1/128 steps), plus per 32-block the sums of the quantized values (whole block, and each
//    16-element half) for the min terms. One scale a row takes d out of the K loop: the kernel
//    sums w-scaled integer dot products and multiplies by d once, at the end. Two planes per
//    row cost the real gemma3 1.2e-3..1.4e-3 relative logit error, top-1 100%
//    (bench/activation_planes.py; one plane per 32, llama.cpp's q8_1: 4e-2 and 85-92%). The
//    sums are of hi + lo/128, so the result is exactly x_quantized . dequant(W), whose error is
//    ||x - x_q|| sized, not amplified by the mins. Rows are padded to a multiple of 128 and K to
//    a multiple of 128 with zeros, so the GEMM never bounds-checks x. (mmq_xquant.cuh)
//
// 2. mmq_unpack<TYPE>: a slice of W's rows is decoded once, before the GEMM, into int8 values
//    wq [N][Kp] (signed where the type has a fixed offset, as Q4_0's q-8, so no offset term is
//    needed) and per-32-chunk float scales ws [N][Kp/32][NS] (with min coefficients where the
//    type has them), by mmq_decoders.cuh, one thread a 64-element piece. Decoding inside the
//    GEMM's K loop instead cost 10% (Q4_K) to 33% (Q6_K) of its time on the H200
//    (bench/mmq_probe.py, 2026-11-30): every CTA along M decoded the same blocks again. The
//    unpacked slice is transient scratch (mmq.py sizes the slices, 1.25 bytes a weight).
//
// 3. mmq_gemm<NS, KIND, WN, WM, TN, TM, MINB, STAGES>: a CTA computes a BN x BM tile of out^T
//    (BN = 16*TN*WN weight rows, BM = 8*TM*WM tokens) with WN x WM warps, each a (16*TN) x (8*TM)
//    sub-tile of m16n8k32 s8 mma tiles (A = weights, row-major 16 x 32; B = x, "col" = each
//    token's K run). K advances 128 elements per step (4 chunks of 32) through STAGES shared-
//    memory stages, each filled by cp.async 16-byte copies (weights, their scales, x's planes
//    and sums) issued STAGES-1 steps ahead. Per 32-chunk every tile's int32 dot products are
//    turned into f32 and scaled:
//        acc += dw[row] * C + mn[row] * S[tok],   and at the end out = d[tok] * acc
//    (dw = the weight sub-block scale, mn = its min coefficient where the type has one, S = the
//    token's quantized-x sum over the chunk, d = the token's x scale). Q2_K/Q3_K/Q6_K have a
//    scale per 16 elements: two m16n8k16 mmas per chunk (the same A/B registers split in
//    halves), each half scaled. int32 -> f32 uses the magic-number trick folded into the mma:
//    the accumulator starts at the bits of 1.5*2^23, so the mma leaves float bits of
//    1.5*2^23 + C and one FADD recovers C exactly (|C| < 2^22 for every type: Q8_0's 32*128*127
//    is the largest; I2F runs at 1/8 of the FMA rate on sm_90). Fragments come from shared
//    memory by ldmatrix (int8 k32 tiles are b16 8x8 matrices); rows are padded to 144 bytes so
//    the 8 row addresses of each matrix hit distinct banks.
//
// Wgmma (sm_90a) is deliberately not used: the module is compiled for plain sm_90.
#include "mma.cuh"
#include "mmq_decoders.cuh"
#include "mmq_xquant.cuh"

#ifndef MMQ_ABLATE
#define MMQ_ABLATE 0  // bench/mmq_probe.py: 1 = the per-chunk epilogue cut to the mmas' unbias
#endif
#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f  // 1.5 * 2^23

constexpr int BK = 128;          // K elements per pipeline step (4 chunks of 32)
constexpr int ROWB = BK + 16;    // bytes per smem row (padding: conflict-free ldmatrix)
constexpr int MP_ALIGN = 128;    // x rows and unpacked W rows are padded to this (the largest BM, BN)

// ---------------------------------------------------------------------------------------
// W rows [0, N) -> wq int8 [N][Kp] and ws f32 [N][Kp/32][NS]; one thread one 64-element piece
// (consecutive threads: consecutive pieces of a row, so loads and stores coalesce). Chunks past
// the last block get zero scales (the decoders' ok flags). The GEMM reads rows up to a multiple
// of 128: those past N hold whatever was there, and their results are never stored.
template <int TYPE>
__global__ void __launch_bounds__(256)
mmq_unpack(const u8* __restrict__ W, i64 row_bytes, int N, int nb, int Kp, i8* __restrict__ wq,
           float* __restrict__ ws) {
  typedef Dec<TYPE> D;
  const int npieces = Kp >> 6;
  const i64 gt = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (gt >= (i64)N * npieces) return;
  const int n = (int)(gt / npieces), P = (int)(gt % npieces);
  D dec;
  dec.fetch(W + (i64)n * row_bytes, P, nb);
  dec.store(reinterpret_cast<u8*>(wq) + (i64)n * Kp + 64 * P, ws + ((i64)n * (Kp >> 5) + 2 * P) * D::NS, D::NS, P);
}

// ---------------------------------------------------------------------------------------
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

// out[m, n] (row stride ldo) = sum_k x[m, k] W[n, k] for m < M, n < N. Grid (ceil(M/BM),
// ceil(N/BN)). wq/ws: mmq_unpack's arrays, rows up to the grid's; x: the quantizer's arrays
// for Mp rows and Kp columns (xd: the rows' scales; xs/xs16: the two-plane sums).
template <int NS, int KIND, int WN, int WM, int TN, int TM, int MINB, int STAGES>
__global__ void __launch_bounds__(WN * WM * 32, MINB)
mmq_gemm(const i8* __restrict__ wq, const float* __restrict__ ws, int N, int M, int Mp, int Kp,
         const i8* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
         const float2* __restrict__ xs16, float* __restrict__ out, i64 ldo) {
  constexpr int NT = WN * WM * 32, BN = 16 * TN * WN, BM = 8 * TM * WM;
  typedef Stage<BN, BM, NS, KIND> S;
  static_assert(TM % 2 == 0, "B fragments load two n8 tiles at a time");
  static_assert(MP_ALIGN % BM == 0 && MP_ALIGN % BN == 0, "x and W rows are padded for whole tiles");
  static_assert(STAGES >= 2, "a stage is filled while another is read");
  extern __shared__ __align__(16) u8 smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp / WM, wm = warp % WM, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int nsteps = Kp / BK;
  const i64 plane = (i64)Mp * Kp;

  // Step s's tiles into a stage: every copy is 16 bytes, every source 16-aligned. A thread's
  // copies sit at the same places in every step, so their addresses are worked out once here
  // and only advanced by the step (recomputed per copy, they were a third of the kernel's
  // instructions).
  constexpr int CPR = BK / 16, RPS = NT / CPR;  // copies per row and step; rows per pass of the CTA
  static_assert(BN % RPS == 0 && BM % RPS == 0 && NT % NS == 0 && 2 * BM <= NT, "whole passes");
  constexpr int WSC = (BN * NS + NT - 1) / NT;  // passes over the scales (NS float4 a row and step)
  const int rq = tid / CPR, cq = tid % CPR, sr = tid / NS, sq = tid % NS;
  const i64 pass = (i64)RPS * Kp;
  const i8* wsrc = wq + (i64)(n0 + rq) * Kp + 16 * cq;
  const i8* xsrc = xq + (i64)(m0 + rq) * Kp + 16 * cq;
  const float* ssrc = ws + (i64)(n0 + sr) * (Kp / 32) * NS + 4 * sq;
  const i64 spass = (i64)(NT / NS) * (Kp / 32) * NS;
  const int xc = tid / (BM / 4), xq4 = tid % (BM / 4), yc = tid / (BM / 2), yq = tid % (BM / 2);
  const float* xssrc = xs + (i64)xc * Mp + m0 + 4 * xq4;
  const float2* x16src = xs16 + (i64)yc * Mp + m0 + 2 * yq;
  const u32 sbase = saddr(smem);
  const u32 dw = S::W + rq * ROWB + 16 * cq, dx = S::X + rq * ROWB + 16 * cq, dws = S::WS + 16 * tid;
  const u32 dxs = S::XS + (xc * BM + 4 * xq4) * 4, dx16 = S::XS16 + (yc * BM + 2 * yq) * 8;
  auto load = [&](int s, int stage) {
    const u32 st = sbase + stage * S::BYTES;
    const i64 k0 = (i64)s * BK;
#pragma unroll
    for (int i = 0; i < BN / RPS; ++i) cp16(st + dw + i * RPS * ROWB, wsrc + i * pass + k0, 16);
#pragma unroll
    for (int pl = 0; pl < 2; ++pl)
#pragma unroll
      for (int i = 0; i < BM / RPS; ++i)
        cp16(st + dx + (pl * BM + i * RPS) * ROWB, xsrc + pl * plane + i * pass + k0, 16);
#pragma unroll
    for (int i = 0; i < WSC; ++i) {
      if (WSC * NT == BN * NS || tid + i * NT < BN * NS) {
        cp16(st + dws + i * NT * 16, ssrc + i * spass + 4 * NS * s, 16);
      }
    }
    // Braces on every `if constexpr`: NVCC 13.0 dropped the statements after a discarded
    // `if constexpr` whose body was an unbraced for loop (the copies that followed vanished).
    if constexpr (KIND == 1) {
      if (tid < BM) { cp16(st + dxs, xssrc + (i64)4 * s * Mp, 16); }  // 4 chunks x BM/4 float4
    }
    if constexpr (KIND == 3) {
      if (tid < 2 * BM) { cp16(st + dx16, x16src + (i64)4 * s * Mp, 16); }  // 4 chunks x BM/2 float4
    }
  };

  float acc[TN][TM][4];
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // one 32-chunk c of the stage st
  auto chunk = [&](const u8* st, int c) {
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
  };

  // The classic multistage loop: STAGES-1 steps in flight; a stage is refilled only after the
  // barrier that follows its last read. Every iteration commits a group (maybe empty) so
  // wait_group<STAGES-2> always means "step s has landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nsteps) load(s, s);
    cp_commit();
  }
  for (int s = 0; s < nsteps; ++s) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    const int nx = s + STAGES - 1;
    if (nx < nsteps) load(nx, nx % STAGES);
    cp_commit();
    const u8* cur = smem + (s % STAGES) * S::BYTES;
#pragma unroll 1
    for (int c = 0; c < 4; ++c) chunk(cur, c);
  }

#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + wn * TN * 16 + 16 * i + g + 8 * (e >> 1);
        const int m = m0 + wm * TM * 8 + 8 * j + 2 * t + (e & 1);
        if (n < N && m < M) out[(i64)m * ldo + n] = acc[i][j][e] * __ldg(xd + m);
      }
}
