// Batched, paged decode attention: one query row per sequence against an f16 KV cache laid
// out in fixed-size blocks (vLLM-style block tables), GQA, optional sliding window, f32 math.
//
// Why a kernel of its own: ops.cu's attn_decode_partial gives each query head its own CTA,
// so a GQA group of G heads reads the same K/V G times (7x for Qwen2.5-7B), and it reduces
// every key's dot product across a warp with shuffles. Here one CTA serves a whole group: it
// streams its share of one kv head's keys through shared memory once and every query head of
// the group reads the tile from there.
//
// Work split (split-K flash decoding): CTA (split, kv head [x head chunk], sequence) takes a
// contiguous, tile-aligned share of that sequence's visible keys and writes an unnormalised
// partial (o, max, sum) per query head; attn_decode_merge combines the splits. The grid
// depends on the launcher's arguments only, never on device values (ctx_lens, block tables),
// so a captured CUDA graph replays correctly with new lengths; a split whose share is empty
// writes a neutral partial (max = -inf, sum = 0).
//
// Tiles of TK keys come in by cp.async, double-buffered: tile i+1 is in flight while tile i is
// used, and the block-table entries of tile i+2 are fetched into registers meanwhile, so no copy
// waits on a table lookup. Shared rows are padded by 8 halves (16 bytes): the 16-byte loads
// (and ldmatrix rows) of neighbouring rows hit distinct banks. Two kernels use the tiles:
//
// attn_decode_tc (d <= 128; the default there): tensor cores, 4 warps, each owning 16 keys of
// every 64-key tile with its own online softmax (no cross-warp step per tile: one barrier per
// tile). S^T (16 keys x 8 heads) = K Q^T and O^T (d x 8 heads) += V^T P by mma.m16n8k16 with
// f32 accumulation; q and p enter as f16 pairs hi + lo (x - hi rounded again), each product
// done twice, so they carry ~22 mantissa bits: the result matches f32 math to ~1e-6, not the
// ~1e-3 of plain f16 operands (K and V are f16 already: exact). q is scaled by a power of two
// per head first (its max |q| into [2^13, 2^14)) and p by 2^10, so neither half underflows
// into f16 subnormals; the scales come out exactly afterwards. Transposed products put a
// lane's S columns and O columns on the same two heads, so the softmax corrections need no
// shuffles. The 4 warps' (m, l, O) meet in shared memory once, after the last tile.
//
// attn_decode_split (SIMT f32, every head dim; the one for d > 128):
//   scores  4 warps split the head dim in quarters; lane l owns keys l, l + 32; each lane
//           computes all GM heads x its keys over its quarter (no reduction per key: q comes
//           from shared memory as broadcasts, a K chunk in registers serves every head); the
//           quarters meet in shared memory;
//   softmax warp w owns heads w, w + 4: one max reduction per head per tile, then p = exp2(s -
//           m) to shared memory and the correction exp2(m_old - m_new);
//   P V     thread (chunk c, key phase ks) owns 8 output elements of every head and walks keys
//           ks, ks + KS, ...: a V chunk loaded once serves GM heads. The accumulators are
//           rescaled only when some head's max moved (after the first tiles it rarely does).
//           The KS key phases meet in shared memory once, after the last tile.
// Scores are pre-scaled by scale * log2(e), so exp2 replaces exp; partial maxima are in that
// log2 domain, which only the merge reads.
//
// CPU reference: minferd/kernels/attn_decode.py's attn_decode_ref (tests/cuda/test_attn_decode.py).
#include <cuda_fp16.h>
#include "xquant.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // NVRTC has no math.h
#endif

#define WARP 32
#define GMAX 8          // query heads per CTA at most (larger groups take several head chunks)
#define MAX_SPLITS 128  // the merge's first warp holds 4 splits per lane
#define MERGE_THREADS 512
#define NT 128          // threads of a split CTA: 4 warps

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 bytes global -> shared, bypassing L1 (the KV is read once); ok == false writes zeros
// (src-size 0), so masked rows never hold garbage that 0 * NaN would spread. No "memory"
// clobber: the stage it writes is ordered by cp_async_wait_all and __syncthreads, and without
// it the compiler may keep scheduling shared loads across the copies.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void h8_to_f32(const uint4 r, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// A row of N floats of shared memory into registers, 16 bytes at a time where N allows.
template <int N>
__device__ __forceinline__ void load_row(const float* p, float (&r)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
    }
  } else if constexpr (N == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    r[0] = v.x; r[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = p[i];
  }
}

