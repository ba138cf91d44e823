// Q4_K's mat-vec walk by 16-byte words (mmvq_rows takes it for kernel id T_Q4_K_WORDS, mmvq.py's
// wide unit of Q4_K; UQ4_K in mmvq_units_k.cuh does the arithmetic). A Q4_K row is 9 words a block: the header (d, dmin, 12 scale bytes), then
// units 0..7 (unit u is word 1 + u). Lane l of a warp's load holds word w0 + l, so each load is
// 512 consecutive bytes, as chain.cu's stream reader reads a row (2.9 TB/s on the H100, s45).
// The unit walk it replaces gave 8 lanes to a block, each also loading the block's header: a
// warp's two loads touched four 128-byte runs 144 bytes apart plus four headers, and with the
// arithmetic taken out it still ran 26% slower than the stream reader (s45, mmvq_loads_only.patch).
// A unit finds its header in the same load (a shuffle from the lane holding it) or, where its
// block began in an earlier load, by a load of its own, predicated on exactly that.
#pragma once
#include "mmvq_units_k.cuh"

constexpr int T_Q4_K_WORDS = 100 + T_Q4_K;
template <> struct UnitOf<T_Q4_K_WORDS> { typedef UQ4_K T; };

// Where lane `lane` of the load whose first word is w0 (< nwords) stands: its word w, clamped to
// the row (past the end it rereads the last word, discarded), that word's block b and place j in
// it (0: the header), and hsrc, the lane of this load holding the block's header (negative: an
// earlier load holds it, so this lane loads it itself).
struct Q4KWord {
  int w, b, j, hsrc;
  bool valid;
  __device__ __forceinline__ Q4KWord(int w0, int lane, int nwords) {
    valid = w0 + lane < nwords;
    w = min(w0 + lane, nwords - 1);
    b = w / 9; j = w - 9 * b;
    hsrc = 9 * b - w0;  // >= -8: a header is at most 8 words before its units
  }
  __device__ __forceinline__ bool unit() const { return valid && j > 0; }
  // The unit this word is (meaningful where unit()): its header from lane hsrc of this load
  // (shuffled) or from its own load (hx).
  __device__ __forceinline__ UQ4_K unit_of(uint4 v, uint4 shuffled, uint4 hx) const {
    UQ4_K u;
    u.hdr = hsrc < 0 ? hx : shuffled;
    u.v = v;
    u.c = (j - 1) >> 1; u.k = (j - 1) & 1;
    return u;
  }
};

// The 16-byte weight load of mmvq_units.cuh (ldw128), issued only where pred holds (else zeros):
// predicated in PTX, so it goes out with the step's other loads instead of behind a branch.
__device__ __forceinline__ uint4 ldw128_if(const u8* p, bool pred) {
#ifndef MINFERD_HOST_TEST
  uint4 r = make_uint4(0, 0, 0, 0);
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n @q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}"
      : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w) : "l"(p), "r"((int)pred));
  return r;
#else
  return pred ? ld128_a16(p) : uint4{0, 0, 0, 0};
#endif
}

__device__ __forceinline__ uint4 shfl16(uint4 v, int src) {
  return make_uint4(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src),
                    __shfl_sync(0xffffffffu, v.z, src), __shfl_sync(0xffffffffu, v.w, src));
}

// acc[r][c] += this lane's share of row r . x column c, for the R rows at rowp (each nb blocks),
// warp kw of the KW splitting the rows' words. Per step a lane issues UNR loads a row (and the
// header loads they need) before it uses any, as mmvq_rows' unit walk does.
template <int NC, int KW, int R, int UNR>
__device__ __forceinline__ void q4k_word_dots(float (&acc)[R][NC], const u8* const (&rowp)[R], int nb, int lane,
                                              int kw, const i8* __restrict__ xq, const float2* __restrict__ xds,
                                              int K, int kbp, int ncols) {
  constexpr int STEP = 32 * KW;
  const int nwords = 9 * nb;
  for (int s0 = 32 * kw; s0 < nwords; s0 += STEP * UNR) {  // warp-uniform: every lane reaches the shuffles
    uint4 v[UNR][R], hx[UNR][R];
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const Q4KWord at(min(s0 + STEP * k, nwords - 1), lane, nwords);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        v[k][r] = ldw128(rowp[r] + 16 * (i64)at.w);
        hx[k][r] = ldw128_if(rowp[r] + 144 * (i64)at.b, at.hsrc < 0);
      }
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int w0 = s0 + STEP * k;
      if (w0 >= nwords) break;
      const Q4KWord at(w0, lane, nwords);
      UQ4_K u[R];
#pragma unroll
      for (int r = 0; r < R; ++r) u[r] = at.unit_of(v[k][r], shfl16(v[k][r], max(at.hsrc, 0)), hx[k][r]);
      if (at.unit()) {
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].decode();
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            const auto xv = u[0].xload(xq + (i64)c * 2 * K + (i64)at.b * 256, K, xds + (i64)c * kbp + at.b * 8);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][c] += u[r].dot(xv);
          }
        }
      }
    }
  }
}
