// Mixture-of-experts routing: a token's top k of its router's logits, in a CTA (moe.cu's
// moe_topk) or in one warp (moe_topk_warp, up to 256 experts).
#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // NVRTC has no math.h
#endif

constexpr int TOPK_THREADS = 128;
constexpr int MAX_EXPERTS = 1024;  // kernels/moe.py refuses more
constexpr int MAX_K = 32;

// The block's largest (value, index), ties to the lower index; every thread gets it.
__device__ __forceinline__ void block_argmax(float& v, int& i) {
  __shared__ float sv[TOPK_THREADS / 32];
  __shared__ int si[TOPK_THREADS / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { sv[warp] = v; si[warp] = i; }
  __syncthreads();
  v = sv[0]; i = si[0];
#pragma unroll
  for (int w = 1; w < TOPK_THREADS / 32; ++w)
    if (sv[w] > v || (sv[w] == v && si[w] < i)) { v = sv[w]; i = si[w]; }
  __syncthreads();  // sv / si are reused by the next round
}

// One token's logits row (E) -> ids (k) in descending logit order and weights (k): the softmax
// over all E at the top k, renormalized over the k where norm (route's rule). A CTA of
// TOPK_THREADS threads, all of them calling.
__device__ __forceinline__ void topk_token(const float* row, int E, int k, int norm, int* __restrict__ ids,
                                           float* __restrict__ wts) {
  __shared__ float l[MAX_EXPERTS];
  __shared__ float top_l[MAX_K];
  __shared__ int top_i[MAX_K];
  for (int e = threadIdx.x; e < E; e += TOPK_THREADS) l[e] = row[e];
  __syncthreads();
  for (int j = 0; j < k; ++j) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += TOPK_THREADS)
      if (l[e] > v || (l[e] == v && e < i)) { v = l[e]; i = e; }
    block_argmax(v, i);
    if (i >= E) i = j;  // a row of NaN chose nothing: any valid id keeps the expert reads in bounds
    // Taken: NaN, which no comparison above picks again (a -inf mark tied with the row's own
    // -inf logits and a lower index took the same expert twice).
    if (threadIdx.x == 0) { top_l[j] = v; top_i[j] = i; l[i] = __int_as_float(0x7fffffff); }
    __syncthreads();
  }
  // The denominator: the k chosen (norm), or every expert (restored from the row: l was consumed).
  float s = 0.0f;
  const float mx = top_l[0];
  if (!norm)
    for (int e = threadIdx.x; e < E; e += TOPK_THREADS) s += expf(row[e] - mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __shared__ float ws[TOPK_THREADS / 32];
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float denom = 0.0f;
    if (norm) {
      for (int j = 0; j < k; ++j) denom += expf(top_l[j] - mx);
    } else {
      for (int w = 0; w < TOPK_THREADS / 32; ++w) denom += ws[w];
    }
    for (int j = 0; j < k; ++j) {
      ids[j] = top_i[j];
      wts[j] = expf(top_l[j] - mx) / denom;
    }
  }
}

// topk_token in one warp and no barrier (E <= 32 * TOPK_WARP_PER): lane L holds logits L, L + 32,
// ...; each round a lane offers its best untaken one and a shuffle argmax (ties to the lower
// index) takes the round's; lane j keeps pick j. The picks are topk_token's; the weights' sums
// run in another order (a few ulp apart). The block version's 8 rounds were 3 barriers each.
constexpr int TOPK_WARP_PER = 8;
__device__ __forceinline__ void topk_token_warp(const float* row, int E, int k, int norm, int* __restrict__ ids,
                                                float* __restrict__ wts) {
  const int lane = threadIdx.x & 31;
  const float taken = __int_as_float(0x7fffffff);  // NaN: no comparison picks it
  float l[TOPK_WARP_PER];
#pragma unroll
  for (int q = 0; q < TOPK_WARP_PER; ++q) l[q] = q * 32 + lane < E ? row[q * 32 + lane] : taken;
  float mine_v = 0.0f, mx = 0.0f;
  int mine_i = 0;
  for (int j = 0; j < k; ++j) {
    float v = -INFINITY;
    int i = 0x7fffffff;
#pragma unroll
    for (int q = 0; q < TOPK_WARP_PER; ++q)
      if (l[q] > v || (l[q] == v && q * 32 + lane < i)) { v = l[q]; i = q * 32 + lane; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
    }
    if (i >= E) i = j;  // a row of NaN chose nothing: any valid id (topk_token's rule)
#pragma unroll
    for (int q = 0; q < TOPK_WARP_PER; ++q)
      if (q * 32 + lane == i) l[q] = taken;
    if (lane == j) { mine_v = v; mine_i = i; }
    if (j == 0) mx = v;
  }
  const float ej = lane < k ? expf(mine_v - mx) : 0.0f;
  float s = ej;
  if (!norm) {  // every expert's share: from the row (l was consumed)
    s = 0.0f;
    for (int e = lane; e < E; e += 32) s += expf(row[e] - mx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane < k) {
    ids[lane] = mine_i;
    wts[lane] = ej / s;
  }
}
