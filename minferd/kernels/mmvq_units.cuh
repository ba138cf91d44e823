// The mat-vec kernels' per-type "units" (mmvq.cu): a unit is a fixed slice of one weight
// block that a lane fetches, decodes to int8x4 words and float scales, and multiplies with the
// int8 x (xquant.cuh) by dp4a. One struct per type: the 32-element types here, the K-quants and
// the UnitOf<TYPE> table in mmvq_units_k.cuh. mmvq.cu's header says how the kernel schedules
// them; tests/host checks them on the CPU, tests/cuda on the GPU.
#pragma once
#include "blocks.cuh"
#include "xlayout.cuh"

// Exact int -> float for |v| < 2^22 in two full-rate ops (I2F runs at 1/8 of FMA rate on
// sm_90 and n=8 columns would make it the bottleneck). Every dp4a sum below stays far
// inside that range; the largest, Q6_K's dp*sc, is bounded by 8*32*127*128 < 2^22.
__device__ __forceinline__ float i2f(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }


// Bytes o, o+2, o+4, o+6 of the 8 bytes (w0, w1): the 4 per-16-element scales one lane needs.
__device__ __forceinline__ u32 pick_even4(u32 w0, u32 w1, int o) {
  return __byte_perm(w0, w1, (u32)(o | (o + 2) << 4 | (o + 4) << 8 | (o + 6) << 12));
}

