// Next-token sampling for a batch of logits rows, so the host reads back one int per
// sequence instead of a whole vocab row (600 KB-1 MB) per step. The spec is sample.py's
// sample_ref (NumPy), which matches minferd/model/sampler.py's Sampler in what is kept and
// with which probabilities; every step below is the same floating-point operation as
// there, so the ids are equal, not merely close.
//
// Two kernels, because one CTA streams only about 25 GB/s (one SM cannot keep more loads in
// flight): a row of 152k logits alone would take 26 us in one CTA.
//   sample_part   one CTA of 1024 threads per (segment of a row, row), the penalty applied
//                 on the fly from a bitmap of the history:
//     pass A      one read: NaN flag, argmax (greedy rows stop here) and each thread's
//                 maximum. The k-th largest of the 1024 thread maxima, T0, has at least k
//                 elements at or above it (k threads each own one), and for ordinary rows
//                 only about k * 1.2 of them.
//     pass B      a second read (from L2): every element >= T0 appended to shared memory.
//     select      the exact k-th largest key among those by a bitwise search (one
//                 __syncthreads_count per bit), ties at the boundary cut to the lowest ids
//                 the same way; the segment's k winners go to a scratch record.
//   sample_merge  one CTA per row: the segments' winners (the row's k largest are among
//                 them), the same selection, the k winners ranked (descending logit, then
//                 ascending id), weights and probabilities by k threads, the float64
//                 running sums (sequential, as NumPy's cumsum) by one thread, the filters
//                 and the inverse CDF by one warp with ballots.
// A segment whose survivors do not fit (many equal logits, or large values hidden in few
// threads) refines T0 with counting passes over the segment and, for ties, gathers the
// lowest ids in id order: slow, but only for such rows.
//
// Nothing here allocates, synchronises with the host or needs a host read of device data:
// the launches are safe inside CUDA graph capture. Rows that Sampler would refuse (NaN
// logits, a maximum that is not finite, parameters out of range, history ids outside the
// vocab) get id -1, for the caller to raise on.
#include "pdl.cuh"
#include "sample_common.cuh"

