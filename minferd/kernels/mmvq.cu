// Quantized matrix x small-batch products for decode: out (n, rows) = x (n, K) @ W.T, W the
// GGUF rows of any type, n <= 8. Decode is memory-bound: the whole game is streaming W's
// bytes once, at HBM speed, for all n columns together.
//
// How (after llama.cpp's MMVQ): x is first quantized per 32 elements (quantize_x: a scale
// d, the exact f32 sum of the block, and int8 values), so the inner product of a weight
// block is integer dp4a work: 4 multiply-adds per instruction, weights never turned into
// floats element by element. That keeps the instruction count per weight byte under what
// the SM can issue (an f32 path needs ~4 instructions per element, about the whole issue
// budget at 4 TB/s of Q4_K) and x costs 2 bytes per element of L1 traffic instead of 4.
// Unlike llama.cpp, x is kept as TWO int8 planes, x = d*(hi + lo/254): one plane alone
// (llama.cpp's q8_1) leaves ~0.5% relative error per product on Gaussian x, measured on the
// host twin of these units, 1.4% on short rows: too close to the 1e-2 the tests allow and
// it compounds over layers. Two planes cost a second dp4a chain and a second x load per
// unit and bring the error to ~1e-5. Its 32-element blocks are stored out of order (xlayout.cuh)
// so that the units' x loads read whole 128-byte lines.
//
// Work split: a group of KW warps per R rows; lanes walk the row in "units" (a fixed slice
// of one block: U units per block, U a power of two, so neighbouring lanes read neighbouring
// bytes and every warp load is a few contiguous cache lines). Each lane first issues the
// loads of UNR units x R rows, then does the arithmetic: those loads are in flight
// together, which is what keeps enough bytes moving per SM to saturate HBM (a first version
// that guarded each unit's loads with a branch serialised them: UNR = 4 ran 2.5x slower than
// UNR = 1). A unit's weights are decoded once into int8x4 registers and reused for every
// column. Partial sums are reduced with warp shuffles (and shared memory across the KW
// warps). The best (NW, KW, R, UNR) depends on the shape: mmvq.py's CONFIGS, from the sweep
// in bench/kernels.py. Measured on the H200 at Qwen2.5-7B's shapes, n = 1: Q4_K 59-82% of
// the 4.3 TB/s copy ceiling on the big matrices (gate/up, down, output), ~37% on 3584^2 and
// ~10% on the 1 MB k/v matrices (a few microseconds: launch and latency, not bandwidth).
// n = 8 is 3-4x slower than n = 1, not 8x, but only 15-35% of HBM: it is bound by x traffic
// through L1 (2 planes x 8 columns = 16 bytes of x per weight element); staging x once per
// CTA in shared memory for more rows is the next step if batched decode matters.
//
// Loads are as wide as the block's guaranteed alignment allows (blocks.cuh has the table):
// Q4_K/Q5_K get 16-byte loads, the 2-aligned types (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K) read u16
// pairs. Float weights (F32/F16/BF16) take mmv_float, which keeps x in f32.
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_mmvq.py, in f64).
#include "pdl.cuh"
#ifndef MINFERD_HOST_TEST
#include <cuda_fp16.h>
#endif
#include "mmvq_units_k.cuh"
#include "xquant.cuh"

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------
// x (ncols, K) f32 -> xq (ncols, 2, K) int8 and xds (ncols, kbp) (d, sum) per 32 elements,
// one warp per 32-element block: x = d * (hi + lo/254), hi = rint(x/d), lo the rounded
// residual. kbp >= K/32 is a multiple of 4, so every column's xds row is 32-byte aligned
// and the kernels can read (d, sum) pairs as float4.
extern "C" __global__ void quantize_x(const float* __restrict__ x, int K, int ncols, int kbp,
                                      i8* __restrict__ xq, float2* __restrict__ xds) {
  pdl_enter();
  const i64 gw = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31, nkb = K >> 5;
  if (gw >= (i64)ncols * nkb) return;  // whole warps leave together
  const int c = (int)(gw / nkb), kb = (int)(gw % nkb);
  quantize_block32(x[(i64)c * K + 32 * kb + lane], lane, xq + (i64)c * 2 * K, K, kb, xds + (i64)c * kbp);
}

