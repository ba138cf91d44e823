// Quantized matrix x small-batch products for decode: out (n, rows) = x (n, K) @ W.T, W the
// GGUF rows of any type, n <= 8. Decode is memory-bound: the whole game is streaming W's
// bytes once, at HBM speed, for all n columns together.
//
// How (as llama.cpp's MMVQ): x is first quantized to int8 per 32 elements (quantize_x:
// q8_1 style, scale d and the exact f32 sum of the block), so the inner product of a
// weight block is integer dp4a work: 4 multiply-adds per instruction, weights never turned
// into floats element by element. That keeps the instruction count per weight byte far
// under what the SM can issue (an f32 path needs ~4 instructions per element, about the
// whole issue budget at 4 TB/s of Q4_K), and x costs 1 byte per element of L1 traffic
// instead of 4. The price is x rounded to 8 bits: ~0.3% relative error, well inside the
// 1e-2 the tests hold us to (and the same trade llama.cpp makes).
//
// Work split: one warp per R rows; its lanes walk the row in "units" (a fixed slice of one
// block: U units per block, U a power of two, so neighbouring lanes read neighbouring
// bytes and every warp load is a few contiguous cache lines). Each lane first issues the
// loads of UNR units x R rows, then does the arithmetic: those loads are in flight
// together, which is what keeps enough bytes moving per SM to saturate HBM. A unit's
// weights are decoded once into int8x4 registers and reused for every column. Partial sums
// are reduced with warp shuffles; no shared memory, no __syncthreads.
//
// Loads are as wide as the block's guaranteed alignment allows (blocks.cuh has the table):
// Q4_K/Q5_K get 16-byte loads, the 2-aligned types (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K) read u16
// pairs. Float weights (F32/F16/BF16) take mmv_float, which keeps x in f32.
//
// CPU reference: x @ dequant_ref.dequantize(W).T (tests/cuda/test_mmvq.py, in f64).
#include "blocks.cuh"

#define M4 0x0F0F0F0Fu

// Exact int -> float for |v| < 2^22 in two full-rate ops (I2F runs at 1/8 of FMA rate on
// sm_90 and n=8 columns would make it the bottleneck). Every dp4a sum below stays far
// inside that range; the largest, Q6_K's dp*sc, is bounded by 8*32*127*128 < 2^22.
__device__ __forceinline__ float i2f(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }

// Spread the 4 bits of n (0..15) to bit 4 of each byte: the 5th bit of 4 Q5 elements.
// n * 0x02040810 puts bit i at 8i + 4 (and the other copies where they collide with nothing).
__device__ __forceinline__ u32 spread4(u32 n) { return (n * 0x02040810u) & 0x10101010u; }

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

// ---------------------------------------------------------------------------------------
// Units. load(blk, u) reads unit u of the block at blk and decodes it; dot(xq, xds, u)
// returns its contribution for one column, xq/xds pointing at that column's x for this
// block (QK int8 values, QK/32 (d, sum) pairs). Min/offset terms that use the block's exact
// sum of x are added by unit 0 (or the lane holding the sub-block's first half) only.

struct UQ4_0 {  // 18 B, 2-aligned. Unit u: bytes 8u..8u+7 -> elements 8u.. and 16+8u..
  static constexpr int TYPE = T_Q4_0, QK = 32, BB = 18, U = 2;
  u32 q[4];
  float d;
  int u;
  __device__ void load(const u8* blk, int u_) {
    u = u_;
    d = h2f(ld16(blk));
    const u32 a = ld32_a2(blk + 2 + 8 * u), b = ld32_a2(blk + 6 + 8 * u);
    q[0] = a & M4; q[1] = b & M4; q[2] = (a >> 4) & M4; q[3] = (b >> 4) & M4;
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int2 xa = ldx8(xq + 8 * u), xb = ldx8(xq + 16 + 8 * u);
    const int s = dot4(q, make_int4(xa.x, xa.y, xb.x, xb.y), 0);
    const float2 ds = __ldg(xds);
    return d * (ds.x * i2f(s) - (u == 0 ? 8.0f * ds.y : 0.0f));  // sum (q-8)x = sum qx - 8 sum x
  }
};

