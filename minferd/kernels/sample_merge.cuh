// sample.cu's kernel 2: one CTA per row merges the segments' records of kernel 1 and draws.
// sample.cu's header describes the method; the pieces are sample_common.cuh's.
#pragma once
#include "pdl.cuh"
#include "sample_common.cuh"

// ---- kernel 2: one CTA per row merges its S segments' records and draws.
// Dynamic shared memory: sel, srt (u64[MAX_TOP_K]); cw, cp (double[MAX_TOP_K]); wv, pv
// (float[MAX_TOP_K]); skey, sid (u32[CAP]): sample.py's MERGE_SMEM.
template <int GREEDY>
__global__ void __launch_bounds__(NT, 1)
sample_merge(int V, int S, const float* __restrict__ temperature, const int* __restrict__ top_k,
             const float* __restrict__ top_p, const float* __restrict__ min_p,
             const float* __restrict__ penalty, const float* __restrict__ uni,
             const u64* __restrict__ scratch, int* __restrict__ out) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem[];
  u64* sel = reinterpret_cast<u64*>(smem);
  u64* srt = sel + MAX_TOP_K;
  double* cw = reinterpret_cast<double*>(srt + MAX_TOP_K);
  double* cp = cw + MAX_TOP_K;
  float* wv = reinterpret_cast<float*>(cp + MAX_TOP_K);
  float* pv = wv + MAX_TOP_K;
  u32* skey = reinterpret_cast<u32*>(pv + MAX_TOP_K);
  u32* sid = skey + CAP;
  __shared__ u64 s_red[WARPS];
  __shared__ u32 s_min[WARPS];
  __shared__ int s_cnt[WARPS];  // S <= 16
  __shared__ int s_n, s_sel, s_ring[3];

  const int row = blockIdx.x, t = threadIdx.x, lane = t & 31;
  const u64* rec = scratch + (i64)row * S * SLOT;
  if (t == 0) { s_n = 0; s_sel = 0; }
  // Every global load of the row first, so they cost one latency: the parameters, the
  // segments' records, and this thread's (up to 4) candidates, masked once counts are known.
  const Params P = load_params<GREEDY>(row, temperature, top_k, top_p, min_p, penalty, uni);
  const u64 flags = t < S ? rec[(i64)t * SLOT + 1] : 0ull;
  const u64 seg_best = t < S ? rec[(i64)t * SLOT] : 0ull;
  u64 c[CAP / NT];
  if (!GREEDY) {
#pragma unroll
    for (int r = 0; r < CAP / NT; ++r) {
      const int i = t + r * NT;
      c[r] = i < S * MAX_TOP_K ? rec[(i64)(i / MAX_TOP_K) * SLOT + 2 + i % MAX_TOP_K] : 0ull;
    }
  }
  if (t < S) { s_cnt[t] = (int)(flags >> 8); s_min[t] = 0xffffffffu; }
  const bool bad = __syncthreads_or(P.bad || (flags & F_BAD));
  if (bad) {
    if (t == 0) out[row] = -1;
    return;
  }
  const bool nan = __syncthreads_or((flags & F_NAN) != 0);
  const u64 best = block_max_u64(seg_best, s_red);
  if (P.greedy) {
    if (t == 0) out[row] = nan ? -1 : comp_id(best);
    return;
  }
  const u32 kmax = (u32)(best >> 32);
  const float top = unkey(kmax);
  if (nan || !(top >= -F32_MAX && top <= F32_MAX)) {  // Sampler: "must have a finite maximum"
    if (t == 0) out[row] = -1;
    return;
  }
  const int kk = min(P.k, V);

  // T0 = the largest of the full segments' smallest winners: that segment alone has kk ids
  // at or above it, and only ids at or above it can be among the row's kk largest. A warp's
  // 32 candidates of one r lie in one segment (32 divides MAX_TOP_K).
  bool valid[CAP / NT];
