// The rmsnorm between two decode mat-vecs, folded into both (the pending path deferred_norm).
// rmsnorm(x) * w = (x * w) * inv with inv = 1 / sqrt(mean(x^2) + eps), one scalar a column, so:
// - the mat-vec that writes x (attn_output, ffn_down: x = W.a + residual) also leaves x * w in
//   the mat-vec format (xquant.cuh) and each 32-element block's sum of squares of x;
// - the mat-vecs that read the norm (q/k/v, gate/up, the output) add those block sums up in one
//   fixed order (every CTA gets the same inv) and scale their dot products by inv.
// The norm's own graph node (rmsnorm_q: 2-5 us at the 0.5B's and 7B's widths, 49-57 a token)
// goes, and no CTA waits on another: a block of 32 rows is finished by the CTA whose rows
// complete it (a counter a block, counted in rows, set back to 0 by that CTA for the next launch;
// launches on one stream never overlap, pdl_enter waits for the node before).
// Not the unfused bits: x * w is quantized where rmsnorm_q quantizes x * inv * w.
// Included by mmvq.cu after warp_sum and xquant.cuh.
#pragma once

// Column c's inv from its block sums ss (kbp a column, K / 32 blocks): the whole warp calls,
// every lane gets it; lanes add strided blocks, then the shuffle tree: one order everywhere.
__device__ __forceinline__ float norm_inv(const float* __restrict__ ss, int c, int kbp, int K, float eps) {
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
  for (int b = lane; b < K / 32; b += 32) s += ss[(i64)c * kbp + b];
  return 1.0f / sqrtf(warp_sum(s) / K + eps);
}

// The scale as a mat-vec warp gets it: one column's block sums are fetched when the warp starts
// (NC == 1 and K <= 32 * 32 * PRE: every dense preset here), so the scale at its end waits on no
// load (a dependent L2 read at the end of every CTA would lengthen each wave of the launch);
// else norm_inv at the end. Both add in norm_inv's order: the same bits.
template <int NC>
struct NormScale {
  static constexpr int PRE = 4;
  float pre[PRE];
  bool early;
  __device__ __forceinline__ void start(const float* __restrict__ ss, int K) {
    const int lane = threadIdx.x & 31;
    early = NC == 1 && ss && K <= 32 * 32 * PRE;
#pragma unroll
    for (int j = 0; j < PRE; ++j) pre[j] = early && lane + 32 * j < K / 32 ? ss[lane + 32 * j] : 0.0f;
  }
  __device__ __forceinline__ float inv(const float* __restrict__ ss, int c, int kbp, int K, float eps) const {
    if (!early) return norm_inv(ss, c, kbp, K, eps);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < PRE; ++j) s += pre[j];  // + 0.0f past the last block: exact
    return 1.0f / sqrtf(warp_sum(s) / K + eps);
  }
};

// After a CTA stored out's rows [row_lo, row_lo + ROWS) (< nrows) of every column: count them into
// their blocks' counters; the CTA that completes a block quantizes out * w of it into xq / xds
// (the layout of a (ncols, nrows) x) and writes its sum of squares to ss. nrows % 32 == 0.
// Every thread of the CTA calls.
template <int ROWS, int NW>
__device__ __forceinline__ void norm_blocks(const float* out, int nrows, int ncols, int row_lo,
                                            unsigned* __restrict__ cnt, const float* __restrict__ w,
                                            i8* __restrict__ xq, float2* __restrict__ xds,
                                            float* __restrict__ ss, int kbp) {
  constexpr int NB = ROWS / 32 + 2;  // blocks a CTA's rows can touch
  __shared__ int finish[NB];
  const int row_hi = min(row_lo + ROWS, nrows), b_lo = row_lo >> 5, nb = ((row_hi - 1) >> 5) - b_lo + 1;
  __threadfence();  // this thread's stores of out before the counters say they are there
  __syncthreads();
  if (threadIdx.x < nb) {
    const int b = b_lo + threadIdx.x;
    const unsigned mine = min(row_hi, 32 * b + 32) - max(row_lo, 32 * b);
    finish[threadIdx.x] = atomicAdd(cnt + b, mine) + mine == 32u;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = warp; j < nb; j += NW) {
    if (!finish[j]) continue;
    const int b = b_lo + j;
    __threadfence();
    for (int c = 0; c < ncols; ++c) {
      const float v = __ldcg(out + (i64)c * nrows + 32 * b + lane);  // other CTAs' rows: from L2
      const float sq = warp_sum(v * v);
      quantize_block32(v * w[32 * b + lane], lane, xq + (i64)c * 2 * nrows + 32 * b, nrows, xds + (i64)c * kbp + b);
      if (lane == 0) ss[(i64)c * kbp + b] = sq;
    }
    if (lane == 0) cnt[b] = 0u;
  }
}