struct UQ4_1 {  // 20 B, 4-aligned; y = d*q + m
  static constexpr int TYPE = T_Q4_1, QK = 32, BB = 20, U = 2;
  u32 q[4];
  float d, m;
  int u;
  __device__ void load(const u8* blk, int u_) {
    u = u_;
    const u32 dm = ld32_a4(blk);
    d = h2f((u16)dm); m = h2f((u16)(dm >> 16));
    const u32 a = ld32_a4(blk + 4 + 8 * u), b = ld32_a4(blk + 8 + 8 * u);
    q[0] = a & M4; q[1] = b & M4; q[2] = (a >> 4) & M4; q[3] = (b >> 4) & M4;
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int2 xa = ldx8(xq + 8 * u), xb = ldx8(xq + 16 + 8 * u);
    const int s = dot4(q, make_int4(xa.x, xa.y, xb.x, xb.y), 0);
    const float2 ds = __ldg(xds);
    return d * ds.x * i2f(s) + (u == 0 ? m * ds.y : 0.0f);
  }
};

struct UQ5_0 {  // 22 B, 2-aligned: qh (at 22g + 2) as two u16, never one u32
  static constexpr int TYPE = T_Q5_0, QK = 32, BB = 22, U = 2;
  u32 q[4];
  float d;
  int u;
  __device__ void load(const u8* blk, int u_) {
    u = u_;
    d = h2f(ld16(blk));
    const u32 qh = ld32_a2(blk + 2);
    const u32 a = ld32_a2(blk + 6 + 8 * u), b = ld32_a2(blk + 10 + 8 * u);
    const u32 hl = qh >> (8 * u), hh = qh >> (16 + 8 * u);
    q[0] = (a & M4) | spread4(hl & 0xF);
    q[1] = (b & M4) | spread4((hl >> 4) & 0xF);
    q[2] = ((a >> 4) & M4) | spread4(hh & 0xF);
    q[3] = ((b >> 4) & M4) | spread4((hh >> 4) & 0xF);
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int2 xa = ldx8(xq + 8 * u), xb = ldx8(xq + 16 + 8 * u);
    const int s = dot4(q, make_int4(xa.x, xa.y, xb.x, xb.y), 0);
    const float2 ds = __ldg(xds);
    return d * (ds.x * i2f(s) - (u == 0 ? 16.0f * ds.y : 0.0f));
  }
};

struct UQ5_1 {  // 24 B, 8-aligned; y = d*q + m
  static constexpr int TYPE = T_Q5_1, QK = 32, BB = 24, U = 2;
  u32 q[4];
  float d, m;
  int u;
  __device__ void load(const u8* blk, int u_) {
    u = u_;
    const uint2 h = ld64_a8(blk);  // d, m, qh
    d = h2f((u16)h.x); m = h2f((u16)(h.x >> 16));
    const u32 qh = h.y;
    const uint2 ab = ld64_a8(blk + 8 + 8 * u);
    const u32 hl = qh >> (8 * u), hh = qh >> (16 + 8 * u);
    q[0] = (ab.x & M4) | spread4(hl & 0xF);
    q[1] = (ab.y & M4) | spread4((hl >> 4) & 0xF);
    q[2] = ((ab.x >> 4) & M4) | spread4(hh & 0xF);
    q[3] = ((ab.y >> 4) & M4) | spread4((hh >> 4) & 0xF);
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int2 xa = ldx8(xq + 8 * u), xb = ldx8(xq + 16 + 8 * u);
    const int s = dot4(q, make_int4(xa.x, xa.y, xb.x, xb.y), 0);
    const float2 ds = __ldg(xds);
    return d * ds.x * i2f(s) + (u == 0 ? m * ds.y : 0.0f);
  }
};

struct UQ8_0 {  // 34 B, 2-aligned. Unit u: int8 elements 16u..16u+15
  static constexpr int TYPE = T_Q8_0, QK = 32, BB = 34, U = 2;
  u32 q[4];
  float d;
  int u;
  __device__ void load(const u8* blk, int u_) {
    u = u_;
    d = h2f(ld16(blk));
    const u8* p = blk + 2 + 16 * u;
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = ld32_a2(p + 4 * i);
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int s = dot4(q, ldx16(xq + 16 * u), 0);
    return d * __ldg(xds).x * i2f(s);
  }
};

