// Mixture-of-experts routing on the device, so that an MoE layer reads nothing back on the host:
// a decode step can be captured in a CUDA graph (the experts' products are mmvq.cu's mmvq_ids),
// and a prefill lays its picks out for the grouped GEMMs with no round trip (moe_count,
// moe_place). CPU references: backend/moe.py's route and align, and by_expert for the whole MLP.
#include "pdl.cuh"
#include "picks_sum.cuh"
#include "topk.cuh"

// logits (n, E) -> ids (n, k), weights (n, k): topk.cuh's topk_token, one CTA per token.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
moe_topk(const float* __restrict__ logits, int E, int k, int norm, int* __restrict__ ids, float* __restrict__ wts) {
  pdl_enter();
  const int t = blockIdx.x;
  topk_token(logits + (long long)t * E, E, k, norm, ids + t * k, wts + t * k);
}

// topk.cuh's topk_token_warp: one warp a token, 4 tokens a CTA (E <= 32 * TOPK_WARP_PER).
extern "C" __global__ void __launch_bounds__(128)
moe_topk_warp(const float* __restrict__ logits, int n, int E, int k, int norm, int* __restrict__ ids,
              float* __restrict__ wts) {
  pdl_enter();
  const int t = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (t >= n) return;  // whole warps leave together
  topk_token_warp(logits + (long long)t * E, E, k, norm, ids + t * k, wts + t * k);
}

// out (n, H) = res (n, H, or none) + sum_j wts[t*k + j] * y[t*k + j, :], the picks in order.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ wts, int n, int k, int H,
                                       const float* __restrict__ res, float* __restrict__ out) {
  pdl_enter();
  const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= (long long)n * H) return;
  out[o] = picks_sum(y, wts, res, (int)(o / H), k, H, (int)(o % H));
}

// ---- a prefill's picks laid out by expert, in whole tiles (backend/moe.py's align) -----------
constexpr int ALIGN_THREADS = 256;

// The sum over the block; every thread gets it.
__device__ __forceinline__ int block_sum(int v) {
  __shared__ int part[ALIGN_THREADS / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
#pragma unroll
  for (int w = 0; w < ALIGN_THREADS / 32; ++w) v += part[w];
  __syncthreads();  // part is reused by the next call
  return v;
}

// cnt[e] = the picks of expert e among ids[0, P). Grid: one CTA per expert.
extern "C" __global__ void __launch_bounds__(ALIGN_THREADS)
moe_count(const int* __restrict__ ids, int P, int* __restrict__ cnt) {
  pdl_enter();
  const int e = blockIdx.x;
  int c = 0;
#pragma unroll 4
  for (int p = threadIdx.x; p < P; p += ALIGN_THREADS) c += __ldg(ids + p) == e;
  c = block_sum(c);
  if (threadIdx.x == 0) cnt[e] = c;
}

// Expert e's picks (ids[p] == e, p = token * k + j) at rows start .. start + cnt[e] of the layout,
// in pick order (align's stable sort), start = the rows of experts < e padded to whole tiles of bm:
// rows[r] = the pick's token, pick_row[p] = r. The rest of e's last tile repeats its first token;
// tile_expert names e for each of its tiles. Rows past every expert's (up to rows_max) take token
// 0 and their tiles -1 (fused_b_grouped skips them). Grid: one CTA per expert, after moe_count.
extern "C" __global__ void __launch_bounds__(ALIGN_THREADS)
moe_place(const int* __restrict__ ids, int P, int k, int E, int bm, const int* __restrict__ cnt, int rows_max,
          int* __restrict__ rows, int* __restrict__ tile_expert, int* __restrict__ pick_row) {
  pdl_enter();
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int W = ALIGN_THREADS / 32;
  int before = 0, used = 0;
  for (int j = tid; j < E; j += ALIGN_THREADS) {
    const int padded = (cnt[j] + bm - 1) / bm * bm;
    used += padded;
    if (j < e) before += padded;
  }
  before = block_sum(before);
  used = block_sum(used);
  // Each warp ranks the picks of its own contiguous segment; the segments' counts, summed in
  // warp order, make the ranks the picks' order.
  const int seg = ((P + W - 1) / W + 31) / 32 * 32;
  const int p0 = warp * seg, p1 = min(P, p0 + seg);
  int mine = 0;
  for (int b = p0; b < p1; b += 32) {
    const int p = b + lane;
    mine += __popc(__ballot_sync(0xffffffffu, p < p1 && __ldg(ids + p) == e));
  }
  __shared__ int seg_count[W];
  if (lane == 0) seg_count[warp] = mine;
  __syncthreads();
  int r = before;
  for (int w = 0; w < warp; ++w) r += seg_count[w];
  for (int b = p0; b < p1; b += 32) {
    const int p = b + lane;
    const bool hit = p < p1 && __ldg(ids + p) == e;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (hit) {
      const int at = r + __popc(m & ((1u << lane) - 1u));
      rows[at] = p / k;
      pick_row[p] = at;
    }
    r += __popc(m);
  }
  __syncthreads();  // the block's writes of rows are visible to the block after it
  const int count = cnt[e], padded = (count + bm - 1) / bm * bm;
  if (count) {
    const int first = rows[before];
    for (int i = before + count + tid; i < before + padded; i += ALIGN_THREADS) rows[i] = first;
  }
  for (int t = tid; t < padded / bm; t += ALIGN_THREADS) tile_expert[before / bm + t] = e;
  // The rows no expert takes, shared out over the grid.
  for (int i = used + e * ALIGN_THREADS + tid; i < rows_max; i += E * ALIGN_THREADS) {
    rows[i] = 0;
    if (i % bm == 0) tile_expert[i / bm] = -1;
  }
}