typedef unsigned int u32;

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const __half* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const __half* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

// (a, b) as f16 pairs hi + lo: hi = f16(x), lo = f16(x - hi); a in the low halves.
__device__ __forceinline__ void split_h2(float a, float b, u32& hi, u32& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const u32*>(&h);
  lo = *reinterpret_cast<const u32*>(&l);
}

// This split's share [k0, k1) of sequence b's visible keys [lo, n): tile-aligned shares, so
// only a split's last tile is partial. Lengths past the block table are clamped so that bad
// device data cannot send a read outside the table.
__device__ __forceinline__ void split_share(const int* ctx_lens, int b, int max_blocks, int log2bs, int window,
                                            int splits, int split, int tk, int& k0, int& k1) {
  int n = ctx_lens[b];
  n = max(0, min(n, max_blocks << log2bs));
  const int lo = window > 0 ? max(0, n - window) : 0;
  int per = (n - lo + splits - 1) / splits;
  per = (per + tk - 1) / tk * tk;
  k0 = lo + split * per;
  k1 = min(k0 + per, n);
}

// With one split there is nothing to merge: the partials kernels finish the output themselves
// (out set: the launcher passes it only when splits == 1). Element e of head h of sequence b,
// and with xq its int8 form (a whole warp calls, lanes on one 32-element block: the callers'
// loops step by NT over gc * D elements, D % 32 == 0).
__device__ __forceinline__ void write_out(float* out, signed char* xq, float2* xds, int kbp, int b, int hq, int D,
                                          int h, int e, float v) {
  const int K = hq * D, k = h * D + e, lane = e % WARP;
  out[(long long)b * K + k] = v;
  if (xq) quantize_block32(v, lane, xq + (long long)b * 2 * K + (k - lane), K, xds + (long long)b * kbp + k / 32);
}

// An empty share (a padding row, a short sequence): a neutral partial, or zeros for out.
__device__ __forceinline__ void empty_share(float* out, signed char* xq, float2* xds, int kbp, float2* part_ml,
                                            long long row0, int b, int hq, int D, int h0, int gc, int splits,
                                            int split, int tid) {
  if (out) {
    for (int i = tid; i < gc * D; i += NT) write_out(out, xq, xds, kbp, b, hq, D, h0 + i / D, i % D, 0.f);
  } else if (tid < gc) {
    part_ml[(row0 + tid) * splits + split] = make_float2(-INFINITY, 0.f);
  }
}

// K and V tiles of TK keys into shared stages (K rows, then V rows, ROW halves each). Chunk r
// of a thread is 16-byte chunk (r * NT + tid) of the tile: rows in key order, consecutive
// threads along a row (coalesced). blk[r] holds the block-table entry of that chunk's key for
// the NEXT tile to issue: fetched one tile ahead, so a tile's copies never wait on an L2 round
// trip for their addresses.
template <int D, int TK>
struct TileLoader {
  static constexpr int ROW = D + 8, NC = D / 8, ROUNDS = TK * NC / NT;
  static_assert((TK * NC) % NT == 0, "a tile must split evenly over the CTA");
  const __half* Kc;
  const __half* Vc;
  const int* bt;
  __half* kv;
  int tid, k1, log2bs, n_slots, hkv, kvh;
  int blk[ROUNDS];

  __device__ __forceinline__ void fetch(int t0) {
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
      const int pos = t0 + (r * NT + tid) / NC;
      blk[r] = pos < k1 ? __ldg(bt + (pos >> log2bs)) : -1;
    }
  }

  __device__ __forceinline__ void issue(int t0, int st) {
    __half* Ks = kv + st * 2 * TK * ROW;
    __half* Vs = Ks + TK * ROW;
    const int bsmask = (1 << log2bs) - 1;
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
      const int i = r * NT + tid, key = i / NC, c = i % NC, pos = t0 + key;
      const long long slot = ((long long)blk[r] << log2bs) + (pos & bsmask);
      const bool ok = pos < k1 && blk[r] >= 0 && slot < n_slots;  // a corrupt entry reads zeros
      const long long off = ok ? (slot * hkv + kvh) * D + c * 8 : 0;
      cp_async16(Ks + key * ROW + c * 8, Kc + off, ok);
      cp_async16(Vs + key * ROW + c * 8, Vc + off, ok);
    }
    cp_async_commit();
  }
};

