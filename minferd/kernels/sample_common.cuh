// The pieces of sample.cu's two kernels: Sampler's penalty and the sortable keys of logits,
// the scans of a row (argmax and thread maxima, gathers and counts at or above a threshold),
// the CTA-wide reductions and scans, the exact bitwise top-k selection, and the per-row
// parameters. sample.cu's header describes the method.
#pragma once
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define NT 1024         // threads per CTA; the T0 argument needs at least MAX_TOP_K of them
#define WARPS (NT / 32)
#define CAP 4096        // survivors that fit in shared memory; also >= 16 segments * MAX_TOP_K
#define MAX_TOP_K 256
#define FULL 0xffffffffu
#define F32_MAX 3.402823466e+38f
// A segment's record in scratch (kernel 1 writes it, kernel 2 reads it), SLOT u64s: [0] the best
// composite (argmax), [1] flags | count << 8, [2..] the segment's top min(k, length) composites,
// unordered, global ids.
#define SLOT (2 + MAX_TOP_K)
#define F_NAN 1ull
#define F_BAD 2ull

// Sampler's penalty: float32 division or product (float64 arithmetic on float32 operands
// rounds to the same result), clipped to float32's range; NaN stays NaN, as np.clip keeps it.
__device__ __forceinline__ float penalize(float l, float p) {
  float r = l > 0.f ? __fdiv_rn(l, p) : __fmul_rn(l, p);
  if (r > F32_MAX) r = F32_MAX;
  if (r < -F32_MAX) r = -F32_MAX;
  return r;
}

__device__ __forceinline__ bool is_nan(float l) { return (__float_as_uint(l) & 0x7fffffffu) > 0x7f800000u; }

// An unsigned key ordered as the floats are. -0.0 maps to +0.0's key: NumPy compares them
// equal, so they must tie (and break the tie by id) here too.
__device__ __forceinline__ u32 fkey(float l) {
  u32 b = __float_as_uint(l);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float unkey(u32 k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Larger composite = larger key, then lower id: the candidates' order as one u64 compare.
__device__ __forceinline__ u64 comp(u32 key, int id) { return ((u64)key << 32) | (u32)~(u32)id; }
__device__ __forceinline__ int comp_id(u64 c) { return (int)~(u32)c; }

// Calls f(i0, v[4], mask) for chunks of 4 consecutive ids (i0 = 4 * chunk), chunk c of
// iteration `it` being it * NT + threadIdx.x, so a thread sees its ids in increasing order
// and the whole block walks the row in id order. The trip count is the same for every
// thread (mask 0 past the end), so f may use warp votes and block barriers. U chunks are
// loaded before any is used: a single CTA needs many loads in flight to stream a row.
template <int VEC, int PEN, int U, class F>
__device__ __forceinline__ void scan_row(const float* __restrict__ lr, int V, float pen,
                                         const u32* bits, F& f) {
  const int nch = (V + 3) >> 2;
  const int iters = (nch + NT - 1) / NT;
  for (int it = 0; it < iters; it += U) {
    float v[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = (it + u) * NT + (int)threadIdx.x;
      if (VEC) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c < nch) x = __ldg(reinterpret_cast<const float4*>(lr) + c);
        v[u][0] = x.x; v[u][1] = x.y; v[u][2] = x.z; v[u][3] = x.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * c + e;
          v[u][e] = i < V ? __ldg(lr + i) : 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = (it + u) * NT + (int)threadIdx.x;
      const int i0 = 4 * c;
      const int m = c < nch ? (V - i0 >= 4 ? 0xF : (1 << (V - i0)) - 1) : 0;
      if (PEN && m) {
        // 4 ids starting at a multiple of 4 share one bitmap word.
        const u32 hb = (bits[i0 >> 5] >> (i0 & 31)) & (u32)m;
        if (hb) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (hb >> e & 1u) v[u][e] = penalize(v[u][e], pen);
        }
      }
      f(i0, v[u], m);
    }
  }
}

__device__ __forceinline__ u64 umax64(u64 a, u64 b) { return a > b ? a : b; }

__device__ __forceinline__ u64 block_max_u64(u64 v, u64* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = umax64(v, __shfl_xor_sync(FULL, v, o));
  __syncthreads();  // red may still be read by an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[lane];  // every warp reduces the 32 partials itself: no broadcast barrier
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = umax64(v, __shfl_xor_sync(FULL, v, o));
  return v;
}

__device__ __forceinline__ int block_sum_int(int v, int* acc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  __syncthreads();
  if (threadIdx.x == 0) *acc = 0;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicAdd(acc, v);
  __syncthreads();
  return *acc;
}

// Exclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ __forceinline__ int block_excl_scan(int v, int* total, int* part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int y = part[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int z = __shfl_up_sync(FULL, y, o);
      if (lane >= o) y += z;
    }
    part[lane] = y;
  }
  __syncthreads();
  *total = part[WARPS - 1];
  return (warp ? part[warp - 1] : 0) + x - v;
}

// Pass B: every element >= thr appended to skey/sid; *n keeps counting past CAP, so an
// overflow is known. Not inlined: the kernel calls it twice and code size is compile time.
template <int VEC>
__device__ __noinline__ int gather_ge(const float* __restrict__ lr, int V, float pen, const u32* bits,
                                      u32 thr, u32* skey, u32* sid, int* n) {
  const int lane = threadIdx.x & 31;
  auto fb = [&](int i0, const float* v, int m) {
    u32 key[4];
    int hit = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      key[e] = fkey(v[e]);
      if ((m >> e & 1) && key[e] >= thr) hit |= 1 << e;
    }
    if (__any_sync(FULL, hit)) {  // rare: about k of a row's ids pass
      const int c = __popc(hit);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
      }
      int base = 0;
      if (lane == 31) base = atomicAdd(n, incl);
      int pos = __shfl_sync(FULL, base, 31) + incl - c;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (hit >> e & 1) {
          if (pos < CAP) { skey[pos] = key[e]; sid[pos] = (u32)(i0 + e); }
          ++pos;
        }
      }
    }
  };
  scan_row<VEC, 1, 4>(lr, V, pen, bits, fb);
  __syncthreads();
  return *n;
}

