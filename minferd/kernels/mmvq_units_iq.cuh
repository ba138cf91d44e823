// The mat-vec units of the table-lookup types (IQ4_NL, IQ4_XS, MXFP4): each 4-bit index names
// an int8 value of a 16-entry table (kvalues_iq4nl, or MXFP4's e2m1 values doubled), so a unit
// looks its nibbles up into int8x4 words and the dot is Q4_0's, with no offset term. The
// shared loads are in mmvq_units.cuh; UnitOf in mmvq_units_k.cuh names these too.
// tests/host checks them on the CPU against f64 (tests/unit/test_kernels_host.py).
#pragma once
#include "mmvq_units.cuh"

// The table values of the 8 nibbles of q, the 16-byte table as words t0..t3 (bytes 0-15):
// .x those of the low nibbles of q's bytes 0-3, .y those of the high nibbles. llama.cpp's
// get_int_from_table_16: a byte permute of each table half by the nibbles' low 3 bits, then one
// that takes the half the nibble's bit 3 names (bit 3 is masked off the first selectors: a
// selector nibble's own bit 3 means sign replication to the PTX prmt).
__device__ __forceinline__ int2 lut16(u32 q, u32 t0, u32 t1, u32 t2, u32 t3) {
  const u32 idx = q & 0x77777777u, half = 0x32103210u | ((q & 0x88888888u) >> 1);
  u32 v[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const u32 s = idx >> (16 * i);
    v[i] = __byte_perm(__byte_perm(t0, t1, s), __byte_perm(t2, t3, s), half >> (16 * i));
  }
  return make_int2((int)__byte_perm(v[0], v[1], 0x6420), (int)__byte_perm(v[0], v[1], 0x7531));
}

template <u64 LO, u64 HI>
__device__ __forceinline__ int2 lut(u32 q) { return lut16(q, (u32)LO, (u32)(LO >> 32), (u32)HI, (u32)(HI >> 32)); }

// Unit u of a 32-element block whose 16 nibble bytes are the words a, b at bytes 8u, 8u+4:
// elements 8u..8u+7 (low nibbles) and 16+8u..16+8u+7 (high), in UQ4_0's word order.
template <u64 LO, u64 HI>
__device__ __forceinline__ void lut_unit(u32 a, u32 b, u32* q) {
  const int2 qa = lut<LO, HI>(a), qb = lut<LO, HI>(b);
  q[0] = (u32)qa.x; q[1] = (u32)qb.x; q[2] = (u32)qa.y; q[3] = (u32)qb.y;
}

struct UIQ4_NL : UQ4_0 {  // Q4_0's layout, loads and x; y = d * kv[q], no offset
  static constexpr int TYPE = T_IQ4_NL;
  __device__ void decode() {
    d = h2f(dh);
    lut_unit<KV_IQ4NL_LO, KV_IQ4NL_HI>(a, b, q);
  }
  __device__ float dot(const X32& x) const { return d * x.ds.x * x32dot(q, x); }
};

struct UMXFP4 {  // 17 B, byte-aligned: byte loads. [0] e8m0 exponent, [1:17] nibbles as Q4_0's
  static constexpr int TYPE = T_MXFP4, QK = 32, BB = 17, U = 2;
  u32 e, a, b, q[4];
  float d;
  int u;
  __device__ void fetch(const u8* blk, int u_) {
    u = u_;
    e = __ldg(blk);
    const u8* p = blk + 1 + 8 * u;
    a = (u32)__ldg(p) | (u32)__ldg(p + 1) << 8 | (u32)__ldg(p + 2) << 16 | (u32)__ldg(p + 3) << 24;
    b = (u32)__ldg(p + 4) | (u32)__ldg(p + 5) << 8 | (u32)__ldg(p + 6) << 16 | (u32)__ldg(p + 7) << 24;
  }
  __device__ void decode() {
    d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);  // 2^(e-128): half the e8m0 scale
    lut_unit<KV_MXFP4_LO, KV_MXFP4_HI>(a, b, q);
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq, lo, xds, u); }
  __device__ float dot(const X32& x) const { return d * x.ds.x * x32dot(q, x); }
};

struct UIQ4_XS {  // 136 B, 8-aligned. Unit u: sub-block j = u/2, its bytes 8(u%2)..+7
  static constexpr int TYPE = T_IQ4_XS, QK = 256, BB = 136, U = 16;
  u32 dh, sl, q[4];
  uint2 w;
  float dl;
  int j, h;
  __device__ void fetch(const u8* blk, int u) {
    j = u >> 1; h = u & 1;
    dh = ld32_a4(blk);      // d, scales_h
    sl = ld32_a4(blk + 4);  // scales_l
    w = ld64_a8(blk + 8 + 16 * j + 8 * h);
  }
  __device__ void decode() {
    const int ls = (int)(((sl >> (4 * j)) & 0xF) | ((((dh >> 16) >> (2 * j)) & 3) << 4));
    dl = __fmul_rn(h2f((u16)dh), (float)(ls - 32));
    lut_unit<KV_IQ4NL_LO, KV_IQ4NL_HI>(w.x, w.y, q);
  }
  __device__ X32 xload(const i8* xq, int lo, const float2* xds) const { return x32load(xq + 32 * xq_pos8(j), lo, xds + j, h); }
  __device__ float dot(const X32& x) const { return dl * x.ds.x * x32dot(q, x); }
};
