// The mat-vec kernels' per-type "units" (mmvq.cu): a unit is a fixed slice of one weight
// block that a lane fetches, decodes to int8x4 words and float scales, and multiplies with the
// int8 x (xquant.cuh) by dp4a. One struct per type; UnitOf<TYPE> picks it. mmvq.cu's header
// says how the kernel schedules them; tests/host checks them on the CPU, tests/cuda on the GPU.
#pragma once
#include "blocks.cuh"

// Exact int -> float for |v| < 2^22 in two full-rate ops (I2F runs at 1/8 of FMA rate on
// sm_90 and n=8 columns would make it the bottleneck). Every dp4a sum below stays far
// inside that range; the largest, Q6_K's dp*sc, is bounded by 8*32*127*128 < 2^22.
__device__ __forceinline__ float i2f(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }


// Bytes o, o+2, o+4, o+6 of the 8 bytes (w0, w1): the 4 per-16-element scales one lane needs.
__device__ __forceinline__ u32 pick_even4(u32 w0, u32 w1, int o) {
  return __byte_perm(w0, w1, (u32)(o | (o + 2) << 4 | (o + 4) << 8 | (o + 6) << 12));
}

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
__device__ __forceinline__ float comb(int s_hi, int s_lo) { return fmaf(i2f(s_lo), 1.0f / 254.0f, i2f(s_hi)); }

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

struct XJ {  // Q2_K/Q3_K/Q6_K unit (h, l0): x[128h + 32j + l0 .. +7] for j = 0..3
  int2 h[4], l[4];
  float dx[4], sm[4];  // sm: sum of the 8 x values in units of dx (Q2_K's min term only)
};
__device__ __forceinline__ XJ xjload(const i8* xq, int lo, const float2* xds, int h, int l0) {
  XJ x;
  const float4 ds01 = ldds4(xds + 4 * h), ds23 = ldds4(xds + 4 * h + 2);
  x.dx[0] = ds01.x; x.dx[1] = ds01.z; x.dx[2] = ds23.x; x.dx[3] = ds23.z;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const i8* p = xq + 128 * h + 32 * j + l0;
    x.h[j] = ldx8(p);
    x.l[j] = ldx8(p + lo);
    x.sm[j] = comb(dot2(0x01010101u, 0x01010101u, x.h[j]), dot2(0x01010101u, 0x01010101u, x.l[j]));
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
    const u8* p = blk + 2 + 16 * u;
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = ld32_a2(p + 4 * i);
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

struct UQ2_K {  // 84 B, 4-aligned. Unit u: h = u/4, l = 8(u%4)..+7, for all 4 shifts j
  static constexpr int TYPE = T_Q2_K, QK = 256, BB = 84, U = 8;
  u32 a, b, s0, s1, dd, q[8];  // q: [j][2]
  float d, dmin, sc[4], mn[4];
  int h, l0;
  __device__ void fetch(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    dd = ld32_a4(blk + 80);
    a = ld32_a4(blk + 16 + 32 * h + l0); b = ld32_a4(blk + 20 + 32 * h + l0);
    s0 = ld32_a4(blk + 8 * h); s1 = ld32_a4(blk + 8 * h + 4);
  }
  __device__ void decode() {
    d = h2f((u16)dd); dmin = h2f((u16)(dd >> 16));
    // scales of sub-blocks 8h + 2j + l0/16, j = 0..3: bytes l0/16 + {0,2,4,6} of 8h..8h+7
    const u32 s4 = pick_even4(s0, s1, l0 >> 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[2 * j] = (a >> (2 * j)) & 0x03030303u;
      q[2 * j + 1] = (b >> (2 * j)) & 0x03030303u;
      sc[j] = (float)((s4 >> (8 * j)) & 0xF);
      mn[j] = (float)((s4 >> (8 * j + 4)) & 0xF);
    }
  }
  __device__ XJ xload(const i8* xq, int lo, const float2* xds) const { return xjload(xq, lo, xds, h, l0); }
  __device__ float dot(const XJ& x) const {
    float accd = 0.f, accm = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float sd = comb(dot2(q[2 * j], q[2 * j + 1], x.h[j]), dot2(q[2 * j], q[2 * j + 1], x.l[j]));
      accd += x.dx[j] * sc[j] * sd;
      // the min applies per 16 elements; the stored exact sum covers 32, so x's ints (x.sm)
      accm += x.dx[j] * mn[j] * x.sm[j];
    }
    return d * accd - dmin * accm;
  }
};