// The number of the row's elements >= c, for every thread (the overflow fallback only).
template <int VEC>
__device__ __noinline__ int count_ge(const float* __restrict__ lr, int V, float pen, const u32* bits,
                                     u32 c, int* acc) {
  int cnt = 0;
  auto fc = [&](int, const float* v, int m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) cnt += (m >> e & 1) && fkey(v[e]) >= c;
  };
  scan_row<VEC, 1, 4>(lr, V, pen, bits, fc);
  return block_sum_int(cnt, acc);
}

// The exact kk largest of n survivors (skey/sid, all >= T0, the largest key kmax) appended
// to sel (*nsel must be 0): the kk-th largest key T by a bitwise search over [T0, kmax],
// then, if more ids tie at T than are needed, the cut among them by the same search over
// the ids. Each count is one barrier however many survivors a thread holds (past 1024 of
// them, warp sums go to a ring of 3 counters, the one two counts ahead cleared while no
// thread can read it).
// nid bounds the ids.
__device__ __forceinline__ void select_top(const u32* skey, const u32* sid, int n, u32 T0, u32 kmax, int kk,
                                        int nid, u64* sel, int* nsel, int* ring) {
  const int t = threadIdx.x;
  const int S = (n + NT - 1) / NT;
  if (t == 0) { ring[0] = 0; ring[1] = 0; ring[2] = 0; }
  __syncthreads();
  int call = 0;
  auto count_surv = [&](auto pred) {
    if (S == 1) return __syncthreads_count(t < n && pred(skey[t], sid[t]));
    int c = 0;
    for (int s = 0; s < S; ++s) {
      const int j = t + s * NT;
      c += j < n && pred(skey[j], sid[j]);
    }
    c = (int)__reduce_add_sync(FULL, (u32)c);
    int* acc = ring + call % 3;
    if ((t & 31) == 0 && c) atomicAdd(acc, c);
    if (t == 0) ring[(call + 1) % 3] = 0;
    __syncthreads();
    ++call;
    return *acc;
  };
  const bool take_all = n == kk;  // k = 1 without ties lands here: nothing to search
  u32 T = T0, X = 0u;
  bool cut = false;
  if (!take_all) {
    int cge = n;
    const u32 diff = T0 ^ kmax;
    if (diff) {
      const int hb = 31 - __clz(diff);
      T = T0 & ~((2u << hb) - 1u);  // the bits T0 and kmax share (hb = 31: none)
      for (int b = hb; b >= 0; --b) {
        const u32 c = T | (1u << b);
        if (c <= T0) { T = c; continue; }  // every survivor is >= T0
        const int cnt = count_surv([&](u32 key, u32) { return key >= c; });
        if (cnt >= kk) { T = c; cge = cnt; }
      }
    }
    const int cgt = count_surv([&](u32 key, u32) { return key > T; });
    const int need = kk - cgt;
    if (cge - cgt > need) {
      // X = the need-th smallest id among the ties: the largest x with fewer than `need`
      // tied ids below it.
      cut = true;
      const int idbits = 32 - __clz((u32)(nid - 1));
      for (int b = idbits - 1; b >= 0; --b) {
        const u32 c = X | (1u << b);
        if (count_surv([&](u32 key, u32 id) { return key == T && id < c; }) < need) X = c;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    const int j = t + s * NT;
    if (j < n) {
      const u32 key = skey[j], id = sid[j];
      if (take_all || key > T || (key == T && (!cut || id <= X))) {
        const int q = atomicAdd(nsel, 1);
        if (q < MAX_TOP_K) sel[q] = comp(key, (int)id);
      }
    }
  }
  __syncthreads();
}

struct Params {
  float temp, pen, tp, mp, uu;
  int k;
  bool bad, greedy;
};

// Out-of-range parameters make the row -1 (Sampler's SamplingParams refuses them).
template <int GREEDY>
__device__ __forceinline__ Params load_params(int row, const float* temperature, const int* top_k,
                                              const float* top_p, const float* min_p,
                                              const float* penalty, const float* uni) {
  Params P = {0.f, 1.f, 1.f, 0.f, 0.f, 1, false, true};
  if (GREEDY) return P;
  // All six loads at once (one latency, not two); a greedy row ignores the last four.
  P.temp = temperature[row];
  P.pen = penalty[row];
  P.k = top_k[row]; P.tp = top_p[row]; P.mp = min_p[row]; P.uu = uni[row];
  P.bad = !(P.temp >= 0.f && P.temp <= F32_MAX) || !(P.pen > 0.f && P.pen <= F32_MAX);
  P.greedy = P.temp == 0.f;
  if (!P.greedy) {
    // u = 1 (a float32 rounding of a draw just below 1) is allowed: it takes the last bucket.
    P.bad = P.bad || !(P.k >= 1 && P.k <= MAX_TOP_K) || !(P.tp > 0.f && P.tp <= 1.f)
            || !(P.mp >= 0.f && P.mp <= 1.f) || !(P.uu >= 0.f && P.uu <= 1.f);
  } else {
    P.k = 1; P.tp = 1.f; P.mp = 0.f; P.uu = 0.f;
  }
  return P;
}
