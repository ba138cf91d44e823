// Quantized prefill GEMM (llama.cpp's MMQ idea on integer tensor cores):
//   out (M, N) f32 = x (M, K) f32 @ dequant(W)(N, K).T,  W = raw GGUF rows of a quantized type.
//
// 1. mmq_quantize_x: x -> int8 per 32 elements: a scale d = amax/127 and TWO planes,
//    x ~= d * (hi + lo/128) (hi = rint(x/d), lo = rint of the residual in 1/128 steps), plus
//    per block the sums of the quantized values (whole block, and each 16-element half) for
//    the min terms. Rows are padded to a multiple of 128 and K to a multiple of 128 with zeros,
//    so the GEMM never bounds-checks x. One plane (llama.cpp's q8_1) measured 0.5-0.75%
//    relative error on the tests' random data (numpy emulation of exactly this scheme): under
//    the 1e-2 contract but without much margin, and real activations have outliers. The second
//    plane costs one more mma per tile and one FMA per output element per 32-chunk; the kernel
//    is templated on PLANES so a one-plane variant can be measured (bench/mmq.py --planes).
//    The sums match the planes used (hi only, or hi + lo/128): then the result is exactly
//    x_quantized . dequant(W), whose error is ||x - x_q|| sized, not amplified by the mins.
//
// 2. mmq<TYPE, WN, WM, TN, TM, PLANES>: a CTA computes a BN x BM tile of out^T (BN = 16*TN*WN
//    weight rows, BM = 8*TM*WM tokens) with WN x WM warps, each a (16*TN) x (8*TM) sub-tile
//    of m16n8k32 s8 mma tiles (A = weights, row-major 16 x 32; B = x, "col" = each token's K
//    run). K advances 128 elements per step (4 chunks of 32) through two shared-memory stages:
//      - x (already int8) arrives by cp.async 16-byte copies, issued a step ahead;
//      - W blocks are read from global memory into registers one step ahead (each thread one
//        64-element "piece" of one row: half a 32-block pair or a quarter super-block),
//        decoded to int8 (signed where the type has a fixed offset, as Q4_0's q-8, so no
//        offset term is needed) and per-chunk float scales, and stored to the other stage
//        after this step's chunks are done, so the loads' latency hides behind the mmas.
//        Weight loads are only as wide as blocks.cuh's alignment table allows (u16 pairs for
//        the 2-aligned types: a tensor may start on an odd block).
//    Per 32-chunk every tile's int32 dot products are turned into f32 and scaled:
//        acc += dx[tok] * (dw[row] * C + mn[row] * S[tok])
//    (dw = the weight sub-block scale, mn = its min coefficient where the type has one, S =
//    the token's quantized-x sum over the chunk). Q2_K/Q3_K/Q6_K have a scale per 16 elements:
//    they run two m16n8k16 mmas per chunk (the same A/B registers split in halves) and scale
//    each half. int32 -> f32 uses the magic-number trick folded into the mma: the accumulator
//    starts at the bits of 1.5*2^23, so the mma leaves float bits of 1.5*2^23 + C and one FADD
//    recovers C exactly (|C| < 2^22 for every type: Q8_0's 32*128*127 is the largest; the
//    I2F instruction runs at 1/8 of the FMA rate on sm_90 and would be the bottleneck).
//    Fragments come from shared memory by ldmatrix (int8 k32 tiles are b16 8x8 matrices);
//    rows are padded to 144 bytes so the 8 row addresses of each matrix hit distinct banks.
//
// Wgmma (sm_90a) is deliberately not used: the module is compiled for plain sm_90.
#include "mma.cuh"
#include "mmq_decoders.cuh"

#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f  // 1.5 * 2^23

constexpr int BK = 128;          // K elements per pipeline step (4 chunks of 32)
constexpr int ROWB = BK + 16;    // bytes per smem row (padding: conflict-free ldmatrix)
constexpr int MP_ALIGN = 128;    // x rows are padded to this (the largest BM)