struct UQ3_K {  // 110 B, 2-aligned. Unit u: h = u/4, l = 8(u%4)..+7, all 4 shifts j
  static constexpr int TYPE = T_Q3_K, QK = 256, BB = 110, U = 8;
  u32 a, b, ha, hb, s0, s1, s2, q[8];  // q: signed int8x4, (q2 | hbit << 2) - 4
  u16 dh;
  float d, sc[4];
  int h, l0;
  __device__ void fetch(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    dh = ld16(blk + 108);
    a = ld32_a2(blk + 32 + 32 * h + l0); b = ld32_a2(blk + 36 + 32 * h + l0);
    ha = ld32_a2(blk + l0); hb = ld32_a2(blk + l0 + 4);
    s0 = ld32_a2(blk + 96); s1 = ld32_a2(blk + 100); s2 = ld32_a2(blk + 104);
  }
  __device__ void decode() {
    const int o = l0 >> 4;
    d = h2f(dh);
    // 6-bit scales s = 8h + 2j + o: low nibble = nibble h of byte 2j+o; top 2 bits = bits
    // 2(2h + j/2) of byte 8 + (2j+o)%4.
    const u32 lo = (pick_even4(s0, s1, o) >> (4 * h)) & M4;
    const u32 hw = __byte_perm(s2, 0, (u32)(o | (o + 2) << 4 | o << 8 | (o + 2) << 12));
    const u32 hi = ((hw >> (4 * h)) & 0x00000303u) | ((hw >> (4 * h + 2)) & 0x03030000u);
    const u32 s6 = ((lo | (hi << 4)) + 0x60606060u) ^ 0x80808080u;  // bytes 0..63 -> -32..31
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j] = (float)(int)(i8)(s6 >> (8 * j));
      const int t = 4 * h + j;  // hmask bit of element 32t + l
      const u32 va = ((a >> (2 * j)) & 0x03030303u) | (((ha >> t) & 0x01010101u) << 2);
      const u32 vb = ((b >> (2 * j)) & 0x03030303u) | (((hb >> t) & 0x01010101u) << 2);
      q[2 * j] = (va + 0x7C7C7C7Cu) ^ 0x80808080u;  // bytes 0..7 -> -4..3, no carries
      q[2 * j + 1] = (vb + 0x7C7C7C7Cu) ^ 0x80808080u;
    }
  }
  __device__ XJ xload(const i8* xq, int lo, const float2* xds) const { return xjload(xq, lo, xds, h, l0); }
  __device__ float dot(const XJ& x) const {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      acc += x.dx[j] * sc[j] * comb(dot2(q[2 * j], q[2 * j + 1], x.h[j]), dot2(q[2 * j], q[2 * j + 1], x.l[j]));
    return d * acc;
  }
};

// Q4_K/Q5_K unit u: sub-blocks 2c and 2c+1 (c = u/2), elements 16k..16k+15 of each (k = u%2).
// Sub-blocks are 32 elements = one x block, so the min term uses x's exact block sum and is
// added by the k == 0 lane.
struct UK45 {
  uint4 hdr, v;
  u32 q[8];  // [0:4] sub-block 2c, [4:8] sub-block 2c+1, unsigned bytes
  float d, dmin, sc0, sc1, m0, m1;
  int c, k;
  __device__ void scales() {
    d = h2f((u16)hdr.x); dmin = h2f((u16)(hdr.x >> 16));
    const u32 b0 = hdr.y, b1 = hdr.z, b2 = hdr.w;  // ggml get_scale_min_k4, 4 at a time
    const u32 scw = c < 2 ? (b0 & 0x3F3F3F3Fu) : ((b2 & M4) | ((b0 >> 2) & 0x30303030u));
    const u32 mw = c < 2 ? (b1 & 0x3F3F3F3Fu) : (((b2 >> 4) & M4) | ((b1 >> 2) & 0x30303030u));
    const int sh = 16 * (c & 1);
    sc0 = (float)((scw >> sh) & 0xFF); sc1 = (float)((scw >> (sh + 8)) & 0xFF);
    m0 = (float)((mw >> sh) & 0xFF); m1 = (float)((mw >> (sh + 8)) & 0xFF);
  }
  struct X {
    int4 h0, l0, h1, l1;
    float4 ds;  // (d, sum) of x blocks 2c and 2c+1
  };
  __device__ X xload(const i8* xq, int lo, const float2* xds) const {
    const i8* p0 = xq + 64 * c + 16 * k;
    const i8* p1 = p0 + 32;
    return {ldx16(p0), ldx16(p0 + lo), ldx16(p1), ldx16(p1 + lo), ldds4(xds + 2 * c)};
  }
  __device__ float dot(const X& x) const {
    const float s0 = comb(dot4(q, x.h0, 0), dot4(q, x.l0, 0)), s1 = comb(dot4(q + 4, x.h1, 0), dot4(q + 4, x.l1, 0));
    const float r = d * (sc0 * x.ds.x * s0 + sc1 * x.ds.z * s1);
    return k == 0 ? r - dmin * (m0 * x.ds.y + m1 * x.ds.w) : r;
  }
};