// Shapes and the shared-memory layout (bytes) of a SIMT split CTA serving GM query heads;
// attn_decode.py's smem_bytes() mirrors BYTES, and the kernel traps if it was launched with less.
template <int D, int GM>
struct Cfg {
  static constexpr int TK = D <= 128 ? 64 : 32;  // keys per tile (two stages of K and V must fit)
  static constexpr int KK = TK / WARP;           // keys per lane in the score loop and the softmax
  static constexpr int GP = GM <= 2 ? GM : (GM + 3) / 4 * 4;  // p row stride (16-byte loads)
  static constexpr int ROW = D + 8;              // halves per shared row
  static constexpr int NC = D / 8;               // 16-byte chunks per row
  static constexpr int KS = NT / NC;             // key phases of the P V loop
  static constexpr int PV_THREADS = NC * KS;     // < NT where NC does not divide NT (D = 96, ...)
  static constexpr int PV_KEYS = (TK + KS - 1) / KS;  // keys per thread per tile at most
  static constexpr int DQ = D / 4;               // head-dim elements per warp in the score loop
  static constexpr int JH = (GM + 3) / 4;        // heads per warp in the softmax
  static constexpr int KV_BYTES = 2 * 2 * TK * ROW * 2;  // two stages of K and V tiles
  static constexpr int FIN_BYTES = KS * GM * D * 4;      // the P V partials of every key phase
  static constexpr int A_BYTES = KV_BYTES > FIN_BYTES ? KV_BYTES : FIN_BYTES;
  static constexpr int Q_OFF = A_BYTES;                  // q (GM, D) f32, pre-scaled
  static constexpr int RED_OFF = Q_OFF + GM * D * 4;     // score quarters (4, GM, TK) f32
  static constexpr int P_OFF = RED_OFF + 4 * GM * TK * 4;  // p (TK, GP) f32
  static constexpr int C_OFF = P_OFF + TK * GP * 4;      // corrections (GP) f32
  static constexpr int BYTES = C_OFF + (GP * 4 + 15) / 16 * 16;
};

__device__ __forceinline__ void check_smem(unsigned need) {
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < need) __trap();  // launcher and kernel disagree on the layout
}