// The epilogue every mat-vec shares: out = x.W (+ bias[row]) (+ res[c, row]). Folding the
// projection bias and the residual add in here saves two kernels per layer of a decode step.
__device__ __forceinline__ void store_out(float* out, const float* bias, const float* res, int nrows, int c,
                                          int row, float v) {
  const i64 o = (i64)c * nrows + row;
  if (bias) v += bias[row];
  if (res) v += res[o];
  out[o] = v;
}

#include "mmvq_epi.cuh"

// out[c, r] = sum_k x[c, k] * W[r, k] for r < nrows, c < ncols (<= NC).
// A CTA is NW warps in groups of KW: each group owns R rows, its KW warps split the row's
// units between them (KW > 1 gives short rows and few-row matrices more loads in flight)
// and add up through shared memory. Per step a lane fetches UNR units of each of its R rows
// (all loads issued before any is used: the index is clamped instead of branched on, so the
// compiler keeps them together), then decodes and multiplies the valid ones. This is one CTA's
// share (bx: its index among the CTAs of its matrix), which mmvq and mmvq_ids both run.
template <int TYPE, int NC, int NW, int KW, int R, int UNR, class EPI = NoEpi>
__device__ __forceinline__ void mmvq_rows(const u8* __restrict__ W, int nrows, float* __restrict__ out,
                                          const float* __restrict__ bias, int bx, i64 row_bytes, int nb,
                                          const i8* __restrict__ xq, const float2* __restrict__ xds, int K, int kbp,
                                          int ncols, const float* __restrict__ res, const EPI& epi = EPI()) {
  static_assert(NW % KW == 0, "warps per CTA must be a multiple of warps per row group");
  typedef typename UnitOf<TYPE>::T Unit;
  constexpr int U = Unit::U, QK = Unit::QK, BB = Unit::BB, STEP = 32 * KW;
  // Q8_0's lanes walk x in stored order (unit i meets x block position i / U, its weights block
  // xq_block_at's): its 16-byte x loads then read a line a quarter-warp, where block order reads
  // two. The other 32-element types read x 8 bytes at a time and walk blocks in order (the stored
  // order measured 2-5% slower on Q5_0; Q8_0 7-20% faster: bench/results/s43), but for Q4_0's
  // one-column shapes where a warp walks a whole row alone (KW = 1: gate/up, the output), which
  // gained 15-24% walking that way where its K-split shapes lost 3-12% (s43).
  constexpr bool XW = TYPE == T_Q8_0 || (TYPE == T_Q4_0 && KW == 1 && NC == 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = warp % KW;
  const int row0 = (bx * (NW / KW) + warp / KW) * R;
  if (KW == 1 && row0 >= nrows) return;  // with KW > 1 every warp must reach __syncthreads
  const int nunits = nb * U;
  float acc[R][NC];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
  const u8* rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = W + (i64)min(row0 + r, nrows - 1) * row_bytes;  // tail rows: redo the last, discard

  for (int i0 = kw * 32 + lane; i0 < nunits; i0 += STEP * UNR) {
    Unit w[UNR][R];
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int i = min(i0 + STEP * k, nunits - 1);  // past the end: refetch the last unit (an L1 hit)
      const int b = XW ? xq_block_at(i / U, nb) : i / U;
#pragma unroll
      for (int r = 0; r < R; ++r) w[k][r].fetch(rowp[r] + (i64)b * BB, i % U);
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int i = i0 + STEP * k;
      if (i < nunits) {
        const int p = i / U, b = XW ? xq_block_at(p, nb) : p;
#pragma unroll
        for (int r = 0; r < R; ++r) w[k][r].decode();
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            // a 32-element type's x block where quantize_x put it; a 256-element block's group of 8
            // x blocks is whole, its units find their own (xq_pos8)
            const i8* xqc = xq + (i64)c * 2 * K +
                            (XW ? 32 * (i64)p : QK == 32 ? 32 * (i64)xq_block_pos(b, K >> 5) : (i64)b * QK);
            const float2* xdc = xds + (i64)c * kbp + b * (QK / 32);
            const auto xv = w[k][0].xload(xqc, K, xdc);  // unit position is the same in every row
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][c] += w[k][r].dot(xv);
          }
        }
      }
    }
  }
  if constexpr (KW == 1 && EPI::kFused) {
    float v[R][NC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < NC; ++c) v[r][c] = warp_sum(acc[r][c]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c >= ncols || row0 + r >= nrows) continue;
          if constexpr (R % 2 == 0) {  // the launcher gives a pairing mode only even R and even row counts
            if (epi.pairs()) {
              if (r % 2 == 0) epi.store_pair(out, bias, nrows, c, row0 + r, v[r][c], v[r + 1][c]);
              continue;
            }
          }
          epi.store(out, bias, nrows, c, row0 + r, v[r][c]);
        }
    }
  } else if constexpr (KW == 1) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const float v = warp_sum(acc[r][c]);
        if (lane == 0 && c < ncols && row0 + r < nrows) store_out(out, bias, res, nrows, c, row0 + r, v);
      }
  } else {
    __shared__ float red[NW][R * NC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const float v = warp_sum(acc[r][c]);
        if (lane == 0) red[warp][r * NC + c] = v;
      }
    __syncthreads();
    if (kw == 0 && lane < R * NC) {
      const int r = lane / NC, c = lane % NC;
      float v = 0.0f;
#pragma unroll
      for (int j = 0; j < KW; ++j) v += red[warp + j][lane];
      if constexpr (EPI::kFused) {
        if (c < ncols && row0 + r < nrows) {
          bool paired = false;
          if constexpr (R % 2 == 0) {  // the launcher gives a pairing mode only even R and even row counts
            paired = epi.pairs();
            if (paired && r % 2 == 0) {  // the pair's second row: its lane's sum, added in the same order
              float v1 = 0.0f;
#pragma unroll
              for (int j = 0; j < KW; ++j) v1 += red[warp + j][lane + NC];
              epi.store_pair(out, bias, nrows, c, row0 + r, v, v1);
            }
          }
          if (!paired) epi.store(out, bias, nrows, c, row0 + r, v);
        }
      } else {
        if (c < ncols && row0 + r < nrows) store_out(out, bias, res, nrows, c, row0 + r, v);
      }
    }
  }
}