struct UQ2_K {  // 84 B, 4-aligned. Unit u: h = u/4, l = 8(u%4)..+7, for all 4 shifts j
  static constexpr int TYPE = T_Q2_K, QK = 256, BB = 84, U = 8;
  u32 q[8];  // [j][2]
  float d, dmin, sc[4], mn[4];
  int h, l0;
  __device__ void load(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    const u32 dd = ld32_a4(blk + 80);
    d = h2f((u16)dd); dmin = h2f((u16)(dd >> 16));
    const u32 a = ld32_a4(blk + 16 + 32 * h + l0), b = ld32_a4(blk + 20 + 32 * h + l0);
    // scales of sub-blocks 8h + 2j + l0/16, j = 0..3: bytes l0/16 + {0,2,4,6} of 8h..8h+7
    const u32 s4 = pick_even4(ld32_a4(blk + 8 * h), ld32_a4(blk + 8 * h + 4), l0 >> 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[2 * j] = (a >> (2 * j)) & 0x03030303u;
      q[2 * j + 1] = (b >> (2 * j)) & 0x03030303u;
      sc[j] = (float)((s4 >> (8 * j)) & 0xF);
      mn[j] = (float)((s4 >> (8 * j + 4)) & 0xF);
    }
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const float4 ds01 = ldds4(xds + 4 * h), ds23 = ldds4(xds + 4 * h + 2);
    const float dx[4] = {ds01.x, ds01.z, ds23.x, ds23.z};
    float accd = 0.f, accm = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int2 xv = ldx8(xq + 128 * h + 32 * j + l0);
      const int sd = __dp4a((int)q[2 * j], xv.x, __dp4a((int)q[2 * j + 1], xv.y, 0));
      // the min applies per 16 elements; the stored exact sum covers 32, so use sum(xq)
      const int sm = __dp4a(0x01010101, xv.x, __dp4a(0x01010101, xv.y, 0));
      accd += dx[j] * sc[j] * i2f(sd);
      accm += dx[j] * mn[j] * i2f(sm);
    }
    return d * accd - dmin * accm;
  }
};

struct UQ3_K {  // 110 B, 2-aligned. Unit u: h = u/4, l = 8(u%4)..+7, all 4 shifts j
  static constexpr int TYPE = T_Q3_K, QK = 256, BB = 110, U = 8;
  u32 q[8];  // signed int8x4: (q2 | hbit << 2) - 4
  float d, sc[4];
  int h, l0;
  __device__ void load(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    const int o = l0 >> 4;
    d = h2f(ld16(blk + 108));
    const u32 a = ld32_a2(blk + 32 + 32 * h + l0), b = ld32_a2(blk + 36 + 32 * h + l0);
    const u32 ha = ld32_a2(blk + l0), hb = ld32_a2(blk + l0 + 4);
    // 6-bit scales s = 8h + 2j + o: low nibble = nibble h of byte 2j+o; top 2 bits = bits
    // 2(2h + j/2) of byte 8 + (2j+o)%4.
    const u32 lo = (pick_even4(ld32_a2(blk + 96), ld32_a2(blk + 100), o) >> (4 * h)) & M4;
    const u32 hw = __byte_perm(ld32_a2(blk + 104), 0, (u32)(o | (o + 2) << 4 | o << 8 | (o + 2) << 12));
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
  __device__ float dot(const i8* xq, const float2* xds) const {
    const float4 ds01 = ldds4(xds + 4 * h), ds23 = ldds4(xds + 4 * h + 2);
    const float dx[4] = {ds01.x, ds01.z, ds23.x, ds23.z};
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int2 xv = ldx8(xq + 128 * h + 32 * j + l0);
      const int s = __dp4a((int)q[2 * j], xv.x, __dp4a((int)q[2 * j + 1], xv.y, 0));
      acc += dx[j] * sc[j] * i2f(s);
    }
    return d * acc;
  }
};

