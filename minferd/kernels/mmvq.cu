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
// unit and bring the error to ~1e-5.
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
#include "blocks.cuh"
#include "xquant.cuh"

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
  const i64 gw = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31, nkb = K >> 5;
  if (gw >= (i64)ncols * nkb) return;  // whole warps leave together
  const int c = (int)(gw / nkb), kb = (int)(gw % nkb);
  quantize_block32(x[(i64)c * K + 32 * kb + lane], lane, xq + (i64)c * 2 * K + 32 * kb, K, xds + (i64)c * kbp + kb);
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

// out[c, r] = sum_k x[c, k] * W[r, k] for r < nrows, c < ncols (<= NC).
// A CTA is NW warps in groups of KW: each group owns R rows, its KW warps split the row's
// units between them (KW > 1 gives short rows and few-row matrices more loads in flight)
// and add up through shared memory. Per step a lane fetches UNR units of each of its R rows
// (all loads issued before any is used: the index is clamped instead of branched on, so the
// compiler keeps them together), then decodes and multiplies the valid ones.
//
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
  static_assert(NW % KW == 0, "warps per CTA must be a multiple of warps per row group");
  typedef typename UnitOf<TYPE>::T Unit;
  constexpr int U = Unit::U, QK = Unit::QK, BB = Unit::BB, STEP = 32 * KW;
  const int seg = blockIdx.x < cta1 ? 0 : (blockIdx.x < cta2 ? 1 : 2);
  const u8* __restrict__ W = seg == 0 ? W0 : (seg == 1 ? W1 : W2);
  const int nrows = seg == 0 ? rows0 : (seg == 1 ? rows1 : rows2);
  float* __restrict__ out = seg == 0 ? out0 : (seg == 1 ? out1 : out2);
  const float* __restrict__ bias = seg == 0 ? bias0 : (seg == 1 ? bias1 : bias2);
  const int bx = blockIdx.x - (seg == 0 ? 0 : (seg == 1 ? cta1 : cta2));
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
#pragma unroll
      for (int r = 0; r < R; ++r) w[k][r].fetch(rowp[r] + (i64)(i / U) * BB, i % U);
    }
#pragma unroll
    for (int k = 0; k < UNR; ++k) {
      const int i = i0 + STEP * k;
      if (i < nunits) {
        const int b = i / U;
#pragma unroll
        for (int r = 0; r < R; ++r) w[k][r].decode();
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c < ncols) {
            const i8* xqc = xq + (i64)c * 2 * K + (i64)b * QK;
            const float2* xdc = xds + (i64)c * kbp + b * (QK / 32);
            const auto xv = w[k][0].xload(xqc, K, xdc);  // unit position is the same in every row
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][c] += w[k][r].dot(xv);
          }
        }
      }
    }
  }
  if constexpr (KW == 1) {
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
      if (c < ncols && row0 + r < nrows) store_out(out, bias, res, nrows, c, row0 + r, v);
    }
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
          int ncols, float* __restrict__ out, const float* __restrict__ bias, const float* __restrict__ res) {
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
    if (lane == 0 && c < ncols) store_out(out, bias, res, nrows, c, row, s);
  }
}