// Runs of u32 at a 2-aligned address, read as aligned words and funnel shifts: N words take
// N + 1 loads where ld32_a2 takes 2N (Q6_K's decode mat-vec, 17 two-byte loads a unit, kept the
// L1 83% busy at 39% of HBM: ncu, bench/results/s20). The run's last two bytes come as a u16,
// so nothing past the run is read; where start is 4-aligned that u16 is read and not used.
// Used where it measured faster (Q6_K, Q8_0); the other 2-aligned units keep ld32_a2 (Q5_0's
// were 7-13% slower with it, s20; Q4_0's and Q3_K's not measured yet).
struct RunsA2 {
  const u8* base;  // start rounded down to 4 bytes
  u32 mis, sh;     // start % 4 (0 or 2), and the shift it takes (0 or 16)
  __device__ __forceinline__ explicit RunsA2(const u8* start) {
    mis = (u32)reinterpret_cast<size_t>(start) & 2u;
    base = start - mis; sh = 8 * mis;
  }
  template <int N> __device__ __forceinline__ void get(int off, u32 (&v)[N]) const {  // off: a multiple of 4
    u32 w[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = ld32_a4(base + off + 4 * i);
    w[N] = ld16(base + off + 4 * N - 2 + mis);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __funnelshift_r(w[i], w[i + 1], sh);
  }
};

__device__ __forceinline__ int4 ldx16(const i8* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ int2 ldx8(const i8* p) { return __ldg(reinterpret_cast<const int2*>(p)); }
__device__ __forceinline__ float4 ldds4(const float2* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// Weights are read exactly once: keep them out of L1 so x stays there (16-aligned types only;
// the u16-pair loads of the 2-aligned types reuse each cache line across instructions).
__device__ __forceinline__ uint4 ldw128(const u8* p) {
#ifndef MINFERD_HOST_TEST
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#else
  return ld128_a16(p);
#endif
}

__device__ __forceinline__ int dot4(const u32* q, int4 x, int acc) {
  acc = __dp4a((int)q[0], x.x, acc);
  acc = __dp4a((int)q[1], x.y, acc);
  acc = __dp4a((int)q[2], x.z, acc);
  return __dp4a((int)q[3], x.w, acc);
}
__device__ __forceinline__ int dot2(u32 q0, u32 q1, int2 x) { return __dp4a((int)q0, x.x, __dp4a((int)q1, x.y, 0)); }

// x = d * (q_hi + q_lo / 254): the two int8 sums of one weight slice, as the f32 sum in units of d.
// MINFERD_X_ONE_PLANE (the MINFERD_X_PLANES=1 valve): x = d * q_hi alone, llama.cpp's q8_1
// precision; the lo plane's loads and dp4a chains are then dead code, which the compiler drops.
#ifdef MINFERD_X_ONE_PLANE
__device__ __forceinline__ float comb(int s_hi, int) { return i2f(s_hi); }
#else
__device__ __forceinline__ float comb(int s_hi, int s_lo) { return fmaf(i2f(s_lo), 1.0f / 254.0f, i2f(s_hi)); }
#endif

// x of one unit, loaded once per column and used for all R rows of the warp (the compiler
// does not merge the same loads across rows by itself, and x is most of the L1 traffic).
// hi plane at xq, lo plane at xq + lo.
struct X32 {  // 32-element blocks, unit u: x[8u..8u+7] and x[16+8u..16+8u+7]
  int4 h, l;
  float2 ds;
};
__device__ __forceinline__ X32 x32load(const i8* xq, int lo, const float2* xds, int u) {
  const int2 ah = ldx8(xq + 8 * u), bh = ldx8(xq + 16 + 8 * u);
  const int2 al = ldx8(xq + 8 * u + lo), bl = ldx8(xq + 16 + 8 * u + lo);
  return {make_int4(ah.x, ah.y, bh.x, bh.y), make_int4(al.x, al.y, bl.x, bl.y), __ldg(xds)};
}
__device__ __forceinline__ float x32dot(const u32* q, const X32& x) { return comb(dot4(q, x.h, 0), dot4(q, x.l, 0)); }

// x of a (h, l0) unit of P positions: x[128h + 32j + l0 .. + P - 1] for j = 0..3 (P = 8: the
// Q2_K / Q3_K / Q6_K units; 16: UQ6_K16). Blocks j and 4 + j sit in one 128-byte line (xq_pos8).
template <int P> struct XJP;
template <> struct XJP<8> {
  int2 h[4], l[4];
  float dx[4], sm[4];  // sm: sum of the 8 x values in units of dx (Q2_K's min term only)
};
template <> struct XJP<16> {
  int4 h[4], l[4];
  float dx[4];
};
typedef XJP<8> XJ;
template <int P = 8>
__device__ __forceinline__ XJP<P> xjload(const i8* xq, int lo, const float2* xds, int h, int l0) {
  XJP<P> x;
  const float4 ds01 = ldds4(xds + 4 * h), ds23 = ldds4(xds + 4 * h + 2);
  x.dx[0] = ds01.x; x.dx[1] = ds01.z; x.dx[2] = ds23.x; x.dx[3] = ds23.z;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const i8* p = xq + 32 * xq_pos8(4 * h + j) + l0;  // x block 4h + j of the super-block
    if constexpr (P == 8) {
      x.h[j] = ldx8(p);
      x.l[j] = ldx8(p + lo);
      x.sm[j] = comb(dot2(0x01010101u, 0x01010101u, x.h[j]), dot2(0x01010101u, 0x01010101u, x.l[j]));
    } else {
      x.h[j] = ldx16(p);
      x.l[j] = ldx16(p + lo);
    }
  }
  return x;
}

// ---------------------------------------------------------------------------------------
// Units. fetch(blk, u) issues the loads of unit u of the block at blk into raw registers and
// nothing else; decode() turns them into int8x4 words and float scales; xload(xq, lo, xds)
// loads the x this unit meets in one column (once, for all the rows of the warp), xq/xds
// pointing at that column's x for this block (QK int8 hi values, their lo plane at xq + lo,
// QK/32 (d, sum) pairs); dot(x) returns the unit's contribution. Keeping fetch free of arithmetic lets the kernel put every unit's loads in flight before the first
// one is used. Min/offset terms that use the block's exact sum of x are added by unit 0 (or
// the lane holding the sub-block's first half) only.

struct UQ4_0 {  // 18 B, 2-aligned. Unit u: bytes 8u..8u+7 -> elements 8u.. and 16+8u..
  static constexpr int TYPE = T_Q4_0, QK = 32, BB = 18, U = 2;
  u32 a, b, q[4];
  u16 dh;
  float d;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    dh = ld16(blk);
    a = ld32_a2(blk + 2 + 8 * u); b = ld32_a2(blk + 6 + 8 * u);
  }
  __device__ void decode() {
    d = h2f(dh);
    q[0] = a & M4; q[1] = b & M4; q[2] = (a >> 4) & M4; q[3] = (b >> 4) & M4;
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq, lo, xds, u); }
  __device__ float dot(const X32& x) const {
    return d * (x.ds.x * x32dot(q, x) - (u == 0 ? 8.0f * x.ds.y : 0.0f));  // sum (q-8)x = sum qx - 8 sum x
  }
};

