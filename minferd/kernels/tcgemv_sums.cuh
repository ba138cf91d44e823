// tcgemv's K loop (tc_sums: a warp's 16-row tiles of one split, x staged in shared memory) and
// what its epilogues share: which row and token an accumulator holds, and the cluster's
// barrier and remote loads. tcgemv.cu (products) and tcgemv_glu.cu (gated activations) end it.
#pragma once
#include "pdl.cuh"
#include "tcgemv_decoders.cuh"

#ifndef MINFERD_HOST_TEST
// The f16 elements of x a staged row holds: 256 of K (one Q4_K / Q6_K block, eight Q8_0 blocks)
// and a pad that keeps the 8 token rows a B load reads on distinct banks (16-byte loads:
// a row is 36 16-byte units, = 4 mod 8; 8-byte loads: 136 words, = 8 mod 32).
template <typename T> __host__ __device__ constexpr int stage_row() { return 256 + (T::XPAIR ? 32 : 16); }

// Grid (row tiles of 16 RT KW rows, splits); a CTA is KW warps, warp w owning the 16 RT rows at
// tile * 16 RT KW + 16 RT w of its matrix (tc_pick, below), all of them walking the split's blocks
// [z*bps, (z+1)*bps) in stages of 256 elements of K: the CTA copies each stage's x (8 NT8 token
// rows) into shared memory once, a stage ahead (cp.async, two buffers), and every warp reads its B
// fragments there. (x read from global memory by every warp was 3.5x the weight bytes in L1
// traffic, and ncu found the warps stalled on it: 65% of cycles long-scoreboard, 0.27 issues a
// cycle.) Token rows past M read row M-1 again, and their sums are never stored (a column of the
// mma's output depends on its own column of B only). PF: a warp issues the weight loads of the
// block PF ahead before it decodes this one (PF + 1 blocks in registers), so its bytes stay in
// flight while it decodes.
// The CTA's sums of its split land in acc; the kernels below differ in how splits meet.
template <int TYPE, int NT8, int RT, int KW, int PF>
__device__ __forceinline__ void tc_sums(const u8* __restrict__ W, i64 row_bytes, int nb, int N, int M, int K, int bps,
                                        const u16* __restrict__ x16, int row0, int z, u16* xs,
                                        float (&acc)[RT][NT8][4]) {
  typedef TcW<TYPE> T;
  constexpr int SB = 256 / T::QK, XS = stage_row<T>(), TOK = 8 * NT8;
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int b0 = z * bps, b1 = min(nb, b0 + bps);
  const u8* rp[RT][2];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) rp[t][h] = W + (i64)min(row0 + 16 * t + g + 8 * h, N - 1) * row_bytes;

  // Stage (blocks bs .. bs + SB - 1) into buffer buf: warp w copies token rows w, w + KW, ..., a
  // lane one 16-byte chunk of each; chunks past the split's last block are not copied (never read).
  const int kend = b1 * T::QK;
  const u32 xs0 = saddr(xs) + 16 * lane;
  auto stage = [&](int buf, int bs) {
    const int e = bs * T::QK + 8 * lane;
    if (e < kend) {
#pragma unroll
      for (int j = 0; j < TOK / KW; ++j) {
        const int r = kw + KW * j;
        cp16(xs0 + 2 * (buf * TOK + r) * XS, x16 + min(r, M - 1) * K + e, 16);
      }
    }
    cp_commit();
  };

#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][n][e] = 0.f;

  T w[PF + 1][RT][2];  // PF + 1 blocks in registers: the one being decoded and PF ahead
  auto fetch = [&](T (&dst)[RT][2], int b) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) dst[t][h].fetch(rp[t][h] + (i64)b * T::BB, c);
  };
  // Block cur, the u-th of its stage (x in buffer xb), into acc.
  auto decode = [&](T (&cur)[RT][2], const u16* xb, int u) {
    uint4 xq[NT8];  // XPAIR: steps k, k + 1's B registers from one load
#pragma unroll
    for (int k = 0; k < T::STEPS; ++k) {
      if (k == 0) {
#pragma unroll
        for (int t = 0; t < RT; ++t) cur[t][0].prep(), cur[t][1].prep();
      }
      u32 a[RT][4];
#pragma unroll
      for (int t = 0; t < RT; ++t) {
        cur[t][0].frag(k, a[t][0], a[t][2]);
        cur[t][1].frag(k, a[t][1], a[t][3]);
      }
      const int xo = u * T::QK + T::xoff(k, c);
#pragma unroll
      for (int n = 0; n < NT8; ++n) {
        const u16* xp = xb + (8 * n + g) * XS + xo;
        u32 f0, f1;
        if constexpr (T::XPAIR) {
          if ((k & 1) == 0) xq[n] = *reinterpret_cast<const uint4*>(xp);
          f0 = (k & 1) ? xq[n].z : xq[n].x;
          f1 = (k & 1) ? xq[n].w : xq[n].y;
        } else {
          x_frag(xp, f0, f1);
        }
#pragma unroll
        for (int t = 0; t < RT; ++t) mma16816(acc[t][n], a[t], f0, f1);
      }
    }
  };
  // Stage si's x must have landed before its first block; the next stage's copy goes out first.
  auto enter_stage = [&](int bs, int si) {
    if (bs + SB < b1) stage((si + 1) & 1, bs + SB);
    else cp_commit();  // an empty group: wait_group 1 below still means this stage's copy
    cp_wait<1>();
    __syncthreads();
  };
