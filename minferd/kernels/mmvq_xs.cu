// A probe (bench/xs_probe.py), not a serving path yet: the one-column mat-vec with x held in
// registers ("x-stationary") instead of re-read from L1 for every row group.
//
// Why ask: mmvq_rows walks a row group's K with every lane, so each trip of a lane re-loads the x
// of its unit (Q4_K: 64 bytes of int8 planes and 16 of (d, sum) for 16 weight bytes a row, shared
// by R rows) and a K = 3584 row is only two trips, a CTA's life two round trips to HBM with ~1 KB
// a warp in flight. Here a CTA's threads split K once (thread t owns units t, t + NT, ...: a warp
// reads one row's 32 neighbouring units, a few whole lines), load their x before the first row and
// keep it, then walk the CTA's rows: each trip fetches RB rows' units, a ring of two trips (the
// next trip's loads issued before this one's arithmetic, the loop unrolled over the ring: no
// register copies), so a lane always has a trip of weights in flight and does no x load at all.
// Each row's partial sums meet by a warp sum and one shared-memory add across the warps at the end.
//
// The price: x's registers (Q4_K 20 a unit) times UPT, and threads idle where K's units do not
// fill NT x UPT (Q4_K at K = 3584: 112 units on 128 threads).
//
// CPU reference: x @ dequant_ref.dequantize(W).T, as mmvq's (tests/cuda/test_mmvq_xs.py).
#include "pdl.cuh"
#include "mmvq.cu"

constexpr int XS_MAX_ROWS = 64;  // rows a CTA may own (the shared reduction buffer's length)

template <int TYPE, int NW, int UPT, int RB>
__global__ void __launch_bounds__(NW * 32)
mmvq_xs(const u8* __restrict__ W, int nrows, int rows_per_cta, float* __restrict__ out, i64 row_bytes, int nb,
        const i8* __restrict__ xq, const float2* __restrict__ xds, int K, const float* __restrict__ res) {
  pdl_enter();  // (weights read before it measured no gain in mmvq: pdl.cuh)
  typedef typename UnitOf<TYPE>::T Unit;
  typedef decltype(((Unit*)nullptr)->xload(nullptr, 0, nullptr)) X;
  constexpr int U = Unit::U, QK = Unit::QK, BB = Unit::BB, NT = NW * 32;
  __shared__ float red[NW][XS_MAX_ROWS];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nunits = nb * U;
  const int r0 = blockIdx.x * rows_per_cta, r1 = min(r0 + rows_per_cta, nrows);

  auto fetch = [&](Unit (&g)[RB][UPT], int row) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const u8* rp = W + (i64)min(row + rb, r1 - 1) * row_bytes;  // past the CTA's rows: the last again
#pragma unroll
      for (int j = 0; j < UPT; ++j) {
        const int i = min(t + NT * j, nunits - 1);  // past K's units: the last again (an L1 hit)
        g[rb][j].fetch(rp + (i64)(i / U) * BB, i % U);
      }
    }
  };
  X xv[UPT];
  auto consume = [&](Unit (&g)[RB][UPT], int row) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      float p = 0.0f;
#pragma unroll
      for (int j = 0; j < UPT; ++j)
        if (t + NT * j < nunits) {
          g[rb][j].decode();
          p += g[rb][j].dot(xv[j]);
        }
      p = warp_sum(p);
      if (lane == 0 && row + rb < r1) red[warp][row + rb - r0] = p;
    }
  };

  Unit wa[RB][UPT], wb[RB][UPT];
  fetch(wa, r0);
#pragma unroll
  for (int j = 0; j < UPT; ++j) {  // this thread's x, where quantize_x put it (xlayout.cuh)
    const int b = min(t + NT * j, nunits - 1) / U;
    const i8* xqb = xq + (QK == 32 ? 32 * (i64)xq_block_pos(b, K >> 5) : (i64)b * QK);
    xv[j] = wa[0][j].xload(xqb, K, xds + b * (QK / 32));  // a unit's place in its block: the same in every row
  }
  for (int row = r0; row < r1; row += 2 * RB) {
    if (row + RB < r1) fetch(wb, row + RB);
    consume(wa, row);
    if (row + RB >= r1) break;
    if (row + 2 * RB < r1) fetch(wa, row + 2 * RB);
    consume(wb, row + RB);
  }
  __syncthreads();
  for (int r = t; r < r1 - r0; r += NT) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) v += red[w][r];
    store_out(out, nullptr, res, nrows, 0, r0 + r, v);
  }
}