// The partials: part_o (B, hq, splits, D) f32 unnormalised, part_ml (B, hq, splits) of (max in
// the log2 domain, sum). Grid (splits, hkv * nch, B), NT threads, Cfg::BYTES of dynamic smem.
template <int D, int GM>
__global__ void __launch_bounds__(NT, 3)
attn_decode_split(const float* __restrict__ q, const __half* __restrict__ Kc, const __half* __restrict__ Vc,
                  const int* __restrict__ block_tables, const int* __restrict__ ctx_lens,
                  float* __restrict__ part_o, float2* __restrict__ part_ml, int hq, int hkv, int group, int nch,
                  int n_slots, int max_blocks, int log2bs, int window, float qscale, int splits,
                  float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
  typedef Cfg<D, GM> C;
  constexpr int TK = C::TK, KK = C::KK, GP = C::GP, ROW = C::ROW, NC = C::NC, KS = C::KS;
  constexpr int DQ = C::DQ, JH = C::JH;
  extern __shared__ __align__(16) unsigned char smem[];
  check_smem(C::BYTES);
  __half* kv = reinterpret_cast<__half*>(smem);  // stage s: K at s * 2 * TK * ROW, V after it
  float* qs = reinterpret_cast<float*>(smem + C::Q_OFF);
  float* red = reinterpret_cast<float*>(smem + C::RED_OFF);
  float* ps = reinterpret_cast<float*>(smem + C::P_OFF);
  float* corr = reinterpret_cast<float*>(smem + C::C_OFF);

  const int split = blockIdx.x, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
  const int g0 = chunk * GMAX, gc = min(GM, group - g0);  // this CTA's heads: h0 .. h0 + gc - 1
  const int h0 = kvh * group + g0;
  int k0, k1;
  split_share(ctx_lens, b, max_blocks, log2bs, window, splits, split, TK, k0, k1);
  const long long row0 = (long long)b * hq + h0;  // (sequence, first head) row of the partials
  if (k0 >= k1) {
    empty_share(out, xq, xds, kbp, part_ml, row0, b, hq, D, h0, gc, splits, split, tid);
    return;
  }
  const int ntiles = (k1 - k0 + TK - 1) / TK;
  TileLoader<D, TK> ld{Kc, Vc, block_tables + (long long)b * max_blocks, kv, tid, k1, log2bs, n_slots, hkv, kvh};
  ld.fetch(k0);
  ld.issue(k0, 0);  // in flight while q is staged
  if (ntiles > 1) ld.fetch(k0 + TK);

  const float* qb = q + row0 * D;
  for (int i = tid; i < GM * D; i += NT) qs[i] = i / D < gc ? qb[i] * qscale : 0.f;
  for (int i = tid; i < TK * GP; i += NT) ps[i] = 0.f;  // pad heads keep p = 0 (never written)
  if (tid < GP) corr[tid] = 1.f;  // pad heads: a correction of 1 never asks for a rescale

  float acc[GM][8];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  float m[JH], l[JH];  // warp w: heads w + 4 j; l is this lane's share of the sum
#pragma unroll
  for (int j = 0; j < JH; ++j) { m[j] = -INFINITY; l[j] = 0.f; }
  const int pc = tid % NC, pks = tid / NC;  // P V: chunk and key phase

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile it landed for all; iteration it - 1 is done with the other stage
    if (it + 1 < ntiles) {
      ld.issue(k0 + (it + 1) * TK, (it + 1) & 1);
      if (it + 2 < ntiles) ld.fetch(k0 + (it + 2) * TK);
    }
    const __half* Ks = kv + (it & 1) * 2 * TK * ROW;
    const __half* Vs = Ks + TK * ROW;
    const int nvalid = min(TK, k1 - (k0 + it * TK));

    // Scores over this warp's quarter of the head dim.
    {
      float s[GM][KK];
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) s[g][kk] = 0.f;
#pragma unroll
      for (int j = 0; j < DQ / 8; ++j) {
        const int e = warp * DQ + j * 8;
        float kf[KK][8];
#pragma unroll
        for (int kk = 0; kk < KK; ++kk)
          h8_to_f32(*reinterpret_cast<const uint4*>(Ks + (lane + WARP * kk) * ROW + e), kf[kk]);
#pragma unroll
        for (int g = 0; g < GM; ++g) {
          const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + e);
          const float4 qb4 = *reinterpret_cast<const float4*>(qs + g * D + e + 4);
#pragma unroll
          for (int kk = 0; kk < KK; ++kk) {
            float v = s[g][kk];
            v = fmaf(qa.x, kf[kk][0], v); v = fmaf(qa.y, kf[kk][1], v);
            v = fmaf(qa.z, kf[kk][2], v); v = fmaf(qa.w, kf[kk][3], v);
            v = fmaf(qb4.x, kf[kk][4], v); v = fmaf(qb4.y, kf[kk][5], v);
            v = fmaf(qb4.z, kf[kk][6], v); v = fmaf(qb4.w, kf[kk][7], v);
            s[g][kk] = v;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) red[(warp * GM + g) * TK + lane + WARP * kk] = s[g][kk];
    }
    __syncthreads();

    // Online softmax, one update per head per tile.
#pragma unroll
    for (int j = 0; j < JH; ++j) {
      const int g = warp + 4 * j;
      if (g < gc) {  // warp-uniform
        float sv[KK], tmax = -INFINITY;
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          const int key = lane + WARP * kk;
          const float v = red[g * TK + key] + red[(GM + g) * TK + key] + red[(2 * GM + g) * TK + key] +
                          red[(3 * GM + g) * TK + key];
          sv[kk] = key < nvalid ? v : -INFINITY;
          tmax = fmaxf(tmax, sv[kk]);
        }
        tmax = warp_max(tmax);  // finite: a tile holds at least one visible key
        const float mn = fmaxf(m[j], tmax);
        const float c = exp2f(m[j] - mn);  // m = -inf (first tile): 0, and acc is still 0
        float psum = 0.f;
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          const float p = exp2f(sv[kk] - mn);  // masked keys: exp2(-inf) = 0
          ps[(lane + WARP * kk) * GP + g] = p;
          psum += p;
        }
        l[j] = l[j] * c + psum;
        m[j] = mn;
        if (lane == 0) corr[g] = c;
      }
    }
    __syncthreads();

    // O = O * corr + P V.
    if (tid < C::PV_THREADS) {
      float cr[GP];
      load_row<GP>(corr, cr);
      bool moved = false;
#pragma unroll
      for (int g = 0; g < GM; ++g) moved |= cr[g] != 1.f;
      if (moved) {  // CTA-uniform: every thread reads the same corrections
#pragma unroll
        for (int g = 0; g < GM; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] *= cr[g];
      }
#pragma unroll
      for (int kk = 0; kk < C::PV_KEYS; ++kk) {
        const int k = pks + kk * KS;
        if (k < nvalid) {
          float vf[8], p[GP];
          h8_to_f32(*reinterpret_cast<const uint4*>(Vs + k * ROW + pc * 8), vf);
          load_row<GP>(ps + k * GP, p);
#pragma unroll
          for (int g = 0; g < GM; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p[g], vf[i], acc[g][i]);
        }
      }
    }
  }

  // The key phases meet in shared memory (over the tile stages: all reads of them are done).
  __syncthreads();
  float* fin = reinterpret_cast<float*>(smem);  // (KS, GM, D)
  if (tid < C::PV_THREADS) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      float4* dst = reinterpret_cast<float4*>(fin + (pks * GM + g) * D + pc * 8);
      dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    }
  }
