// Quantized matrix x a small batch on the f16 tensor cores, the weights decoded in registers
// straight into mma fragments:
//   out (M, N) f32 = x (M, K) @ dequant(W)(N, K).T (+ bias[n]) (+ res[m, n]),  M <= 64,
// W = raw GGUF rows of Q4_K, Q6_K or Q8_0. For decode steps of many sequences (and short
// prefill chunks): such a step is bound by reading W, which this reads once, as its quantized
// bytes, for all M tokens.
//
// Why not mmq_small.cu (int8 mma): it round-trips every decoded block through shared memory
// behind a barrier and scales its int32 results per (row, token, 32-chunk); bench/mmq_small.py
// measured it issue-bound at ~1 TB/s. Here a warp owns 16*RT rows, decodes each weight once into
// f16 in registers (y = d*sc*q - dmin*m in one f16 FMA from the exact 1024 + q a byte permute
// makes), and feeds mma.sync m16n8k16 (f16 in, f32 accumulators): the weights never pass through
// shared memory (only x does, staged once for the CTA's warps), no per-chunk epilogue, the
// block's scale applied in the decode.
//
// The decoders (fragments, TcW<T>) are tcgemv_decoders.cuh.
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_tcgemv.py).
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

// Up to three matrices of one type and K that read the same x (q/k/v, gate/up) share a launch:
// CTA columns [0, t1) hold matrix 0's row tiles, [t1, t2) matrix 1's, [t2, gridDim.x) matrix 2's
// (a launch each cost a short prefill's pass ~3 graph nodes a layer): tcgemv_g in one split,
// tcgemv_cl in a cluster. One matrix: t1 = t2 = its tiles.
#define TC_GROUP_PARAMS                                                                                          \
  const u8 *__restrict__ W0, const u8 *__restrict__ W1, const u8 *__restrict__ W2, int N0, int N1, int N2,      \
      int t1, int t2, float *__restrict__ out0, float *__restrict__ out1, float *__restrict__ out2,               \
      const float *__restrict__ bias0, const float *__restrict__ bias1, const float *__restrict__ bias2
// The CTA's matrix (i) and its row tile there. Only i lives through the K loop: the epilogue
// picks its output and bias from the parameters again (holding those pointers through it took a
// Q4_K kernel from 96 to 110 registers).
struct TcPick {
  int i, tile;
};
__device__ __forceinline__ TcPick tc_pick(int t1, int t2) {
  const int x = blockIdx.x;
  return x < t1 ? TcPick{0, x} : x < t2 ? TcPick{1, x - t1} : TcPick{2, x - t2};
}
template <typename P> __device__ __forceinline__ P of3(int i, P a, P b, P c) { return i == 0 ? a : i == 1 ? b : c; }

// A CTA's sums of its row tile, each handed to store(z, m, row, v) once the K loop is done (the
// stores pick their pointers then, so no pointer but the weights' lives through the loop).
template <int TYPE, int NT8, int RT, int KW, int PF, class Store>
__device__ __forceinline__ void tc_tile(const u8* __restrict__ W, i64 row_bytes, int nb, int N, int M, int K, int bps,
                                        const u16* __restrict__ x16, int tile, Store store) {
  extern __shared__ __align__(16) u16 xs[];  // [2][TOK][XS]
  const int row0 = (tile * KW + (threadIdx.x >> 5)) * 16 * RT, z = blockIdx.y;
  float acc[RT][NT8][4];
  tc_sums<TYPE, NT8, RT, KW, PF>(W, row_bytes, nb, N, M, K, bps, x16, row0, z, xs, acc);
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = acc_row(row0, t, e), m = acc_token(n, e);
        if (row < N && m < M) store(z, m, row, acc[t][n][e]);
      }
}

