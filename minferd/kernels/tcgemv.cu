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
// The decoders (fragments, TcW<T>) are tcgemv_decoders.cuh, the K loop tcgemv_sums.cuh.
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_tcgemv.py).
#include "pdl.cuh"
#include "tcgemv_sums.cuh"

#ifndef MINFERD_HOST_TEST
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
// every CTA's shared memory alive until the others have read it (cluster_sums).
// Grid (the group's row tiles, CL): blockIdx.y is both the split and the CTA's rank in its cluster.
template <int TYPE, int NT8, int RT, int KW, int PF, int CL>
__global__ void __cluster_dims__(1, CL, 1) __launch_bounds__(KW * 32)
tcgemv_cl(TC_GROUP_PARAMS, i64 row_bytes, int nb, int M, int K, int bps, const u16* __restrict__ x16,
          const float* __restrict__ res) {
  pdl_enter();
  extern __shared__ __align__(16) u16 xs[];  // [2][TOK][XS], then this CTA's sums [NE][NTH] (f32)
  const TcPick p = tc_pick(t1, t2);
  const int N = of3(p.i, N0, N1, N2), row0 = (p.tile * KW + (threadIdx.x >> 5)) * 16 * RT, z = blockIdx.y;
  float acc[RT][NT8][4];
  tc_sums<TYPE, NT8, RT, KW, PF>(of3(p.i, W0, W1, W2), row_bytes, nb, N, M, K, bps, x16, row0, z, xs, acc);
  float* out = of3(p.i, out0, out1, out2);
  const float* bias = of3(p.i, bias0, bias1, bias2);
  cluster_sums<RT, NT8, KW * 32, CL>(acc, xs, z, [&](int t, int n, int e, float v) {
    const int row = acc_row(row0, t, e), m = acc_token(n, e);
    if (row < N && m < M) {
      const i64 o = (i64)m * N + row;
      out[o] = v + (bias ? __ldg(bias + row) : 0.0f) + (res ? __ldg(res + o) : 0.0f);
    }
  });
  cluster_sync();
}
#endif