#pragma unroll
  for (int j = 0; j < JH; ++j) {
    const int g = warp + 4 * j;
    if (g < gc) {
      const float sum = warp_sum(l[j]);
      if (lane == 0) {
        if (!out) part_ml[(row0 + g) * splits + split] = make_float2(m[j], sum);
        corr[g] = sum;  // the corrections are done with: the sums, for a finished out
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += NT) {
    const int g = i / D, e = i % D;
    float o = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) o += fin[(ks * GM + g) * D + e];
    if (out) write_out(out, xq, xds, kbp, b, hq, D, h0 + g, e, o / corr[g]);
    else part_o[((row0 + g) * splits + split) * D + e] = o;
  }
}

// The tensor-core kernel's layout (bytes): two K/V stages of 64 keys (after the last tile, the
// 4 warps' O partials), each warp's P^T (GMAX heads x 16 keys, hi then lo halves) and the 4
// warps' (m, l) per head. attn_decode.py's smem_bytes_tc() mirrors BYTES.
template <int D>
struct CfgTC {
  static constexpr int TK = 64, ROW = D + 8, DT = D / 16;  // DT: 16-wide k-steps and m-tiles of d
  static constexpr int KV_BYTES = 2 * 2 * TK * ROW * 2;
  static constexpr int FIN_BYTES = 4 * GMAX * D * 4;
  static constexpr int A_BYTES = KV_BYTES > FIN_BYTES ? KV_BYTES : FIN_BYTES;
  static constexpr int PW_OFF = A_BYTES;
  static constexpr int ML_OFF = PW_OFF + 4 * 2 * GMAX * 16 * 2;
  static constexpr int BYTES = ML_OFF + 4 * GMAX * 2 * 4;
  static_assert(D % 16 == 0 && D <= 128, "tensor-core decode: d a multiple of 16 up to 128");
};

#define PSCALE 1024.0f  // p in [0, 1] enters the P V product as 2^10 p: its f16 halves stay normal