struct UQ4_K : UK45 {  // 144 B, 16-aligned: 16-byte loads
  static constexpr int TYPE = T_Q4_K, QK = 256, BB = 144, U = 8;
  __device__ void fetch(const u8* blk, int u) {
    c = u >> 1; k = u & 1;
    hdr = ldw128(blk);
    v = ldw128(blk + 16 + 32 * c + 16 * k);
  }
  __device__ void decode() {
    scales();
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { q[i] = w[i] & M4; q[4 + i] = (w[i] >> 4) & M4; }
  }
};

struct UQ5_K : UK45 {  // 176 B, 16-aligned
  static constexpr int TYPE = T_Q5_K, QK = 256, BB = 176, U = 8;
  uint4 hv;
  __device__ void fetch(const u8* blk, int u) {
    c = u >> 1; k = u & 1;
    hdr = ldw128(blk);
    hv = ldw128(blk + 16 + 16 * k);
    v = ldw128(blk + 48 + 32 * c + 16 * k);
  }
  __device__ void decode() {
    scales();
    const u32 w[4] = {v.x, v.y, v.z, v.w}, hb[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = (w[i] & M4) | (((hb[i] >> (2 * c)) & 0x01010101u) << 4);
      q[4 + i] = ((w[i] >> 4) & M4) | (((hb[i] >> (2 * c + 1)) & 0x01010101u) << 4);
    }
  }
};

struct UQ6_K {  // 210 B, 2-aligned. Unit u: h = u/4, l = 8(u%4)..+7, all 4 quarters j
  static constexpr int TYPE = T_Q6_K, QK = 256, BB = 210, U = 8;
  u32 la0, la1, lb0, lb1, h0, h1, s0, s1, q[8];  // q: signed int8x4, q - 32
  u16 dh;
  float d, sc[4];
  int h, l0;
  __device__ void fetch(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    dh = ld16(blk + 208);
    const u8* ql = blk + 64 * h + l0;
    la0 = ld32_a2(ql); la1 = ld32_a2(ql + 4);       // j = 0 (low), 2 (high nibbles)
    lb0 = ld32_a2(ql + 32); lb1 = ld32_a2(ql + 36);  // j = 1, 3
    h0 = ld32_a2(blk + 128 + 32 * h + l0); h1 = ld32_a2(blk + 132 + 32 * h + l0);
    s0 = ld32_a2(blk + 192 + 8 * h); s1 = ld32_a2(blk + 196 + 8 * h);
  }
  __device__ void decode() {
    d = h2f(dh);
    const u32 s4 = pick_even4(s0, s1, l0 >> 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j] = (float)(int)(i8)(s4 >> (8 * j));
      const u32 a = (j & 1) ? lb0 : la0, b = (j & 1) ? lb1 : la1;
      const int sh = 4 * (j >> 1);
      const u32 va = ((a >> sh) & M4) | (((h0 >> (2 * j)) & 0x03030303u) << 4);
      const u32 vb = ((b >> sh) & M4) | (((h1 >> (2 * j)) & 0x03030303u) << 4);
      q[2 * j] = (va + 0x60606060u) ^ 0x80808080u;  // bytes 0..63 -> -32..31, no carries
      q[2 * j + 1] = (vb + 0x60606060u) ^ 0x80808080u;
    }
  }
  __device__ XJ xload(const i8* xq, int lo, const float2* xds) const { return xjload(xq, lo, xds, h, l0); }
  __device__ float dot(const XJ& x) const {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      acc += x.dx[j] * sc[j] * comb(dot2(q[2 * j], q[2 * j + 1], x.h[j]), dot2(q[2 * j], q[2 * j + 1], x.l[j]));
    return d * acc;
  }
};

template <int TYPE> struct UnitOf;
template <> struct UnitOf<T_Q4_0> { typedef UQ4_0 T; };
template <> struct UnitOf<T_Q4_1> { typedef UQ4_1 T; };
template <> struct UnitOf<T_Q5_0> { typedef UQ5_0 T; };
template <> struct UnitOf<T_Q5_1> { typedef UQ5_1 T; };
template <> struct UnitOf<T_Q8_0> { typedef UQ8_0 T; };
template <> struct UnitOf<T_Q2_K> { typedef UQ2_K T; };
template <> struct UnitOf<T_Q3_K> { typedef UQ3_K T; };
template <> struct UnitOf<T_Q4_K> { typedef UQ4_K T; };
template <> struct UnitOf<T_Q5_K> { typedef UQ5_K T; };
template <> struct UnitOf<T_Q6_K> { typedef UQ6_K T; };