// Up to three matrices of one type and K that read the same x (q/k/v, gate/up) share one
// launch: CTAs [0, cta1) work on W0, [cta1, cta2) on W1, the rest on W2. In a decode graph
// each launch is a node costing ~2.5 us of its own, and the 512-row k/v matrices alone
// cannot fill the GPU. The residual (res) is only for a single matrix (segment 0).
template <int TYPE, int NC, int NW, int KW, int R, int UNR>
__global__ void __launch_bounds__(NW * 32)
mmvq(const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int rows0, int rows1,
     int rows2, int cta1, int cta2, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2,
     const float* __restrict__ bias0, const float* __restrict__ bias1, const float* __restrict__ bias2,
     i64 row_bytes, int nb, const i8* __restrict__ xq, const float2* __restrict__ xds, int K, int kbp, int ncols,
     const float* __restrict__ res) {
  pdl_enter();
  const int seg = blockIdx.x < cta1 ? 0 : (blockIdx.x < cta2 ? 1 : 2);
  mmvq_rows<TYPE, NC, NW, KW, R, UNR>(seg == 0 ? W0 : (seg == 1 ? W1 : W2), seg == 0 ? rows0 : (seg == 1 ? rows1 : rows2),
                                      seg == 0 ? out0 : (seg == 1 ? out1 : out2),
                                      seg == 0 ? bias0 : (seg == 1 ? bias1 : bias2),
                                      blockIdx.x - (seg == 0 ? 0 : (seg == 1 ? cta1 : cta2)), row_bytes, nb, xq, xds,
                                      K, kbp, ncols, res);
}