// The partials of attn_decode_split, by tensor cores (see the header); group chunks of up to
// GMAX heads, padded to the mma's 8 columns with zero queries. Grid (splits, hkv * nch, B), NT
// threads, CfgTC::BYTES of dynamic smem.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g+8 x cols 2t, 2t+1
// (a0, a1) and 2t+8, 2t+9 (a2, a3); B (k x n) rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) x col g;
// C rows g (c0, c1), g+8 (c2, c3) x cols 2t, 2t+1. Here S^T: A = K (16 keys x 16 dims, ldmatrix),
// B = Q^T (registers), C = keys x heads; O^T: A = V^T (16 dims x 16 keys, ldmatrix.trans),
// B = P (16 keys x heads, through the warp's P^T in shared memory), C = dims x heads.
template <int D>
__global__ void __launch_bounds__(NT, 3)
attn_decode_tc(const float* __restrict__ q, const __half* __restrict__ Kc, const __half* __restrict__ Vc,
               const int* __restrict__ block_tables, const int* __restrict__ ctx_lens,
               float* __restrict__ part_o, float2* __restrict__ part_ml, int hq, int hkv, int group, int nch,
               int n_slots, int max_blocks, int log2bs, int window, float qscale, int splits,
                  float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
  typedef CfgTC<D> C;
  constexpr int TK = C::TK, ROW = C::ROW, DT = C::DT;
  extern __shared__ __align__(16) unsigned char smem[];
  check_smem(C::BYTES);
  __half* kv = reinterpret_cast<__half*>(smem);

  const int split = blockIdx.x, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
  const int g0 = chunk * GMAX, gc = min(GMAX, group - g0);
  const int h0 = kvh * group + g0;
  int k0, k1;
  split_share(ctx_lens, b, max_blocks, log2bs, window, splits, split, TK, k0, k1);
  const long long row0 = (long long)b * hq + h0;
  if (k0 >= k1) {
    empty_share(out, xq, xds, kbp, part_ml, row0, b, hq, D, h0, gc, splits, split, tid);
    return;
  }
  const int ntiles = (k1 - k0 + TK - 1) / TK;
  TileLoader<D, TK> ld{Kc, Vc, block_tables + (long long)b * max_blocks, kv, tid, k1, log2bs, n_slots, hkv, kvh};
  ld.fetch(k0);
  ld.issue(k0, 0);
  if (ntiles > 1) ld.fetch(k0 + TK);

  // Q^T fragments: lane (g, t) holds head g's elements 16kk + 2t, +1 (b0) and +8, +9 (b1),
  // times cs, a power of two that puts the head's max |q| in [2^13, 2^14); pad heads are 0.
  u32 qhi[DT][2], qlo[DT][2];
  float sc0, sc1;  // score scales of this lane's S columns, heads 2t and 2t + 1
  {
    float2 qv[DT][2];
    float amax = 0.f;
    const float* qh = q + (row0 + g) * D;
#pragma unroll
    for (int kk = 0; kk < DT; ++kk)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        qv[kk][j] = g < gc ? *reinterpret_cast<const float2*>(qh + kk * 16 + 2 * t + 8 * j) : make_float2(0.f, 0.f);
        amax = fmaxf(amax, fmaxf(fabsf(qv[kk][j].x), fabsf(qv[kk][j].y)));
      }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the 4 lanes of head g
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int ex;
    frexpf(amax, &ex);
    const float cs = amax > 0.f ? ldexpf(1.f, 14 - ex) : 1.f;
#pragma unroll
    for (int kk = 0; kk < DT; ++kk)
#pragma unroll
      for (int j = 0; j < 2; ++j) split_h2(qv[kk][j].x * cs, qv[kk][j].y * cs, qhi[kk][j], qlo[kk][j]);
    sc0 = qscale / __shfl_sync(0xffffffffu, cs, 8 * t);      // lane 4 * (2t) holds head 2t's cs
    sc1 = qscale / __shfl_sync(0xffffffffu, cs, 8 * t + 4);  // and lane 4 * (2t + 1) head 2t + 1's
  }

  float o[DT][4];  // O^T fragments: dims 16dt + g (o0, o1), + 8 (o2, o3) x heads 2t, 2t + 1
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2t, 2t + 1; l: this lane's keys
  __half* pw = reinterpret_cast<__half*>(smem + C::PW_OFF) + warp * 2 * GMAX * 16;  // P^T hi, then lo
  const int kw = warp * 16;  // this warp's keys of every tile

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile it landed for all; iteration it - 1 is done with the other stage
    if (it + 1 < ntiles) {
      ld.issue(k0 + (it + 1) * TK, (it + 1) & 1);
      if (it + 2 < ntiles) ld.fetch(k0 + (it + 2) * TK);
    }
    const __half* Ks = kv + (it & 1) * 2 * TK * ROW;
    const __half* Vs = Ks + TK * ROW;
    const int nvalid = min(TK, k1 - (k0 + it * TK));
    if (kw >= nvalid) continue;  // warp-uniform: none of this warp's keys in this tile

    // S^T = K Q^T (f32 accumulation of the hi and lo products).
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < DT; ++kk) {
      u32 a0, a1, a2, a3;
      ldsm_x4(a0, a1, a2, a3, Ks + (kw + (lane & 15)) * ROW + kk * 16 + (lane >> 4) * 8);
      mma16816(s, a0, a1, a2, a3, qhi[kk][0], qhi[kk][1]);
      mma16816(s, a0, a1, a2, a3, qlo[kk][0], qlo[kk][1]);
    }
    // s0, s1: key kw + g, heads 2t, 2t + 1; s2, s3: key kw + g + 8.
    const bool v0 = kw + g < nvalid, v1 = kw + g + 8 < nvalid;
    const float x0 = v0 ? s[0] * sc0 : -INFINITY, x1 = v0 ? s[1] * sc1 : -INFINITY;
    const float x2 = v1 ? s[2] * sc0 : -INFINITY, x3 = v1 ? s[3] * sc1 : -INFINITY;
    float t0 = fmaxf(x0, x2), t1 = fmaxf(x1, x3);