struct UQ4_1 {  // 20 B, 4-aligned; y = d*q + m
  static constexpr int TYPE = T_Q4_1, QK = 32, BB = 20, U = 2;
  u32 dm, a, b, q[4];
  float d, m;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    dm = ld32_a4(blk);
    a = ld32_a4(blk + 4 + 8 * u); b = ld32_a4(blk + 8 + 8 * u);
  }
  __device__ void decode() {
    d = h2f((u16)dm); m = h2f((u16)(dm >> 16));
    q[0] = a & M4; q[1] = b & M4; q[2] = (a >> 4) & M4; q[3] = (b >> 4) & M4;
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq, lo, xds, u); }
  __device__ float dot(const X32& x) const { return d * x.ds.x * x32dot(q, x) + (u == 0 ? m * x.ds.y : 0.0f); }
};

struct UQ5_0 {  // 22 B, 2-aligned: qh (at 22g + 2) as two u16, never one u32
  static constexpr int TYPE = T_Q5_0, QK = 32, BB = 22, U = 2;
  u32 qh, a, b, q[4];
  u16 dh;
  float d;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    dh = ld16(blk);
    qh = ld32_a2(blk + 2);
    a = ld32_a2(blk + 6 + 8 * u); b = ld32_a2(blk + 10 + 8 * u);
  }
  __device__ void decode() {
    d = h2f(dh);
    const u32 hl = qh >> (8 * u), hh = qh >> (16 + 8 * u);
    q[0] = (a & M4) | spread4(hl & 0xF);
    q[1] = (b & M4) | spread4((hl >> 4) & 0xF);
    q[2] = ((a >> 4) & M4) | spread4(hh & 0xF);
    q[3] = ((b >> 4) & M4) | spread4((hh >> 4) & 0xF);
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq, lo, xds, u); }
  __device__ float dot(const X32& x) const { return d * (x.ds.x * x32dot(q, x) - (u == 0 ? 16.0f * x.ds.y : 0.0f)); }
};

struct UQ5_1 {  // 24 B, 8-aligned; y = d*q + m
  static constexpr int TYPE = T_Q5_1, QK = 32, BB = 24, U = 2;
  uint2 h, ab;  // (d|m, qh), 8 nibble bytes
  u32 q[4];
  float d, m;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    h = ld64_a8(blk);
    ab = ld64_a8(blk + 8 + 8 * u);
  }
  __device__ void decode() {
    d = h2f((u16)h.x); m = h2f((u16)(h.x >> 16));
    const u32 hl = h.y >> (8 * u), hh = h.y >> (16 + 8 * u);
    q[0] = (ab.x & M4) | spread4(hl & 0xF);
    q[1] = (ab.y & M4) | spread4((hl >> 4) & 0xF);
    q[2] = ((ab.x >> 4) & M4) | spread4(hh & 0xF);
    q[3] = ((ab.y >> 4) & M4) | spread4((hh >> 4) & 0xF);
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq, lo, xds, u); }
  __device__ float dot(const X32& x) const { return d * x.ds.x * x32dot(q, x) + (u == 0 ? m * x.ds.y : 0.0f); }
};

struct UQ8_0 {  // 34 B, 2-aligned. Unit u: int8 elements 16u..16u+15
  static constexpr int TYPE = T_Q8_0, QK = 32, BB = 34, U = 2;
  u32 q[4];
  u16 dh;
  float d;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    dh = ld16(blk);
    RunsA2(blk + 2).get(16 * u, q);  // 5 loads, not 8: Q8_0 6-12% faster on most 7B shapes (s20)
  }
  __device__ void decode() { d = h2f(dh); }
  struct X {
    int4 h, l;
    float dx;
  };
  __device__ X xload(const i8* xq, int lo, const float2* xds) const {
    return {ldx16(xq + 16 * u), ldx16(xq + 16 * u + lo), __ldg(xds).x};
  }
  __device__ float dot(const X& x) const { return d * x.dx * comb(dot4(q, x.h, 0), dot4(q, x.l, 0)); }
};