// mmvq's launch for a decode step's q / k / v products with rope_kv in the epilogue (RopeKV):
// modes holds each segment's EPI_* in 2 bits (segment s at bits 2s); k and v segments write the
// f16 caches (row width: that segment's rows) and leave out alone. res: none (q / k / v have none).
template <int TYPE, int NC, int NW, int KW, int R, int UNR>
__global__ void __launch_bounds__(NW * 32)
mmvq_rope_kv(const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int rows0, int rows1,
             int rows2, int cta1, int cta2, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2,
             const float* __restrict__ bias0, const float* __restrict__ bias1, const float* __restrict__ bias2,
             i64 row_bytes, int nb, const i8* __restrict__ xq, const float2* __restrict__ xds, int K, int kbp, int ncols,
             int modes, const int* __restrict__ pos, const int* __restrict__ slots, __half* __restrict__ Kc,
             __half* __restrict__ Vc, int hd, float base, float scale, const float* __restrict__ ff) {
  pdl_enter();
  const int seg = blockIdx.x < cta1 ? 0 : (blockIdx.x < cta2 ? 1 : 2);
  const int mode = (modes >> (2 * seg)) & 3;
  const RopeKV epi{mode, hd, pos, slots, mode == EPI_V ? Vc : Kc, base, scale, ff};
  mmvq_rows<TYPE, NC, NW, KW, R, UNR, RopeKV>(
      seg == 0 ? W0 : (seg == 1 ? W1 : W2), seg == 0 ? rows0 : (seg == 1 ? rows1 : rows2),
      seg == 0 ? out0 : (seg == 1 ? out1 : out2), seg == 0 ? bias0 : (seg == 1 ? bias1 : bias2),
      blockIdx.x - (seg == 0 ? 0 : (seg == 1 ? cta1 : cta2)), row_bytes, nb, xq, xds, K, kbp, ncols, nullptr, epi);
}

// Mixture-of-experts decode: pick p (blockIdx.y) multiplies expert ids[p] of a stacked tensor
// (expert e = rows e*nrows .. of W, expert_bytes apart) by x's row p / xdiv (xdiv = k: the
// token's input to gate / up; 1: the pick's own activation to down) into out's row p. The
// expert is read on the device, so a decode step that routes on the device can be captured
// in a graph; each pick reads only its expert's bytes. blockIdx.z = 1 takes a second tensor of
// the same shape into out2 from the same x (gate and up: one graph node, not two). B (B2): the
// experts' f32 biases stacked (n_expert, nrows), or null: expert e's row added (gpt-oss).
template <int TYPE, int NW, int KW, int R, int UNR>
__global__ void __launch_bounds__(NW * 32)
mmvq_ids(const u8* __restrict__ W, const u8* __restrict__ W2, i64 expert_bytes, int nrows, const int* __restrict__ ids,
         int xdiv, float* __restrict__ out, float* __restrict__ out2, const float* __restrict__ B,
         const float* __restrict__ B2, i64 row_bytes, int nb, const i8* __restrict__ xq,
         const float2* __restrict__ xds, int K, int kbp) {
  pdl_enter();
  const int p = blockIdx.y, c = p / xdiv, e = __ldg(ids + p);
  const u8* __restrict__ w = blockIdx.z ? W2 : W;
  float* __restrict__ o = blockIdx.z ? out2 : out;
  const float* __restrict__ b = blockIdx.z ? B2 : B;
  mmvq_rows<TYPE, 1, NW, KW, R, UNR>(w + (i64)e * expert_bytes, nrows, o + (i64)p * nrows,
                                     b ? b + (i64)e * nrows : nullptr, blockIdx.x, row_bytes, nb,
                                     xq + (i64)c * 2 * K, xds + (i64)c * kbp, K, kbp, 1, nullptr);
}

// ---------------------------------------------------------------------------------------
// Float weights (F32 / F16 / BF16): mmv_float and mmv_float_ids, x kept in f32.
#include "mmv_float.cuh"
