// Mixture-of-experts routing on the device, so that a decode step of an MoE reads nothing back
// on the host and can be captured in a CUDA graph (kernels/moe.py; the experts' products are
// mmvq.cu's mmvq_ids). CPU reference: backend/moe.py's route, and by_expert for the whole MLP.
#include "pdl.cuh"
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

// logits (n, E) -> ids (n, k) in descending logit order and weights (n, k): the softmax over all
// E at the top k, renormalized over the k where norm (route's rule). One CTA per token.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
moe_topk(const float* __restrict__ logits, int E, int k, int norm, int* __restrict__ ids, float* __restrict__ wts) {
  pdl_enter();
  __shared__ float l[MAX_EXPERTS];
  __shared__ float top_l[MAX_K];
  __shared__ int top_i[MAX_K];
  const int t = blockIdx.x;
  const float* row = logits + (long long)t * E;
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
      ids[t * k + j] = top_i[j];
      wts[t * k + j] = expf(top_l[j] - mx) / denom;
    }
  }
}

// out (n, H) = res (n, H, or none) + sum_j wts[t*k + j] * y[t*k + j, :], the picks in order.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ wts, int n, int k, int H,
                                       const float* __restrict__ res, float* __restrict__ out) {
  pdl_enter();
  const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= (long long)n * H) return;
  const int t = (int)(o / H), h = (int)(o % H);
  float v = res ? res[o] : 0.0f;
  for (int j = 0; j < k; ++j) v += wts[t * k + j] * y[((long long)t * k + j) * H + h];
  out[o] = v;
}
