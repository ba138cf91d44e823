// Quantized matrix x a decode batch on the integer tensor cores:
//   out (M, N) f32 = x (M, K) f32 @ dequant(W)(N, K).T (+ bias[n]) (+ res[m, n]),  9 <= M <= 64,
// W = raw GGUF rows of a type of mmq.cu's set. Where the batch of a decode step (or a short
// prefill chunk) is past what the mat-vec kernels (mmvq.cu, M <= 8) do well and far below what
// the prefill GEMMs are tiled for: the step is bound by reading W once, so every weight byte is
// read once for all M columns, and read as the quantized bytes (0.56 bytes a weight for Q4_K,
// against the 2 of an f16 copy through cuBLAS).
//
// It is mmq.cu's GEMM with the unpack pass folded in: a CTA holds ALL the batch's tokens (one
// CTA along M), so each W block is decoded exactly once, straight into the shared-memory stage
// (mmq.cu keeps a separate unpack because for prefill every CTA along M would decode it again).
// Per K step (128 elements) each thread fetches one 64-element piece of one row into registers
// (mmq_decoders.cuh's Dec, the unpacker's decoder) a step ahead, and stores it decoded into the
// stage before the step's barrier; x's planes arrive by cp.async as in mmq.cu, and the mma
// chunk is mmq_tile.cuh's. Decode reads are the whole game, so the grid also splits K: small
// N (3584 rows = 56 CTAs of 64) would leave most SMs idle. Split partials go to `part`
// (splits x M x N f32) and mmq_split_sum adds them, the bias and the residual, in a fixed order
// (no atomics: a batch's tokens do not depend on the run).
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_mmq_small.py).
#include "pdl.cuh"
#include "mmq_decoders.cuh"
#include "mmq_tile.cuh"

// Grid (1, ceil(N / BN), splits); split z covers K steps [z*steps, (z+1)*steps). x: mmq.cu's
// quantized x for Mp >= round_up(M, BM) rows. part == nullptr: one split, out gets the bias and
// residual; else out is untouched and part[z][m][n] the split's sums.
template <int TYPE, int WN, int TM, int MINB, int STAGES, int PF>
__global__ void __launch_bounds__(WN * 32, MINB)
mmq_small(const u8* __restrict__ W, i64 row_bytes, int nb, int N, int M, int Mp, int Kp, int steps,
          const i8* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
          const float2* __restrict__ xs16, float* __restrict__ out, const float* __restrict__ bias,
          const float* __restrict__ res, float* __restrict__ part) {
  pdl_enter();
  typedef Dec<TYPE> D;
  constexpr int NS = D::NS, KIND = D::KIND, WM = 1, TN = 1;
  constexpr int NT = WN * 32, BN = 16 * TN * WN, BM = 8 * TM * WM;
  constexpr int PPT = BN * (BK / 64) / NT;  // 64-element pieces a thread decodes per step
  typedef Stage<BN, BM, NS, KIND> S;
  static_assert(TM % 2 == 0 && STAGES >= 2 && PPT * NT == BN * (BK / 64), "bad tiling");
  extern __shared__ __align__(16) u8 smem[];

  const int tid = threadIdx.x, lane = tid & 31, wn = tid >> 5;
  const int n0 = blockIdx.y * BN, z = blockIdx.z;
  const int s0 = z * steps, s1 = min(Kp / BK, s0 + steps);
  const u32 sbase = saddr(smem);

  // Piece q = tid + i*NT of a step: row q / 2, half q % 2 (two neighbouring threads read one
  // row's 128 elements). Rows past N decode row N-1 again; their sums are never stored.
  const u8* rowp[PPT];
#pragma unroll
  for (int i = 0; i < PPT; ++i) rowp[i] = W + (i64)min(n0 + (tid + i * NT) / 2, N - 1) * row_bytes;
  D dec[PF][PPT];  // PF steps of raw pieces in flight
  auto fetch = [&](int s, D (&d)[PPT]) {
#pragma unroll
    for (int i = 0; i < PPT; ++i) d[i].fetch(rowp[i], 2 * s + (tid + i * NT) % 2, nb);
  };
  auto store = [&](int s, int stage, const D (&d)[PPT]) {
    u8* st = smem + stage * S::BYTES;
#pragma unroll
    for (int i = 0; i < PPT; ++i) {
      const int q = tid + i * NT, r = q / 2, h = q % 2;
      d[i].store(st + S::W + r * ROWB + 64 * h, reinterpret_cast<float*>(st + S::WS) + (r * 4 + 2 * h) * NS, NS,
                 2 * s + h);
    }
  };
  XTiles<BM, NS, KIND, NT> xt;
  xt.template init_at<BN>(xq, xs, xs16, 0, Mp, Kp, tid);

  float acc[TN][TM][4];
#pragma unroll
  for (int j = 0; j < TM; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;

  // x: STAGES-1 steps in flight by cp.async (one commit group per step, maybe empty). W: the
  // registers hold the raw pieces of the PF steps after the one computing; a step's pieces are
  // decoded into its stage before the barrier that publishes it, and the registers refilled
  // with step s+PF's. That stage was last read at step s-STAGES <= s-2, which every thread
  // finished before the barrier of step s-1.
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) {
    if (s0 + k < s1) xt.issue(sbase + k * S::BYTES, s0 + k);
    cp_commit();
  }
#pragma unroll
  for (int p = 0; p < PF; ++p)
    if (s0 + p < s1) fetch(s0 + p, dec[p]);
  for (int sb = s0; sb < s1; sb += PF) {
#pragma unroll
    for (int p = 0; p < PF; ++p) {
      const int s = sb + p;
      if (s < s1) {
        const int stage = (s - s0) % STAGES;
        store(s, stage, dec[p]);
        if (s + PF < s1) fetch(s + PF, dec[p]);
        cp_wait<STAGES - 2>();
        __syncthreads();
        const int nx = s + STAGES - 1;
        if (nx < s1) xt.issue(sbase + ((nx - s0) % STAGES) * S::BYTES, nx);
        cp_commit();
        const u8* cur = smem + stage * S::BYTES;
#pragma unroll 1
        for (int c = 0; c < 4; ++c) mmq_chunk<NS, KIND, WN, WM, TN, TM>(cur, c, acc, lane, wn, 0);
      }
    }
  }

  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < TM; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = n0 + wn * 16 + g + 8 * (e >> 1);
      const int m = 8 * j + 2 * t + (e & 1);
      if (n >= N || m >= M) continue;
      const float v = acc[0][j][e] * __ldg(xd + m);
      if (part) {
        part[((i64)z * M + m) * N + n] = v;
      } else {
        const i64 o = (i64)m * N + n;
        out[o] = v + (bias ? __ldg(bias + n) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
      }
    }
}

// out[m, n] = sum_z part[z][m][n] (z in order) + bias[n] + res[m, n]; one thread an element.
extern "C" __global__ void __launch_bounds__(256)
mmq_split_sum(const float* __restrict__ part, int splits, int M, int N, const float* __restrict__ bias,
              const float* __restrict__ res, float* __restrict__ out) {
  pdl_enter();
  const i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x, MN = (i64)M * N;
  if (o >= MN) return;
  float v = 0.0f;
  for (int z = 0; z < splits; ++z) v += __ldg(part + z * MN + o);
  out[o] = v + (bias ? __ldg(bias + o % N) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
}