// ---------------------------------------------------------------------------------------
// x quantizer. Thread = 8 consecutive elements, 4 threads = one 32-block. Writes, for x rows
// m < Mp (rows >= M and columns >= K are zeros):
//   xq  int8 [2][Mp][Kp]      plane 0 = hi, plane 1 = lo (x ~= d*(hi + lo/128))
//   xd  f32  [Kp/32][Mp]      d (block-major so a tile's scales are contiguous: cp.async)
//   xs  f32  [2][Kp/32][Mp]   sum of the block's quantized values: [0] hi only, [1] hi + lo/128
//   xs16 f32x2 [2][Kp/32][Mp] the same per 16-element half (Q2_K's mins)
extern "C" __global__ void __launch_bounds__(256)
mmq_quantize_x(const float* __restrict__ x, int M, int K, int Mp, int Kp, i8* __restrict__ xq,
               float* __restrict__ xd, float* __restrict__ xs, float2* __restrict__ xs16) {
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
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
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
    const int kb = k >> 5;
    const i64 nkb = Kp >> 5, i = (i64)kb * Mp + m, pl = nkb * Mp;
    xd[i] = d;
    const float a1 = (float)hhi, b1 = (float)ohi;
    const float a2 = a1 + (float)hlo * (1.0f / 128.0f), b2 = b1 + (float)olo * (1.0f / 128.0f);
    xs[i] = a1 + b1;
    xs[pl + i] = (float)(hhi + ohi) + (float)(hlo + olo) * (1.0f / 128.0f);
    xs16[i] = make_float2(a1, b1);
    xs16[pl + i] = make_float2(a2, b2);
  }
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
// The f32 value of a MAGIC-biased accumulator (one plane), or hi + lo/128 (two planes): the
// FADD constant folds both biases, and the FMA rounds once.
__device__ __forceinline__ float unbias1(int h) { return __int_as_float(h) - MAGIC_F; }
__device__ __forceinline__ float unbias2(int h, int l) {
  return fmaf(__int_as_float(l), 1.0f / 128.0f, __int_as_float(h) - (MAGIC_F + MAGIC_F / 128.0f));
}

// Shared-memory stage layout (bytes), shared with mmq.py's smem_bytes().
template <int BN, int BM, int NS, int KIND, int PLANES> struct Stage {
  static constexpr int W = 0;                                  // int8 [BN][ROWB]
  static constexpr int X = W + BN * ROWB;                      // int8 [PLANES][BM][ROWB]
  static constexpr int WS = X + PLANES * BM * ROWB;            // f32 [4][BN][NS]
  static constexpr int XD = WS + 4 * BN * NS * 4;              // f32 [4][BM]
  static constexpr int XS = XD + 4 * BM * 4;                   // f32 [4][BM] (KIND 1)
  static constexpr int XS16 = XS + (KIND == 1 ? 4 * BM * 4 : 0);  // f32x2 [4][BM] (KIND 3)
  static constexpr int BYTES = XS16 + (KIND == 3 ? 4 * BM * 8 : 0);
};