// ---- kernel 1: one CTA per (segment, row), segments of L ids (a multiple of 4).
// Dynamic shared memory: sel (u64[MAX_TOP_K]), skey, sid (u32[CAP]), the history bitmap of
// the segment (u32[ceil(L/32)]): sample.py's part_smem.
// GREEDY = 1 is argmax(): every row greedy, no penalty, the parameter pointers unused.
template <int VEC, int GREEDY>
__global__ void __launch_bounds__(NT, 1)
sample_part(const float* __restrict__ logits, int V, int L, int S, const float* __restrict__ temperature,
            const int* __restrict__ top_k, const float* __restrict__ top_p,
            const float* __restrict__ min_p, const float* __restrict__ penalty,
            const int* __restrict__ history, int H, const float* __restrict__ uni,
            u64* __restrict__ scratch) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem[];
  u64* sel = reinterpret_cast<u64*>(smem);
  u32* skey = reinterpret_cast<u32*>(sel + MAX_TOP_K);
  u32* sid = skey + CAP;
  u32* bits = sid + CAP;
  __shared__ u64 s_red[WARPS];
  __shared__ int s_part[WARPS];
  __shared__ int s_acc, s_n, s_sel, s_ring[3];

  const int row = blockIdx.y, seg = blockIdx.x, t = threadIdx.x;
  const int lo = seg * L, len = min(L, V - lo);
  const float* lr = logits + (i64)row * V + lo;
  u64* slot = scratch + ((i64)row * S + seg) * SLOT;
  if (t == 0) { s_n = 0; s_sel = 0; }

  const Params P = load_params<GREEDY>(row, temperature, top_k, top_p, min_p, penalty, uni);
  const float pen = P.pen;
  bool bad = P.bad;
  if (!GREEDY && !bad) {
    // The bitmap is cleared even without a penalty: one code path for both (a shared load
    // per 4 ids costs nothing next to streaming the row).
    const int words = (len + 31) >> 5;
    for (int i = t; i < words; i += NT) bits[i] = 0u;
    __syncthreads();
    bool oob = false;
    // Penalty exactly 1 is off, as in Sampler (which skips it: +-inf logits stay unclipped).
    // A bitmap, not the id list: passes A and B test membership once per 4 ids with one
    // shared load, and a token repeated in the window is penalised once for free.
    if (pen != 1.f) {
      for (int h = t; h < H; h += NT) {
        const int id = history[(i64)row * H + h];
        if (id == -1) continue;
        if (id < 0 || id >= V) oob = true;  // Sampler raises on these
        else if (id >= lo && id < lo + len) atomicOr(&bits[(id - lo) >> 5], 1u << ((id - lo) & 31));
      }
    }
    bad = __syncthreads_or(oob);
  }
  if (bad) {
    if (t == 0) slot[1] = F_BAD;
    return;
  }

  // ---- pass A
  u32 bk = 0u;  // 0 is below every non-NaN key: threads with no ids never count
  int bi = 0x7fffffff;
  bool nan = false;
  auto fa = [&](int i0, const float* v, int m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (m >> e & 1) {
        nan |= is_nan(v[e]);
        const u32 key = fkey(v[e]);
        if (key > bk) { bk = key; bi = i0 + e; }  // strict: the lowest id of a thread's ties
      }
    }
  };
  scan_row<VEC, !GREEDY, VEC ? 8 : 4>(lr, len, pen, bits, fa);
  nan = __syncthreads_or(nan);
  const u64 best = block_max_u64(comp(bk, bi), s_red);
  const u32 kmax = (u32)(best >> 32);
  const u64 best_g = comp(kmax, lo + comp_id(best));
  if (P.greedy || nan) {  // the merge refuses NaN rows; np.argmax would return the first NaN
    if (t == 0) { slot[0] = best_g; slot[1] = nan ? F_NAN : 0ull; }
    return;
  }
  const int kk = min(P.k, len);

  // T0 = the kk-th largest thread maximum (with multiplicity).
  u32 T0 = 0u;
  for (int b = 31; b >= 0; --b) {
    const u32 c = T0 | (1u << b);
    if (__syncthreads_count(bk >= c) >= kk) T0 = c;
  }

  // ---- pass B
  int n = gather_ge<VEC>(lr, len, pen, bits, T0, skey, sid, &s_n);
  bool gathered = false;  // sel[] already holds the kk winners (the ties fallback)
  if (n > CAP) {
    // Refine T0 against the whole segment; stop as soon as the survivors fit.
    u32 T = T0;
    bool fits = false;
    const u32 diff = T0 ^ kmax;
    if (diff) {
      const int hb = 31 - __clz(diff);
      T = T0 & ~((2u << hb) - 1u);
      for (int b = hb; b >= 0 && !fits; --b) {
        const u32 c = T | (1u << b);
        if (c <= T0) { T = c; continue; }  // count(>= c) >= n > CAP: no need to count
        const int cnt = count_ge<VEC>(lr, len, pen, bits, c, &s_acc);
        if (cnt >= kk) {
          T = c;
          if (cnt <= CAP) fits = true;
        }
      }
    }
    if (fits) {
      __syncthreads();
      if (t == 0) s_n = 0;
      __syncthreads();
      T0 = T;
      n = gather_ge<VEC>(lr, len, pen, bits, T0, skey, sid, &s_n);
    } else {
      // T is the exact kk-th largest key and more than CAP - kk ids tie at it: take the
      // ids above T in any order and the lowest ids at T in id order.
      const int need = kk - count_ge<VEC>(lr, len, pen, bits, T + 1u, &s_acc);  // T <= kmax < +inf's key
      int running = 0;
      auto fg = [&](int i0, const float* v, int m) {
        u32 eqm = 0u;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (m >> e & 1) {
            const u32 key = fkey(v[e]);
            if (key > T) {
              const int q = atomicAdd(&s_sel, 1);
              if (q < MAX_TOP_K) sel[q] = comp(key, i0 + e);
            } else if (key == T) {
              eqm |= 1u << e;
            }
          }
        }
        int total;
        int rank = running + block_excl_scan(__popc(eqm), &total, s_part);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (eqm >> e & 1u) {
            if (rank < need) {
              const int q = atomicAdd(&s_sel, 1);
              if (q < MAX_TOP_K) sel[q] = comp(T, i0 + e);
            }
            ++rank;
          }
        }
        running += total;
      };
      scan_row<VEC, 1, 1>(lr, len, pen, bits, fg);
      __syncthreads();
      gathered = true;
    }
  }
  if (!gathered) select_top(skey, sid, n, T0, kmax, kk, len, sel, &s_sel, s_ring);
  if (t < kk) slot[2 + t] = comp((u32)(sel[t] >> 32), lo + comp_id(sel[t]));
  if (t == 0) { slot[0] = best_g; slot[1] = (u64)kk << 8; }
}

#include "sample_merge.cuh"  // kernel 2
