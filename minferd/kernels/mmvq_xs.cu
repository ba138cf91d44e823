// One decode column (n = 1) of quantized matrices, x-stationary: out (rows) = W @ x.
//
// Why: mmvq.cu reloads its lane's slice of x (two int8 planes and the block scales, 64 bytes
// for 16 bytes of Q4_K) for every unit of every row it walks. ncu put that kernel at ~0.11 warp
// instructions an element with long-scoreboard stalls on top (bench/results/s20), and a version
// that streamed the weights through shared memory by bulk copies ran slower still (NOTES s24):
// the consumer side, x's traffic through L1 and the instructions around it, is the limit, not the
// weights' loads. Here each thread owns UPL fixed units of the row (unit i = thread + j * threads),
// loads x's slice for them once into registers, and then walks the CTA's rows reading only weight
// bytes: the x traffic is gone from the loop, and the unit's position (block, offset in it) is fixed
// for the thread, so only the row pointer moves.
//
// Work split: a CTA is as many threads as the row has units (over UPL; a 3584-long Q4_K row is 112
// units: 128 threads, 16 idle; at most MAX_THREADS), and owns rpc consecutive rows. It takes R rows at a time (their
// loads all issued before any is used), and each thread leaves one partial sum a row in shared
// memory (rpc x threads floats); at the end a warp a row adds them up and stores through the
// shared epilogue (bias, residual). Threads past the row's units fetch unit 0 and add nothing.
// Up to three matrices of one type and K share a launch, as in mmvq (CTAs [0, cta1) on W0, ...).
//
// The units and x's format are mmvq's (mmvq_units_k.cuh, xquant.cuh): the same products per unit,
// added in another order. CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_mmvq_xs.py).
#include "pdl.cuh"
#include "mmvq_units_k.cuh"
#include "mmv_epilogue.cuh"

// At most 512 threads: 128 registers a thread (a unit's x slice is 20-36 of them; 1024 would spill).
constexpr int MAX_THREADS = 512;

// R rows from `rp` (row_bytes apart; from `last` on, row `last` again, its sum not kept): every
// load issued before any is used. A thread past the row's units computes unit 0 and keeps 0:
// a branch around its work would let the compiler sink loads past it.
template <typename Unit, typename X, int UPL, int R>
__device__ __forceinline__ void rows_step(const u8* __restrict__ rp, i64 row_bytes, int last, const int (&boff)[UPL],
                                          const int (&uu)[UPL], const bool (&ok)[UPL], const X (&xv)[UPL],
                                          float* __restrict__ part, int nt) {
  Unit w[R][UPL];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < UPL; ++j) w[r][j].fetch(rp + (i64)min(r, last) * row_bytes + boff[j], uu[j]);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < UPL; ++j) {
      w[r][j].decode();
      const float d = w[r][j].dot(xv[j]);
      a += ok[j] ? d : 0.0f;
    }
    if (r <= last) part[r * nt] = a;
  }
}

template <int TYPE, int UPL, int R>
__global__ void __launch_bounds__(MAX_THREADS)
mmvq_xs(const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int rows0, int rows1,
        int rows2, int cta1, int cta2, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2,
        const float* __restrict__ bias0, const float* __restrict__ bias1, const float* __restrict__ bias2,
        i64 row_bytes, int nb, const i8* __restrict__ xq, const float2* __restrict__ xds, int K, int rpc,
        const float* __restrict__ res) {
  pdl_enter();
  typedef typename UnitOf<TYPE>::T Unit;
  typedef decltype(((const Unit*)nullptr)->xload((const i8*)nullptr, 0, (const float2*)nullptr)) X;
  constexpr int U = Unit::U, QK = Unit::QK, BB = Unit::BB;
  extern __shared__ float part[];  // [rpc][threads]
  const int seg = blockIdx.x < cta1 ? 0 : (blockIdx.x < cta2 ? 1 : 2);
  const u8* __restrict__ W = seg == 0 ? W0 : (seg == 1 ? W1 : W2);
  const int nrows = seg == 0 ? rows0 : (seg == 1 ? rows1 : rows2);
  float* __restrict__ out = seg == 0 ? out0 : (seg == 1 ? out1 : out2);
  const float* __restrict__ bias = seg == 0 ? bias0 : (seg == 1 ? bias1 : bias2);
  const int bx = blockIdx.x - (seg == 0 ? 0 : (seg == 1 ? cta1 : cta2));
  const int t = threadIdx.x, nt = blockDim.x, nunits = nb * U;
  const int rbeg = bx * rpc, nr = min(rpc, nrows - rbeg);
  const u8* __restrict__ first = W + (i64)rbeg * row_bytes;

  int boff[UPL], uu[UPL];
  bool ok[UPL];
  X xv[UPL];
#pragma unroll
  for (int j = 0; j < UPL; ++j) {
    const int i0 = t + j * nt;
    ok[j] = i0 < nunits;
    const int i = ok[j] ? i0 : 0, b = i / U;
    boff[j] = b * BB; uu[j] = i % U;
    Unit probe;  // its fetch sets the unit's position, which xload reads (its bytes: row rbeg's, reread below)
    probe.fetch(first + boff[j], uu[j]);
    xv[j] = probe.xload(xq + (i64)b * QK, K, xds + b * (QK / 32));
  }

  const u8* rp = first;
  int r0 = 0;
  for (; r0 + R <= nr; r0 += R, rp += R * row_bytes)
    rows_step<Unit, X, UPL, R>(rp, row_bytes, R - 1, boff, uu, ok, xv, part + r0 * nt + t, nt);
  if (r0 < nr) rows_step<Unit, X, UPL, R>(rp, row_bytes, nr - 1 - r0, boff, uu, ok, xv, part + r0 * nt + t, nt);
  __syncthreads();
  const int lane = t & 31, warp = t >> 5, nw = nt >> 5;
  for (int r = warp; r < nr; r += nw) {
    float v = 0.0f;
    for (int i = lane; i < nt; i += 32) v += part[r * nt + i];
    v = warp_sum(v);
    if (lane == 0) store_out(out, bias, res, nrows, 0, rbeg + r, v);
  }
}
