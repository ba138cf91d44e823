// A short prompt's gated MLP activation in the gate / up products' own launch:
//   y (M, N) = act(x @ dequant(Wg).T) * (x @ dequant(Wu).T),  y16 its f16 rounding,  M <= 32,
// act 0 SiLU (SwiGLU), 1 GELU-tanh (Gemma's GeGLU). A CTA's first KW/2 warps take gate's rows,
// the other KW/2 the same rows of up (tcgemv_sums.cuh's K loop for both, over one staged x), and
// they meet in shared memory: the activation launch goes (a graph node a layer) and so do the f32
// gate and up outputs it read (2 x 4 M N bytes written and read again).
// The sums are tcgemv_g's and tcgemv_cl's (the same K loop, the same order), and act's
// arithmetic is cuda_ops' _swiglu / _gelu's: y and y16 carry the bits of tcgemv_group then the
// activation (tests/cuda/test_tcgemv_glu.py).
//
// CPU reference: act(x @ Wg.T) * (x @ Wu.T) through dequant_ref (the same test).
#include "pdl.cuh"
#include "tcgemv_sums.cuh"

#ifndef MINFERD_HOST_TEST
// cuda_ops' _swiglu and _gelu, term for term (one expression: the same contractions).
__device__ __forceinline__ float glu_act(float g, float u, int act) {
  return act == 0 ? g / (1.0f + expf(-g)) * u
                  : 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
}

// Warp w < KW/2 of the CTA owns gate rows row0.., warp w + KW/2 the same rows of up.
template <int RT, int KW> __device__ __forceinline__ int glu_row0(int tile) {
  static_assert(KW % 2 == 0, "gate and up take half the warps each");
  return (tile * (KW / 2) + (int)(threadIdx.x >> 5) % (KW / 2)) * 16 * RT;
}
__device__ __forceinline__ void glu_store(float* y, u16* y16, int N, int M, int row, int m, float g, float u,
                                          int act) {
  if (row < N && m < M) {
    const float v = glu_act(g, u, act);
    const i64 o = (i64)m * N + row;
    y[o] = v;
    y16[o] = f2h_rn(v);
  }
}

// Grid (row tiles of 16 RT KW/2 rows, 1): the whole of K in one split.
template <int TYPE, int NT8, int RT, int KW, int PF>
__global__ void __launch_bounds__(KW * 32)
tcgemv_glu(const u8* __restrict__ Wg, const u8* __restrict__ Wu, int N, i64 row_bytes, int nb, int M, int K,
           const u16* __restrict__ x16, int act, float* __restrict__ y, u16* __restrict__ y16) {
  pdl_enter();
  constexpr int HALF = KW * 16;  // threads a half
  extern __shared__ __align__(16) u16 xs[];  // [2][TOK][XS]; then gate's sums [RT NT8 4][HALF] (f32)
  const bool up = threadIdx.x >= HALF;
  const int row0 = glu_row0<RT, KW>(blockIdx.x), h = threadIdx.x % HALF;
  float acc[RT][NT8][4];
  tc_sums<TYPE, NT8, RT, KW, PF>(up ? Wu : Wg, row_bytes, nb, N, M, K, nb, x16, row0, 0, xs, acc);
  float* gs = reinterpret_cast<float*>(xs);  // tc_sums ends behind a barrier: xs is free
  if (!up) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int n = 0; n < NT8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) gs[((t * NT8 + n) * 4 + e) * HALF + h] = acc[t][n][e];
  }
  __syncthreads();
  if (up) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int n = 0; n < NT8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          glu_store(y, y16, N, M, acc_row(row0, t, e), acc_token(n, e), gs[((t * NT8 + n) * 4 + e) * HALF + h],
                    acc[t][n][e], act);
  }
}

// Grid (row tiles, CL), the CL splits of a tile one cluster (tcgemv_cl's): CTA z adds slots z,
// z + CL, ... of every thread (cluster_sums) and leaves them in its shared memory past the parked
// sums, where the up thread HALF past a gate thread finds both.
template <int TYPE, int NT8, int RT, int KW, int PF, int CL>
__global__ void __cluster_dims__(1, CL, 1) __launch_bounds__(KW * 32)
tcgemv_glu_cl(const u8* __restrict__ Wg, const u8* __restrict__ Wu, int N, i64 row_bytes, int nb, int M, int K,
              int bps, const u16* __restrict__ x16, int act, float* __restrict__ y, u16* __restrict__ y16) {
  pdl_enter();
  constexpr int NTH = KW * 32, HALF = NTH / 2, NE = RT * NT8 * 4;
  extern __shared__ __align__(16) u16 xs[];  // [2][TOK][XS]; the parked sums [NE][NTH], then the added [NE / CL][NTH]
  const bool up = threadIdx.x >= HALF;
  const int row0 = glu_row0<RT, KW>(blockIdx.x), z = blockIdx.y;
  float acc[RT][NT8][4];
  tc_sums<TYPE, NT8, RT, KW, PF>(up ? Wu : Wg, row_bytes, nb, N, M, K, bps, x16, row0, z, xs, acc);
  float* added = reinterpret_cast<float*>(xs) + NE * NTH;
  cluster_sums<RT, NT8, NTH, CL>(acc, xs, z, [&](int t, int n, int e, float v) {
    added[((t * NT8 + n) * 4 + e) / CL * NTH + threadIdx.x] = v;
  });
  __syncthreads();
  if (up) {
    for (int i = z; i < NE; i += CL) {
      const int t = i / (NT8 * 4), n = i / 4 % NT8, e = i % 4;
      const float* a = added + i / CL * NTH + threadIdx.x;
      glu_store(y, y16, N, M, acc_row(row0, t, e), acc_token(n, e), a[-HALF], a[0], act);
    }
  }
  cluster_sync();
}
#endif