#pragma unroll
    for (int off = 4; off < WARP; off <<= 1) {  // over g: the 8 lanes of this t
      t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, off));
      t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, off));
    }
    const float mn0 = fmaxf(m0, t0), mn1 = fmaxf(m1, t1);  // finite: key kw is visible
    const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // m = -inf (first tile): 0
    const float p0 = exp2f(x0 - mn0), p1 = exp2f(x1 - mn1), p2 = exp2f(x2 - mn0), p3 = exp2f(x3 - mn1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= c0; o[dt][1] *= c1; o[dt][2] *= c0; o[dt][3] *= c1;
    }

    // P^T (heads x 16 keys) as f16 hi and lo planes, then read back as the B fragments of P.
    {
      const float pv[4] = {p0 * PSCALE, p1 * PSCALE, p2 * PSCALE, p3 * PSCALE};
      const int at[4] = {(2 * t) * 16 + g, (2 * t + 1) * 16 + g, (2 * t) * 16 + g + 8, (2 * t + 1) * 16 + g + 8};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half hi = __float2half_rn(pv[i]);
        pw[at[i]] = hi;
        pw[GMAX * 16 + at[i]] = __float2half_rn(pv[i] - __half2float(hi));
      }
    }
    __syncwarp();
    const u32 bh0 = *reinterpret_cast<const u32*>(pw + g * 16 + 2 * t);
    const u32 bh1 = *reinterpret_cast<const u32*>(pw + g * 16 + 2 * t + 8);
    const u32 bl0 = *reinterpret_cast<const u32*>(pw + GMAX * 16 + g * 16 + 2 * t);
    const u32 bl1 = *reinterpret_cast<const u32*>(pw + GMAX * 16 + g * 16 + 2 * t + 8);
    __syncwarp();  // pw is rewritten by the next tile

    // O^T += V^T P.
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      u32 a0, a1, a2, a3;
      ldsm_x4_trans(a0, a1, a2, a3, Vs + (kw + (lane & 7) + ((lane >> 4) << 3)) * ROW + dt * 16 + ((lane >> 3) & 1) * 8);
      mma16816(o[dt], a0, a1, a2, a3, bh0, bh1);
      mma16816(o[dt], a0, a1, a2, a3, bl0, bl1);
    }
  }

  // The 4 warps' (m, l, O) meet in shared memory (over the tile stages: all reads are done).
#pragma unroll
  for (int off = 4; off < WARP; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();
  float* fin = reinterpret_cast<float*>(smem);               // (4 warps, GMAX heads, D)
  float* ml = reinterpret_cast<float*>(smem + C::ML_OFF);    // (4 warps, GMAX heads, 2)
  float* fw = fin + warp * GMAX * D;
  const float inv = 1.0f / PSCALE;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    fw[(2 * t) * D + 16 * dt + g] = o[dt][0] * inv;
    fw[(2 * t + 1) * D + 16 * dt + g] = o[dt][1] * inv;
    fw[(2 * t) * D + 16 * dt + g + 8] = o[dt][2] * inv;
    fw[(2 * t + 1) * D + 16 * dt + g + 8] = o[dt][3] * inv;
  }
  if (g == 0) {
    float* mw = ml + warp * GMAX * 2;
    mw[(2 * t) * 2] = m0;
    mw[(2 * t) * 2 + 1] = l0;
    mw[(2 * t + 1) * 2] = m1;
    mw[(2 * t + 1) * 2 + 1] = l1;
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += NT) {
    const int hh = i / D, e = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, ml[(w * GMAX + hh) * 2]);
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float mw = ml[(w * GMAX + hh) * 2];
      const float wt = mw == -INFINITY ? 0.f : exp2f(mw - M);  // idle warps weigh 0
      acc += wt == 0.f ? 0.f : wt * fin[(w * GMAX + hh) * D + e];
      L += wt * ml[(w * GMAX + hh) * 2 + 1];
    }
    if (out) write_out(out, xq, xds, kbp, b, hq, D, h0 + hh, e, acc / L);
    else part_o[((row0 + hh) * splits + split) * D + e] = acc;
  }
  if (tid < gc && !out) {
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, ml[(w * GMAX + tid) * 2]);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float mw = ml[(w * GMAX + tid) * 2];
      L += mw == -INFINITY ? 0.f : exp2f(mw - M) * ml[(w * GMAX + tid) * 2 + 1];
    }
    part_ml[(row0 + tid) * splits + split] = make_float2(M, L);
  }
}

