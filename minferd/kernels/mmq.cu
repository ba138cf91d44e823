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
#include "pdl.cuh"
#include "mmq_decoders.cuh"
#include "mmq_tile.cuh"
#include "mmq_xquant.cuh"


// ---------------------------------------------------------------------------------------
// W rows [0, N) -> wq int8 [N][Kp] and ws f32 [N][Kp/32][NS]; one thread one 64-element piece
// (consecutive threads: consecutive pieces of a row, so loads and stores coalesce). Chunks past
// the last block get zero scales (the decoders' ok flags). The GEMM reads rows up to a multiple
// of 128: those past N hold whatever was there, and their results are never stored.
template <int TYPE>
__global__ void __launch_bounds__(256)
mmq_unpack(const u8* __restrict__ W, i64 row_bytes, int N, int nb, int Kp, i8* __restrict__ wq,
           float* __restrict__ ws) {
  pdl_enter();
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
// out[m, n] (row stride ldo) = sum_k x[m, k] W[n, k] for m < M, n < N. Grid (ceil(M/BM),
// ceil(N/BN)). wq/ws: mmq_unpack's arrays, rows up to the grid's; x: the quantizer's arrays
// for Mp rows and Kp columns (xd: the rows' scales; xs/xs16: the two-plane sums).
template <int NS, int KIND, int WN, int WM, int TN, int TM, int MINB, int STAGES>
__global__ void __launch_bounds__(WN * WM * 32, MINB)
mmq_gemm(const i8* __restrict__ wq, const float* __restrict__ ws, int N, int M, int Mp, int Kp,
         const i8* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
         const float2* __restrict__ xs16, float* __restrict__ out, i64 ldo) {
  pdl_enter();
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
  const float* ssrc = ws + (i64)(n0 + sr) * (Kp / 32) * NS + 4 * sq;
  const i64 spass = (i64)(NT / NS) * (Kp / 32) * NS;
  const u32 sbase = saddr(smem);
  const u32 dw = S::W + rq * ROWB + 16 * cq, dws = S::WS + 16 * tid;
  XTiles<BM, NS, KIND, NT> xt;
  xt.template init_at<BN>(xq, xs, xs16, m0, Mp, Kp, tid);
  auto load = [&](int s, int stage) {
    const u32 st = sbase + stage * S::BYTES;
    const i64 k0 = (i64)s * BK;
#pragma unroll
    for (int i = 0; i < BN / RPS; ++i) cp16(st + dw + i * RPS * ROWB, wsrc + i * pass + k0, 16);
    xt.issue(st, s);
#pragma unroll
    for (int i = 0; i < WSC; ++i) {
      if (WSC * NT == BN * NS || tid + i * NT < BN * NS) {
        cp16(st + dws + i * NT * 16, ssrc + i * spass + 4 * NS * s, 16);
      }
    }
  };

  float acc[TN][TM][4];
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

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
    for (int c = 0; c < 4; ++c) mmq_chunk<NS, KIND, WN, WM, TN, TM>(cur, c, acc, lane, wn, wm);
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
