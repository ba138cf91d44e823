// The mat-vec units of the K-quants (Q2_K..Q6_K, 256-element super-blocks), and UnitOf<TYPE>,
// the table mmvq.cu picks a type's unit from. The shared loads and the 32-element types are in
// mmvq_units.cuh, the table-lookup types in mmvq_units_iq.cuh.
#pragma once
#include "mmvq_units.cuh"
#include "mmvq_units_iq.cuh"

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
    const i8* p0 = xq + 32 * xq_pos8(2 * c) + 16 * k;  // x blocks 2c and 2c + 1: 128 bytes apart
    const i8* p1 = xq + 32 * xq_pos8(2 * c + 1) + 16 * k;
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

// Q6_K, 210 B, 2-aligned. A unit of P positions: h = u / (32/P), l = P(u % (32/P)) .. + P - 1, all
// 4 quarters j; its three P-byte runs and the 8 scale bytes as aligned words (RunsA2).
// P = 8 (UQ6_K, U = 8): 13 loads a unit, not 17. P = 16 (UQ6_K16, U = 4, kernel id
// T_Q6_K_U16, mmvq.py's WIDE_UNITS): 19 loads for 64 weights where two
// 8-position units take 26 (the L1 was still 73-82% busy after RunsA2, session 20).
template <int P> struct UQ6_KP {
  static constexpr int TYPE = T_Q6_K, QK = 256, BB = 210, U = 256 / (4 * P), W = P / 4;
  u32 la[W], lb[W], hq[W], s0, s1, q[4 * W];  // q[W j + i]: signed int8x4, q - 32
  u16 dh;
  float d, sc[4];
  int h, l0;
  __device__ void fetch(const u8* blk, int u) {
    h = u >> (P == 8 ? 2 : 1); l0 = (u & (32 / P - 1)) * P;
    dh = ld16(blk + 208);
    const RunsA2 runs(blk);
    runs.get(64 * h + l0, la);       // j = 0 (low), 2 (high nibbles)
    runs.get(64 * h + l0 + 32, lb);  // j = 1, 3
    runs.get(128 + 32 * h + l0, hq);
    u32 s[2];
    runs.get(192 + 8 * h, s); s0 = s[0]; s1 = s[1];
  }
  __device__ void decode() {
    d = h2f(dh);
    const u32 s4 = pick_even4(s0, s1, l0 >> 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j] = (float)(int)(i8)(s4 >> (8 * j));
      const int sh = 4 * (j >> 1);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const u32 a = (j & 1) ? lb[i] : la[i];
        const u32 v = ((a >> sh) & M4) | (((hq[i] >> (2 * j)) & 0x03030303u) << 4);
        q[W * j + i] = (v + 0x60606060u) ^ 0x80808080u;  // bytes 0..63 -> -32..31, no carries
      }
    }
  }
  __device__ XJP<P> xload(const i8* xq, int lo, const float2* xds) const { return xjload<P>(xq, lo, xds, h, l0); }
  __device__ float dot(const XJP<P>& x) const {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (P == 8)
        acc += x.dx[j] * sc[j] * comb(dot2(q[2 * j], q[2 * j + 1], x.h[j]), dot2(q[2 * j], q[2 * j + 1], x.l[j]));
      else
        acc += x.dx[j] * sc[j] * comb(dot4(q + 4 * j, x.h[j], 0), dot4(q + 4 * j, x.l[j], 0));
    }
    return d * acc;
  }
};
typedef UQ6_KP<8> UQ6_K;
typedef UQ6_KP<16> UQ6_K16;
constexpr int T_Q6_K_U16 = 100 + T_Q6_K;

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
template <> struct UnitOf<T_Q6_K_U16> { typedef UQ6_K16 T; };
template <> struct UnitOf<T_IQ4_NL> { typedef UIQ4_NL T; };
template <> struct UnitOf<T_IQ4_XS> { typedef UIQ4_XS T; };
template <> struct UnitOf<T_MXFP4> { typedef UMXFP4 T; };