// Q4_K/Q5_K unit u: sub-blocks 2c and 2c+1 (c = u/2), elements 16k..16k+15 of each (k = u%2).
// Sub-blocks are 32 elements = one x block, so the min term uses x's exact block sum and is
// added by the k == 0 lane.
struct UK45 {
  u32 q[8];  // [0:4] sub-block 2c, [4:8] sub-block 2c+1, unsigned bytes
  float d, dmin, sc0, sc1, m0, m1;
  int c, k;
  __device__ void scales(uint4 hdr) {
    d = h2f((u16)hdr.x); dmin = h2f((u16)(hdr.x >> 16));
    const u32 b0 = hdr.y, b1 = hdr.z, b2 = hdr.w;  // ggml get_scale_min_k4, 4 at a time
    const u32 scw = c < 2 ? (b0 & 0x3F3F3F3Fu) : ((b2 & M4) | ((b0 >> 2) & 0x30303030u));
    const u32 mw = c < 2 ? (b1 & 0x3F3F3F3Fu) : (((b2 >> 4) & M4) | ((b1 >> 2) & 0x30303030u));
    const int sh = 16 * (c & 1);
    sc0 = (float)((scw >> sh) & 0xFF); sc1 = (float)((scw >> (sh + 8)) & 0xFF);
    m0 = (float)((mw >> sh) & 0xFF); m1 = (float)((mw >> (sh + 8)) & 0xFF);
  }
  __device__ float dot(const i8* xq, const float2* xds) const {
    const int4 x0 = ldx16(xq + 64 * c + 16 * k), x1 = ldx16(xq + 64 * c + 32 + 16 * k);
    const float4 ds = ldds4(xds + 2 * c);  // (d, sum) of x blocks 2c and 2c+1
    const int s0 = dot4(q, x0, 0), s1 = dot4(q + 4, x1, 0);
    const float r = d * (sc0 * ds.x * i2f(s0) + sc1 * ds.z * i2f(s1));
    return k == 0 ? r - dmin * (m0 * ds.y + m1 * ds.w) : r;
  }
};

struct UQ4_K : UK45 {  // 144 B, 16-aligned: 16-byte loads
  static constexpr int TYPE = T_Q4_K, QK = 256, BB = 144, U = 8;
  __device__ void load(const u8* blk, int u) {
    c = u >> 1; k = u & 1;
    const uint4 hdr = ldw128(blk);
    const uint4 v = ldw128(blk + 16 + 32 * c + 16 * k);
    scales(hdr);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { q[i] = w[i] & M4; q[4 + i] = (w[i] >> 4) & M4; }
  }
};