// One matrix. part == nullptr: one split, out gets bias and residual; else part[z][m][n]
// (mmq_small's split_sum adds them: a last-CTA reduction in the kernel, tried, was latency-bound
// on one CTA's 128 threads and took 3584 x 3584 at 16 tokens from 11 to 18 us).
template <int TYPE, int NT8, int RT, int KW, int PF>
__global__ void __launch_bounds__(KW * 32)
tcgemv(const u8* __restrict__ W, i64 row_bytes, int nb, int N, int M, int K, int bps, const u16* __restrict__ x16,
       float* __restrict__ out, const float* __restrict__ bias, const float* __restrict__ res,
       float* __restrict__ part) {
  pdl_enter();
  tc_tile<TYPE, NT8, RT, KW, PF>(W, row_bytes, nb, N, M, K, bps, x16, blockIdx.x, [&](int z, int m, int row, float v) {
    if (part) {
      part[((i64)z * M + m) * N + row] = v;
    } else {
      const i64 o = (i64)m * N + row;
      out[o] = v + (bias ? __ldg(bias + row) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
    }
  });
}

// A group in one split (no partials, no residual): each CTA's row tile of its matrix.
template <int TYPE, int NT8, int RT, int KW, int PF>
__global__ void __launch_bounds__(KW * 32)
tcgemv_g(TC_GROUP_PARAMS, i64 row_bytes, int nb, int M, int K, int bps, const u16* __restrict__ x16) {
  pdl_enter();
  const TcPick p = tc_pick(t1, t2);
  const int N = of3(p.i, N0, N1, N2);
  tc_tile<TYPE, NT8, RT, KW, PF>(of3(p.i, W0, W1, W2), row_bytes, nb, N, M, K, bps, x16, p.tile,
                                 [&](int, int m, int row, float v) {
                                   const float* bias = of3(p.i, bias0, bias1, bias2);
                                   of3(p.i, out0, out1, out2)[(i64)m * N + row] = v + (bias ? __ldg(bias + row) : 0.0f);
                                 });
}

// Hopper's clusters (sm_90): the CL splits of a row tile are one cluster, and meet in distributed
// shared memory instead of global partials and a second launch (182 of a 16-sequence step's 606
// launches were split sums). Each CTA parks its sums in its own shared memory; after a cluster
// barrier CTA r adds sums r, r + CL, ... over the CTAs 0..CL-1 in order (the split sum's order
// from 0.0f, so the same bits) and stores them with bias and residual; a second barrier keeps
// every CTA's shared memory alive until the others have read it.
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

// Grid (the group's row tiles, CL): blockIdx.y is both the split and the CTA's rank in its cluster.
template <int TYPE, int NT8, int RT, int KW, int PF, int CL>
__global__ void __cluster_dims__(1, CL, 1) __launch_bounds__(KW * 32)
tcgemv_cl(TC_GROUP_PARAMS, i64 row_bytes, int nb, int M, int K, int bps, const u16* __restrict__ x16,
          const float* __restrict__ res) {
  pdl_enter();
  constexpr int NE = RT * NT8 * 4, NTH = KW * 32;
  extern __shared__ __align__(16) u16 xs[];  // [2][TOK][XS], then this CTA's sums [NE][NTH] (f32)
  const TcPick p = tc_pick(t1, t2);
  const int N = of3(p.i, N0, N1, N2), row0 = (p.tile * KW + (threadIdx.x >> 5)) * 16 * RT, z = blockIdx.y;
  float acc[RT][NT8][4];
  tc_sums<TYPE, NT8, RT, KW, PF>(of3(p.i, W0, W1, W2), row_bytes, nb, N, M, K, bps, x16, row0, z, xs, acc);
  float* out = of3(p.i, out0, out1, out2);
  const float* bias = of3(p.i, bias0, bias1, bias2);
  float* sums = reinterpret_cast<float*>(xs);  // tc_sums ends behind a barrier: xs is free
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[((t * NT8 + n) * 4 + e) * NTH + threadIdx.x] = acc[t][n][e];
  cluster_sync();
  const u32 base = saddr(sums) + 4 * threadIdx.x;
  for (int i = z; i < NE; i += CL) {
    const int t = i / (NT8 * 4), n = i / 4 % NT8, e = i % 4;
    const int row = acc_row(row0, t, e), m = acc_token(n, e);
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < CL; ++r) v += ld_cluster(base + 4 * i * NTH, r);
    if (row < N && m < M) {
      const i64 o = (i64)m * N + row;
      out[o] = v + (bias ? __ldg(bias + row) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
    }
  }
  cluster_sync();
}
#endif