#pragma unroll
  for (int i = 0; i < PF; ++i)
    if (b0 + i < b1) fetch(w[i], b0 + i);
  stage(0, b0);
  if constexpr (SB == 1) {
    // 256-element blocks (one a stage): a ring, block b in w[(b - b0) % R], the loop R blocks a
    // trip, unrolled, so every ring index is a compile-time constant and block b + PF's loads go
    // straight into the registers it will be decoded from. Turned by copies (w[0] = w[1] after
    // each block, below) the compiler hoisted those moves to the middle of the block, where each
    // waited for loads issued ~180 instructions before (ncu's largest stall: long-scoreboard);
    // the ring took Q4_K 6-20% faster at 16-64 tokens, Q6_K level (bench/NOTES.md, session 19).
    constexpr int R = PF + 1;
    for (int bb = b0; bb < b1; bb += R) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int b = bb + r, si = (bb - b0) + r;
        if (b >= b1) break;
        enter_stage(b, si);
        if (b + PF < b1) fetch(w[(r + PF) % R], b + PF);
        decode(w[r], xs + (si & 1) * TOK * XS, 0);
        __syncthreads();  // the next stage() overwrites the buffer read two stages back
      }
    }
  } else {
    // Smaller blocks, SB of them a stage: turned by copies (a ring for these, a stage a trip, took
    // Q8_0 up to 40% slower at 32 tokens).
    for (int bs = b0, si = 0; bs < b1; bs += SB, ++si) {
      enter_stage(bs, si);
      const u16* xb = xs + (si & 1) * TOK * XS;
#pragma unroll
      for (int u = 0; u < SB; ++u) {
        const int b = bs + u;
        if (b >= b1) break;
        if (b + PF < b1) fetch(w[PF], b + PF);
        decode(w[0], xb, u);
#pragma unroll
        for (int i = 0; i < PF; ++i)
#pragma unroll
          for (int t = 0; t < RT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) w[i][t][h] = w[i + 1][t][h];
      }
      __syncthreads();  // the next iteration's stage() overwrites the buffer read two stages back
    }
  }

}

// Accumulator (t, n, e) of lane (g, c) in a warp owning rows row0..: e = 0, 1 row g, tokens 2c,
// 2c+1 of tile n; e = 2, 3 row g + 8.
__device__ __forceinline__ int acc_row(int row0, int t, int e) {
  return row0 + 16 * t + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1);
}
__device__ __forceinline__ int acc_token(int n, int e) {
  return 8 * n + 2 * (threadIdx.x & 3) + (e & 1);
}

// Hopper's clusters (sm_90): a barrier over the cluster's CTAs, and a load from CTA rank's shared
// memory at the address `local` has in this CTA's.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float ld_cluster(u32 local, u32 rank) {
  u32 a;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
// A cluster's sums of its row tile: each CTA parks its accumulators in its own shared memory (xs,
// free once tc_sums is done), and after a cluster barrier CTA z adds slots z, z + CL, ... of its
// NTH threads over ranks 0..CL-1 in order (the split sum's order from 0.0f: the same bits), handing
// each to done(t, n, e, v). The caller's cluster_sync() afterwards keeps the parked sums alive
// until every CTA has read them.
template <int RT, int NT8, int NTH, int CL, class Done>
__device__ __forceinline__ void cluster_sums(const float (&acc)[RT][NT8][4], u16* xs, int z, Done done) {
  constexpr int NE = RT * NT8 * 4;
  float* sums = reinterpret_cast<float*>(xs);
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[((t * NT8 + n) * 4 + e) * NTH + threadIdx.x] = acc[t][n][e];
  cluster_sync();
  const u32 base = saddr(sums) + 4 * threadIdx.x;
  for (int i = z; i < NE; i += CL) {
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < CL; ++r) v += ld_cluster(base + 4 * i * NTH, r);
    done(i / (NT8 * 4), i / 4 % NT8, i % 4, v);
  }
}
#endif