#pragma unroll
  for (int r = 0; r < CAP / NT; ++r) {
    const int i = t + r * NT, s = i / MAX_TOP_K;
    valid[r] = i < S * MAX_TOP_K && i % MAX_TOP_K < s_cnt[s];
    u32 m = valid[r] ? (u32)(c[r] >> 32) : 0xffffffffu;
    m = __reduce_min_sync(FULL, m);
    if (lane == 0 && i < S * MAX_TOP_K && m != 0xffffffffu) atomicMin(&s_min[s], m);
  }
  __syncthreads();
  u32 T0 = 0u;
  for (int s = 0; s < S; ++s)
    if (s_cnt[s] == kk) T0 = max(T0, s_min[s]);
#pragma unroll
  for (int r = 0; r < CAP / NT; ++r) {
    const u32 key = (u32)(c[r] >> 32);
    if (valid[r] && key >= T0) {
      const int q = atomicAdd(&s_n, 1);  // at most S * MAX_TOP_K <= CAP
      skey[q] = key;
      sid[q] = (u32)comp_id(c[r]);
    }
  }
  __syncthreads();
  select_top(skey, sid, s_n, T0, kmax, kk, V, sel, &s_sel, s_ring);

  // ---- rank the kk winners (composites are distinct: ids are)
  if (t < kk) {
    const u64 x = sel[t];
    int r = 0;
#pragma unroll 8
    for (int i = 0; i < kk; ++i) r += sel[i] > x;
    srt[r] = x;
  }
  __syncthreads();
  // w = exp(l - max) (top-p and min-p read the untempered weights) and the tempered
  // probabilities, each float32 rounded from a float64 exp: a float32 exp differs between
  // libraries in the last bit, the float64 one rounds to the same float32 nearly always.
  const float inv_t = __double2float_rn(fmin(__ddiv_rn(1.0, (double)P.temp), 1e30));
  if (t < kk) {
    const float z = __fsub_rn(unkey((u32)(srt[t] >> 32)), top);
    wv[t] = __double2float_rn(exp((double)z));
    pv[t] = __double2float_rn(exp((double)__fmul_rn(z, inv_t)));
  }
  __syncthreads();
  if (t >= 32) return;
  if (t == 0) {
    // Sequential float64 sums, as np.cumsum; the two chains are independent, so they overlap.
    double a = 0.0, b = 0.0;
#pragma unroll 8
    for (int i = 0; i < kk; ++i) {
      a = __dadd_rn(a, (double)wv[i]);
      b = __dadd_rn(b, (double)pv[i]);
      cw[i] = a;
      cp[i] = b;
    }
  }
  __syncwarp();
  // min-p keeps the leading run with w >= min_p (w[0] = 1, so at least one).
  int nkeep = kk;
  for (int base = 0; base < kk; base += 32) {
    const int i = base + t;
    const u32 bal = __ballot_sync(FULL, i < kk && !(wv[i] >= P.mp));
    if (bal) { nkeep = base + __ffs(bal) - 1; break; }
  }
  // top-p: the smallest prefix whose mass, over the sum of all kk weights, reaches top_p.
  if (P.tp < 1.f) {
    const double total = cw[kk - 1], tpd = (double)P.tp;
    const int lim = nkeep;
    for (int base = 0; base < lim; base += 32) {
      const int i = base + t;
      const u32 bal = __ballot_sync(FULL, i < lim && __ddiv_rn(cw[i], total) >= tpd);
      if (bal) { nkeep = base + __ffs(bal); break; }  // the crossing token is kept
    }
  }
  // Inverse CDF as Sampler's _bucket: the first running sum above u * total; past the end,
  // the first bucket that reaches the total (the last one with any width).
  const double last = cp[nkeep - 1];
  const double x = __dmul_rn((double)P.uu, last);
  int pick = -1;
  for (int base = 0; base < nkeep; base += 32) {
    const int i = base + t;
    const u32 bal = __ballot_sync(FULL, i < nkeep && cp[i] > x);
    if (bal) { pick = base + __ffs(bal) - 1; break; }
  }
  if (pick < 0) {
    for (int base = 0; base < nkeep; base += 32) {
      const int i = base + t;
      const u32 bal = __ballot_sync(FULL, i < nkeep && cp[i] >= last);
      if (bal) { pick = base + __ffs(bal) - 1; break; }
    }
  }
  if (t == 0) out[row] = comp_id(srt[pick]);
}
