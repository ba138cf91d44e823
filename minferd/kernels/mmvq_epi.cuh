// mmvq_rows' epilogue policies (mmvq.cu): what a finished (column, row) sum becomes.
#pragma once
#include "rope.cuh"

// What mmvq_rows does with a finished (column, row) sum: NoEpi stores it (store_out); RopeKV
// (mmvq_rope_kv, a decode step's q / k / v products) ends the step's rope_kv there too, the same
// arithmetic in the same order (rope.cuh), so the decode graph loses that node per layer. Its
// mode is the segment's: EPI_ROPE rotates adjacent row pairs (rows 2i, 2i + 1 of a head: a neox
// model's q and k rows are stored reordered so, model/rope_rows.py) and stores f32; EPI_ROPE_K
// rotates and writes the f16 K cache at the column's slot; EPI_V writes the f16 V cache.
enum { EPI_OUT = 0, EPI_ROPE = 1, EPI_ROPE_K = 2, EPI_V = 3 };

struct NoEpi {
  static constexpr bool kFused = false;
};

struct RopeKV {
  static constexpr bool kFused = true;
  int mode, hd;
  const int* __restrict__ pos;
  const int* __restrict__ slots;
  __half* __restrict__ cache;  // K for EPI_ROPE_K, V for EPI_V
  float base, scale;
  const float* __restrict__ ff;

  __device__ __forceinline__ bool pairs() const { return mode == EPI_ROPE || mode == EPI_ROPE_K; }

  __device__ __forceinline__ void store(float* out, const float* bias, int nrows, int c, int row, float v) const {
    if (bias) v += bias[row];
    if (mode == EPI_V) cache[(i64)slots[c] * nrows + row] = __float2half_rn(v);
    else out[(i64)c * nrows + row] = v;
  }

  // rows row (even) and row + 1: one rope pair of a head
  __device__ __forceinline__ void store_pair(float* out, const float* bias, int nrows, int c, int row, float a,
                                             float b) const {
    if (bias) a += bias[row], b += bias[row + 1];
    rope_pair(a, b, pos[c], (row % hd) >> 1, hd, base, scale, ff);
    if (mode == EPI_ROPE_K) {
      const i64 o = (i64)slots[c] * nrows + row;
      cache[o] = __float2half_rn(a);
      cache[o + 1] = __float2half_rn(b);
    } else {
      out[(i64)c * nrows + row] = a;
      out[(i64)c * nrows + row + 1] = b;
    }
  }
};