struct UQ5_K : UK45 {  // 176 B, 16-aligned
  static constexpr int TYPE = T_Q5_K, QK = 256, BB = 176, U = 8;
  __device__ void load(const u8* blk, int u) {
    c = u >> 1; k = u & 1;
    const uint4 hdr = ldw128(blk);
    const uint4 hv = ldw128(blk + 16 + 16 * k);
    const uint4 v = ldw128(blk + 48 + 32 * c + 16 * k);
    scales(hdr);
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
  u32 q[8];  // signed int8x4, q - 32
  float d, sc[4];
  int h, l0;
  __device__ void load(const u8* blk, int u) {
    h = u >> 2; l0 = (u & 3) * 8;
    d = h2f(ld16(blk + 208));
    const u8* ql = blk + 64 * h + l0;
    const u32 la0 = ld32_a2(ql), la1 = ld32_a2(ql + 4);        // j = 0 (low), 2 (high nibbles)
    const u32 lb0 = ld32_a2(ql + 32), lb1 = ld32_a2(ql + 36);  // j = 1, 3
    const u32 h0 = ld32_a2(blk + 128 + 32 * h + l0), h1 = ld32_a2(blk + 132 + 32 * h + l0);
    const u32 s4 = pick_even4(ld32_a2(blk + 192 + 8 * h), ld32_a2(blk + 196 + 8 * h), l0 >> 4);
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
  __device__ float dot(const i8* xq, const float2* xds) const {
    const float4 ds01 = ldds4(xds + 4 * h), ds23 = ldds4(xds + 4 * h + 2);
    const float dx[4] = {ds01.x, ds01.z, ds23.x, ds23.z};
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int2 xv = ldx8(xq + 128 * h + 32 * j + l0);
      const int s = __dp4a((int)q[2 * j], xv.x, __dp4a((int)q[2 * j + 1], xv.y, 0));
      acc += dx[j] * sc[j] * i2f(s);
    }
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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------
// x (ncols, K) f32 -> xq (ncols, K) int8 and xds (ncols, kbp) (d, sum) per 32 elements:
// one warp per 32-element block. kbp >= K/32 is a multiple of 4, so every column's xds
// row is 32-byte aligned and the kernels can read (d, sum) pairs as float4.
extern "C" __global__ void quantize_x(const float* __restrict__ x, int K, int ncols, int kbp,
                                      i8* __restrict__ xq, float2* __restrict__ xds) {
  const i64 gw = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31, nkb = K >> 5;
  if (gw >= (i64)ncols * nkb) return;  // whole warps leave together
  const int c = (int)(gw / nkb), kb = (int)(gw % nkb);
  const i64 e = (i64)c * K + 32 * kb + lane;
  const float v = x[e];
  float amax = fabsf(v), sum = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  const float d = amax / 127.0f;
  const int q = amax == 0.0f ? 0 : max(-127, min(127, __float2int_rn(v / d)));
  xq[e] = (i8)q;
  if (lane == 0) xds[(i64)c * kbp + kb] = make_float2(d, sum);
}

// out[c, r] = sum_k x[c, k] * W[r, k] for r < nrows, c < ncols (<= NC).
template <int TYPE, int NC, int NW, int R, int UNR>
__global__ void __launch_bounds__(NW * 32)
mmvq(const u8* __restrict__ W, i64 row_bytes, int nrows, int nb, const i8* __restrict__ xq,
     const float2* __restrict__ xds, int K, int kbp, int ncols, float* __restrict__ out) {
  typedef typename UnitOf<TYPE>::T Unit;
  constexpr int U = Unit::U, QK = Unit::QK, BB = Unit::BB;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * NW + (threadIdx.x >> 5)) * R;
  if (row0 >= nrows) return;
  const int nunits = nb * U;
  float acc[R][NC];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
  const u8* rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = W + (i64)min(row0 + r, nrows - 1) * row_bytes;  // tail rows: redo the last, discard

  for (int i0 = lane; i0 < nunits; i0 += 32 * UNR) {
    Unit w[UNR][R];
#pragma unroll
    for (int k = 0; k < UNR; ++k) {  // all loads first: UNR*R units in flight per lane
      const int i = i0 + 32 * k;
      if (i < nunits) {
#pragma unroll
        for (int r = 0; r < R; ++r) w[k][r].load(rowp[r] + (i64)(i / U) * BB, i % U);
      }
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int i = i0 + 32 * k;
      if (i < nunits) {
        const int b = i / U;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            const i8* xqc = xq + (i64)c * K + (i64)b * QK;
            const float2* xdc = xds + (i64)c * kbp + b * (QK / 32);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][c] += w[k][r].dot(xqc, xdc);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float v = warp_sum(acc[r][c]);
      if (lane == 0 && c < ncols && row0 + r < nrows) out[(i64)c * nrows + row0 + r] = v;
    }
}

// ---------------------------------------------------------------------------------------
// Float weights: x stays f32 (no reason to round it when W is not quantized). One warp per
// row, lanes over chunks of VEC elements (VEC 8: 16-byte loads of f16/bf16, 2 x 16 of f32,
// when rows are 16-aligned and K % 8 == 0; else VEC 1, scalar).
template <int TYPE>
__device__ __forceinline__ void load8(const u8* p, float* v) {
  if constexpr (TYPE == T_F32) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y); v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);
    v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y); v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);
  } else {
    const uint4 a = ldw128(p);
    const u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (TYPE == T_F16) {
        v[2 * i] = h2f((u16)w[i]); v[2 * i + 1] = h2f((u16)(w[i] >> 16));
      } else {  // BF16
        v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    }
  }
}

template <int TYPE, int NC, int VEC>
__global__ void __launch_bounds__(128)
mmv_float(const u8* __restrict__ W, i64 row_bytes, int nrows, int K, const float* __restrict__ x,
          int ncols, float* __restrict__ out) {
  constexpr int UNR = 2, ES = Blk<TYPE>::BB;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (row >= nrows) return;
  const u8* rp = W + (i64)row * row_bytes;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
  for (int e00 = lane * VEC; e00 < K; e00 += 32 * VEC * UNR) {
    float v[UNR][VEC];
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int e0 = e00 + 32 * VEC * k;
      if (e0 < K) {
        if constexpr (VEC == 8) load8<TYPE>(rp + (i64)e0 * ES, v[k]);
        else Blk<TYPE>::dec(rp, e0, 1, v[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int e0 = e00 + 32 * VEC * k;
      if (e0 < K) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            const float* xc = x + (i64)c * K + e0;
            if constexpr (VEC == 8) {
              const float4 a = __ldg(reinterpret_cast<const float4*>(xc)), b = __ldg(reinterpret_cast<const float4*>(xc) + 1);
              acc[c] += v[k][0] * a.x + v[k][1] * a.y + v[k][2] * a.z + v[k][3] * a.w +
                        v[k][4] * b.x + v[k][5] * b.y + v[k][6] * b.z + v[k][7] * b.w;
            } else {
              acc[c] += v[k][0] * __ldg(xc);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float s = warp_sum(acc[c]);
    if (lane == 0 && c < ncols) out[(i64)c * nrows + row] = s;
  }
}
