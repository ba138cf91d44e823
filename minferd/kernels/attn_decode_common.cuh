// The pieces both decode-attention kernels of attn_decode.cu share: warp reductions, cp.async,
// f16 row conversions, the mma and ldmatrix wrappers, the split of a sequence's keys between
// CTAs, the output writers, and the double-buffered K/V tile loader. attn_decode.cu's header
// says how the kernels use them.
#pragma once
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
  if (xq) quantize_block32(v, lane, xq + (long long)b * 2 * K, K, k / 32, xds + (long long)b * kbp);
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

__device__ __forceinline__ void check_smem(unsigned need) {
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < need) __trap();  // launcher and kernel disagree on the layout
}