// out[m, n] = sum_k x[m, k] W[n, k] for m < M, n < N. Grid (ceil(M/BM), ceil(N/BN)).
// W: N rows of row_bytes (nb blocks). x: the quantizer's arrays for Mp rows and Kp columns;
// xs/xs16 point at the plane-PLANES sums.
template <int TYPE, int WN, int WM, int TN, int TM, int PLANES>
__global__ void __launch_bounds__(WN * WM * 32, 1)
mmq(const u8* __restrict__ W, i64 row_bytes, int N, int nb, int M, int Mp, int Kp,
    const i8* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
    const float2* __restrict__ xs16, float* __restrict__ out) {
  typedef Dec<TYPE> D;
  constexpr int NT = WN * WM * 32, BN = 16 * TN * WN, BM = 8 * TM * WM;
  constexpr int NS = D::NS, KIND = D::KIND, PP = BN * 2 / NT;  // pieces per thread per step
  typedef Stage<BN, BM, NS, KIND, PLANES> S;
  static_assert(BN * 2 % NT == 0 && PP >= 1 && 4 % PP == 0, "pieces must split evenly");
  static_assert(TM % 2 == 0, "B fragments load two n8 tiles at a time");
  static_assert(MP_ALIGN % BM == 0, "x rows are padded for whole BM tiles");
  extern __shared__ __align__(16) u8 smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp / WM, wm = warp % WM, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int nsteps = Kp / BK;
  const i64 plane = (i64)Mp * Kp;

  // this thread's pieces: row r = idx/2 of the tile, local piece lp = idx%2 (elements 64lp..)
  const u8* prow[PP];
  int pr[PP], plp[PP];
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const int idx = tid + i * NT;
    pr[i] = idx >> 1;
    plp[i] = idx & 1;
    prow[i] = W + (i64)min(n0 + pr[i], N - 1) * row_bytes;  // tail rows: any valid row, discarded
  }

  auto load_x = [&](int s, u8* st) {  // cp.async of x's step-s tile into stage st
    const int k0 = s * BK;
#pragma unroll
    for (int idx = tid; idx < PLANES * BM * (BK / 16); idx += NT) {
      const int pl = idx / (BM * (BK / 16)), rem = idx % (BM * (BK / 16)), r = rem / (BK / 16), q = rem % (BK / 16);
      cp16(saddr(st + S::X + (pl * BM + r) * ROWB + 16 * q), xq + pl * plane + (i64)(m0 + r) * Kp + k0 + 16 * q, 16);
    }
    const int kb0 = k0 / 32;
    for (int idx = tid; idx < BM; idx += NT) {  // 4 chunks x BM/4 float4
      const int c = idx / (BM / 4), q = idx % (BM / 4);
      cp16(saddr(st + S::XD + (c * BM + 4 * q) * 4), xd + (i64)(kb0 + c) * Mp + m0 + 4 * q, 16);
      if constexpr (KIND == 1)
        cp16(saddr(st + S::XS + (c * BM + 4 * q) * 4), xs + (i64)(kb0 + c) * Mp + m0 + 4 * q, 16);
    }
    if constexpr (KIND == 3) {
      for (int idx = tid; idx < 2 * BM; idx += NT) {  // 4 chunks x BM/2 float4
        const int c = idx / (BM / 2), q = idx % (BM / 2);
        cp16(saddr(st + S::XS16 + (c * BM + 2 * q) * 8), xs16 + (i64)(kb0 + c) * Mp + m0 + 2 * q, 16);
      }
    }
    cp_commit();
  };
  auto store_piece = [&](const D& dec, int i, int s, u8* st) {
    float* ws = reinterpret_cast<float*>(st + S::WS) + (2 * plp[i] * BN + pr[i]) * NS;
    dec.store(st + S::W + pr[i] * ROWB + 64 * plp[i], ws, BN * NS, 2 * s + plp[i]);
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
    u32 a[TN][4], b[PLANES][TM][2];
    const u32 sw = saddr(st + S::W), sx = saddr(st + S::X);
#pragma unroll
    for (int i = 0; i < TN; ++i) {
      const int r = wn * TN * 16 + 16 * i + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldsm4(sw + r * ROWB + 32 * c + (lane >> 4) * 16, a[i][0], a[i][1], a[i][2], a[i][3]);
    }
#pragma unroll
    for (int pl = 0; pl < PLANES; ++pl)
#pragma unroll
      for (int jj = 0; jj < TM / 2; ++jj) {
        const int r = wm * TM * 8 + 16 * jj + (lane & 7) + (lane >> 4) * 8;
        ldsm4(sx + (pl * BM + r) * ROWB + 32 * c + ((lane >> 3) & 1) * 16,
                b[pl][2 * jj][0], b[pl][2 * jj][1], b[pl][2 * jj + 1][0], b[pl][2 * jj + 1][1]);
      }
    const float* ws = reinterpret_cast<const float*>(st + S::WS) + c * BN * NS;
    const float* sxd = reinterpret_cast<const float*>(st + S::XD) + c * BM;
    const float* sxs = reinterpret_cast<const float*>(st + S::XS) + c * BM;
    const float4* sxs16 = reinterpret_cast<const float4*>(st + S::XS16) + c * BM / 2;
    float sc[TN][2][NS];  // row scales of rows g (h = 0) and g + 8 of each 16-row tile
#pragma unroll
    for (int i = 0; i < TN; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* rs = ws + (wn * TN * 16 + 16 * i + g + 8 * h) * NS;
        if constexpr (NS == 1) sc[i][h][0] = rs[0];
        if constexpr (NS == 2) { const float2 v = *reinterpret_cast<const float2*>(rs); sc[i][h][0] = v.x; sc[i][h][1] = v.y; }
        if constexpr (NS == 4) {
          const float4 v = *reinterpret_cast<const float4*>(rs);
          sc[i][h][0] = v.x; sc[i][h][1] = v.y; sc[i][h][2] = v.z; sc[i][h][3] = v.w;
        }
      }
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      const int col = wm * TM * 8 + 8 * j + 2 * t;  // tokens col, col + 1
      const float2 dx = *reinterpret_cast<const float2*>(sxd + col);
      float2 sx = make_float2(0.f, 0.f);
      float4 s16 = make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (KIND == 1) sx = *reinterpret_cast<const float2*>(sxs + col);
      if constexpr (KIND == 3) s16 = sxs16[col / 2];  // (a, b) of col, then of col + 1
#pragma unroll
      for (int i = 0; i < TN; ++i) {
        float f[2][4];  // [half][element] (one half for KIND 0/1)
        if constexpr (KIND <= 1) {
          int ch[4];
          mma_k32(ch, a[i], b[0][j][0], b[0][j][1]);
          if constexpr (PLANES == 2) {
            int cl[4];
            mma_k32(cl, a[i], b[1][j][0], b[1][j][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) f[0][e] = unbias2(ch[e], cl[e]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) f[0][e] = unbias1(ch[e]);
          }
        } else {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            int ch[4];
            mma_k16(ch, a[i][2 * hf], a[i][2 * hf + 1], b[0][j][hf]);
            if constexpr (PLANES == 2) {
              int cl[4];
              mma_k16(cl, a[i][2 * hf], a[i][2 * hf + 1], b[1][j][hf]);
#pragma unroll
              for (int e = 0; e < 4; ++e) f[hf][e] = unbias2(ch[e], cl[e]);
            } else {
#pragma unroll
              for (int e = 0; e < 4; ++e) f[hf][e] = unbias1(ch[e]);
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // row g (h = 0) or g + 8
          const float* r = sc[i][h];
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // token col + e
            const int ei = 2 * h + e;
            float tt;
            if constexpr (KIND == 0) tt = f[0][ei] * r[0];
            if constexpr (KIND == 1) tt = fmaf(r[1], e ? sx.y : sx.x, f[0][ei] * r[0]);
            if constexpr (KIND == 2) tt = fmaf(f[1][ei], r[1], f[0][ei] * r[0]);
            if constexpr (KIND == 3) {
              tt = fmaf(f[1][ei], r[1], f[0][ei] * r[0]);
              tt = fmaf(r[2], e ? s16.z : s16.x, tt);
              tt = fmaf(r[3], e ? s16.w : s16.y, tt);
            }
            acc[i][j][ei] = fmaf(tt, e ? dx.y : dx.x, acc[i][j][ei]);
          }
        }
      }
    }
  };

  // prologue: step 0 into stage 0
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    D dec;
    dec.fetch(prow[i], plp[i], nb);
    store_piece(dec, i, 0, smem);
  }
  load_x(0, smem);
  cp_wait<0>();
  __syncthreads();

  for (int s = 0; s < nsteps; ++s) {
    u8* cur = smem + (s & 1) * S::BYTES;
    u8* nxt = smem + ((s + 1) & 1) * S::BYTES;
    const bool more = s + 1 < nsteps;
    if (more) load_x(s + 1, nxt);
#pragma unroll
    for (int ph = 0; ph < PP; ++ph) {
      D dec;
      if (more) dec.fetch(prow[ph], 2 * (s + 1) + plp[ph], nb);
#pragma unroll 1
      for (int c = ph * (4 / PP); c < (ph + 1) * (4 / PP); ++c) chunk(cur, c);
      if (more) store_piece(dec, ph, s + 1, nxt);
    }
    cp_wait<0>();
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + wn * TN * 16 + 16 * i + g + 8 * (e >> 1);
        const int m = m0 + wm * TM * 8 + 8 * j + 2 * t + (e & 1);
        if (n < N && m < M) out[(i64)m * N + n] = acc[i][j][e];
      }
}