// Pass 2: out[b, h*D + e] = sum_s o_s[e] w_s / sum_s l_s w_s with w_s = exp2(m_s - max_s m_s).
// One CTA per (sequence, head); thread (c4, sg) reads float4 column c4 of splits sg, sg + SG,
// ... (SG = blockDim / (D/4), the launcher's choice), all its loads issued before the first
// warp turns the (max, sum) pairs into weights, so the two L2 round trips overlap (at B = 1
// there are only hq CTAs and up to 128 splits to read). The SG sums meet in shared memory and
// the first D threads finish: a row with no visible key (ctx_len 0) gets zeros. With xq set,
// out is also written in the mat-vec kernels' int8 format (xquant.cuh; the whole (B, hq*D)
// output is one column per sequence): those D threads hold whole 32-element blocks, D % 32 == 0.
template <int D>
__global__ void __launch_bounds__(MERGE_THREADS)
attn_decode_merge(const float* __restrict__ part_o, const float2* __restrict__ part_ml, float* __restrict__ out,
                  int hq, int splits, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
  constexpr int V4 = D / 4;
  constexpr int SGMAX = MERGE_THREADS / V4;
  constexpr int SPT = (MAX_SPLITS + SGMAX - 1) / SGMAX;  // splits per thread at most
  __shared__ float wgt[MAX_SPLITS];
  __shared__ float inv_s;
  __shared__ __align__(16) float4 sums[SGMAX * V4];
  const long long bh = blockIdx.x;
  const int b = (int)(bh / hq), h = (int)(bh % hq);
  const int tid = threadIdx.x, c4 = tid % V4, sg = tid / V4, nsg = blockDim.x / V4;
  const float4* po = reinterpret_cast<const float4*>(part_o + bh * splits * D) + c4;
  float4 v[SPT];
#pragma unroll
  for (int j = 0; j < SPT; ++j) {
    const int s = sg + j * nsg;
    v[j] = s < splits ? po[(long long)s * V4] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (tid < WARP) {
    const float2* ml = part_ml + bh * splits;
    float mj[MAX_SPLITS / WARP], lj[MAX_SPLITS / WARP], M = -INFINITY;
#pragma unroll
    for (int j = 0; j < MAX_SPLITS / WARP; ++j) {
      const int s = tid + WARP * j;
      const float2 x = s < splits ? ml[s] : make_float2(-INFINITY, 0.f);
      mj[j] = x.x;
      lj[j] = x.y;
      M = fmaxf(M, x.x);
    }
    M = warp_max(M);
    float S = 0.f;
#pragma unroll
    for (int j = 0; j < MAX_SPLITS / WARP; ++j) {
      const int s = tid + WARP * j;
      const float w = mj[j] == -INFINITY ? 0.f : exp2f(mj[j] - M);  // empty splits weigh 0
      if (s < splits) wgt[s] = w;
      S += lj[j] * w;
    }
    S = warp_sum(S);
    if (tid == 0) inv_s = S > 0.f ? 1.0f / S : 0.f;
  }
  __syncthreads();
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < SPT; ++j) {
    const int s = sg + j * nsg;
    const float w = s < splits ? wgt[s] : 0.f;
    if (w != 0.f) {  // an empty split's o was never written: skip it, never multiply by 0
      o.x = fmaf(w, v[j].x, o.x); o.y = fmaf(w, v[j].y, o.y);
      o.z = fmaf(w, v[j].z, o.z); o.w = fmaf(w, v[j].w, o.w);
    }
  }
  if (sg < nsg) sums[sg * V4 + c4] = o;
  __syncthreads();
  if (tid < D) {
    const float* sf = reinterpret_cast<const float*>(sums);
    float r = 0.f;
    for (int i = 0; i < nsg; ++i) r += sf[i * D + tid];
    r *= inv_s;
    const int K = hq * D, k = h * D + tid;
    out[(long long)b * K + k] = r;
    if (xq) quantize_block32(r, tid % WARP, xq + (long long)b * 2 * K + (k - tid % WARP), K, xds + (long long)b * kbp + k / 32);
  }
}
