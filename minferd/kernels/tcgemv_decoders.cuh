// tcgemv.cu's weight decoders: each type's blocks into f16 mma fragments in registers, and
// x's B fragments from the staged copy (tests/host/kernels_host.cpp runs them on the host).
//
// Fragments: A = 16 weight rows x 16 k (row-major), B = 16 k x 8 tokens. Lane (g = lane/4,
// c = lane%4) holds rows g, g+8 at logical k {2c, 2c+1} and {2c+8, 2c+9}. A k-step may take any
// 16 elements of a row as its logical k, so long as x's fragments take the same ones: lane c
// takes 4 physical elements e0..e3 that lie together in the block (four nibbles or bytes of one
// u32), (e0, e1) as logical {2c, 2c+1} and (e2, e3) as {2c+8, 2c+9} (magic_pairs puts bytes 0, 1
// and 2, 3 of a word into f16 pairs). x is the f16 copy of the activations the cuBLAS path reads
// too (rmsnorm and the gated activation write it), staged in shared memory: one 8-byte load of
// e0..e3 is both of a lane's B registers (x_frag; Q4_K loads two steps' at once). Each type says which elements step k gives lane c (TcW<T>::xoff), how to
// load a block (fetch: loads only), what to make of it once landed (prep) and how to make step k's
// A registers (frag).
//
#pragma once
#include "blocks.cuh"
#include "mmvq_units_iq.cuh"  // lut: IQ4_NL's table lookup
#ifndef MINFERD_HOST_TEST  // tests/host/kernels_host.cpp has host twins of these, and of the mma
#include "mma.cuh"

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
  u32 r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
#endif
// 1024 in each half of an f16 pair: (1024 + b) for a byte b is exact, and b = (1024 + b) - 1024.
constexpr u32 MAGIC_H2 = 0x64006400u;
// Bytes 0, 1 and 2, 3 of v as the f16 pairs (1024 + byte): each byte under the mantissa of 1024.
__device__ __forceinline__ void magic_pairs(u32 v, u32& lo, u32& hi) {
  lo = __byte_perm(v, 0x64646464u, 0x4140);
  hi = __byte_perm(v, 0x64646464u, 0x4342);
}
// Half 0 or half 1 of an f16 pair in both halves (as PTX moves, which ptxas folds into the
// f16x2 op that reads them as an operand swizzle).
#ifndef MINFERD_HOST_TEST
__device__ __forceinline__ u32 bcast_lo(u32 v) {
  u32 r;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l};}" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ u32 bcast_hi(u32 v) {
  u32 r;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h};}" : "=r"(r) : "r"(v));
  return r;
}
#else
static inline u32 bcast_lo(u32 v) { return (v & 0xFFFFu) * 0x10001u; }
static inline u32 bcast_hi(u32 v) { return (v >> 16) * 0x10001u; }
#endif

// The low 4 bits of h, bit j to bit 4 of byte j: the fifth bits beside the nibbles.
__device__ __forceinline__ u32 fifth_bits(u32 h) {
  return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}
// q's four bytes (0..31 each) times the f16 scale pair s, less off (1024 + the type's zero point).
__device__ __forceinline__ void scaled(u32 q, u32 s, u32 off, u32& p0, u32& p1) {
  u32 lo, hi;
  magic_pairs(q, lo, hi);
  p0 = hmul2(hsub2(lo, off), s);
  p1 = hmul2(hsub2(hi, off), s);
}
// q's four bytes times d plus m, f16 pairs (d, d) and (m, m): one rounding, in the FMA.
__device__ __forceinline__ void affine(u32 q, u32 d2, u32 m2, u32& p0, u32& p1) {
  u32 lo, hi;
  magic_pairs(q, lo, hi);
  p0 = hfma2(hsub2(lo, MAGIC_H2), d2, m2);
  p1 = hfma2(hsub2(hi, MAGIC_H2), d2, m2);
}

template <int TYPE> struct TcW;

// A u32 at p, 4-aligned when A4, else 2-aligned (two u16 loads).
template <bool A4> __device__ __forceinline__ u32 ld32(const u8* p) { return A4 ? ld32_a4(p) : ld32_a2(p); }

// Q4_K, 144 B (16-aligned): d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
// sub-block j's element i is the low (j even) or high nibble of qs[32*(j/2) + i]. Step k: sub-block
// j = k/2, elements 8c + 4(k%2) .. +3: one u32 of the uint2 a lane loads per pair of sub-blocks.
// The eight d*sc and -dmin*m are made in f16 pairs by prep, once the loads have landed (fetch only
// issues them: a warp's loads for blocks ahead stay in flight); the f16 product of the exact f16 d
// and a 6-bit integer rounds once, as the f32 product rounded to f16 does.
template <> struct TcW<T_Q4_K> {
  static constexpr int QK = 256, BB = 144, STEPS = 16;
  static constexpr bool XPAIR = true;  // xoff(k + 1) = xoff(k) + 4 for even k: one 16-byte x load
  uint4 hdr;
  uint2 q[4];
  u32 s[4], nm[4];  // pairs (j, j+1) for j = 0, 2, 4, 6: s = d * sc_j, nm = -dmin * m_j
  __device__ __forceinline__ static int xoff(int k, int c) { return 32 * (k >> 1) + 8 * c + 4 * (k & 1); }
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    hdr = ld128_a16(b);
#pragma unroll
    for (int p = 0; p < 4; ++p) q[p] = ld64_a8(b + 16 + 32 * p + 8 * c);
  }
  __device__ __forceinline__ void prep() {
    // ggml's get_scale_min_k4: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7
    // (mins); 4-7 from the nibbles of bytes 8-11 and the top 2 bits of bytes 0-7.
    const u32 sc03 = hdr.y & 0x3F3F3F3Fu, m03 = hdr.z & 0x3F3F3F3Fu;
    const u32 sc47 = (hdr.w & M4) | ((hdr.y >> 2) & 0x30303030u), m47 = ((hdr.w >> 4) & M4) | ((hdr.z >> 2) & 0x30303030u);
    const u32 d2 = bcast_lo(hdr.x), nd2 = bcast_hi(hdr.x) ^ 0x80008000u;  // (d, d), (-dmin, -dmin)
    u32 lo, hi;
    magic_pairs(sc03, lo, hi);
    s[0] = hmul2(hsub2(lo, MAGIC_H2), d2), s[1] = hmul2(hsub2(hi, MAGIC_H2), d2);
    magic_pairs(sc47, lo, hi);
    s[2] = hmul2(hsub2(lo, MAGIC_H2), d2), s[3] = hmul2(hsub2(hi, MAGIC_H2), d2);
    magic_pairs(m03, lo, hi);
    nm[0] = hmul2(hsub2(lo, MAGIC_H2), nd2), nm[1] = hmul2(hsub2(hi, MAGIC_H2), nd2);
    magic_pairs(m47, lo, hi);
    nm[2] = hmul2(hsub2(lo, MAGIC_H2), nd2), nm[3] = hmul2(hsub2(hi, MAGIC_H2), nd2);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int j = k >> 1, p = j >> 1;
    const u32 sj = (j & 1) ? bcast_hi(s[p]) : bcast_lo(s[p]), nmj = (j & 1) ? bcast_hi(nm[p]) : bcast_lo(nm[p]);
    affine((((k & 1) ? q[p].y : q[p].x) >> (4 * (j & 1))) & M4, sj, nmj, p0, p1);
  }
};

// Q5_K, 176 B (16-aligned): Q4_K's header, then qh[32] (element 32j + l's fifth bit is bit j of
// qh[l]), then Q4_K's nibbles; the scales, mins and steps are Q4_K's.
template <> struct TcW<T_Q5_K> : TcW<T_Q4_K> {
  static constexpr int BB = 176;
  uint2 qh;  // qh[8c .. 8c + 7]: the lane's elements of both steps of every sub-block
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    hdr = ld128_a16(b);
    qh = ld64_a8(b + 16 + 8 * c);
#pragma unroll
    for (int p = 0; p < 4; ++p) q[p] = ld64_a8(b + 48 + 32 * p + 8 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int j = k >> 1, p = j >> 1;
    const u32 sj = (j & 1) ? bcast_hi(s[p]) : bcast_lo(s[p]), nmj = (j & 1) ? bcast_hi(nm[p]) : bcast_lo(nm[p]);
    const u32 w = ((((k & 1) ? q[p].y : q[p].x) >> (4 * (j & 1))) & M4) |
                  (((((k & 1) ? qh.y : qh.x) >> j) & 0x01010101u) << 4);
    affine(w, sj, nmj, p0, p1);
  }
};

// Q6_K, 210 B (2-aligned: u16 loads only): ql[128], qh[64], 16 int8 scales (one per 16), d.
// Element 128h + 32r + l (l < 32) is (ql[64h + 32(r&1) + l] >> 4(r>>1)) & 15 | ((qh[32h + l] >>
// 2r) & 3) << 4, minus 32, times d * scales[8h + 2r + l/16]. Step k = (h, r, l/16): a 16-element
// group of one scale, lane c's elements l = 16(l/16) + 4c .. +3.
template <> struct TcW<T_Q6_K> {
  static constexpr int QK = 256, BB = 210, STEPS = 16;
  static constexpr bool XPAIR = false;
  u32 ql[2][2][2], qh[2][2], sc[4], s[8];  // s: prep's d * scales, f16 pairs (2i, 2i + 1)
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) {
    return 128 * (k >> 3) + 32 * ((k >> 1) & 3) + 16 * (k & 1) + 4 * c;
  }
  // The 16 d * scale in f16 pairs, once a block, as Q4_K's prep: an int8 scale + 128 under 1024's
  // mantissa is exact, so is the subtract, and the f16 product rounds once, as the f32 product
  // rounded to f16 did (made in each step, it cost two conversions a step: Q6_K ran tcgemv at
  // half Q4_K's weights a second, prefill_gates_h200.json).
  __device__ __forceinline__ void prep() {
    const u32 d2 = (u32)dh * 0x10001u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u32 lo, hi;
      magic_pairs(sc[i] ^ 0x80808080u, lo, hi);
      s[2 * i] = hmul2(hsub2(lo, 0x64806480u), d2), s[2 * i + 1] = hmul2(hsub2(hi, 0x64806480u), d2);
    }
  }
  // Every u32 lies at a multiple of 4 from the block: all are 4-aligned when the block is (even
  // blocks of rows with an even block count), and half the loads suffice.
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    if ((reinterpret_cast<size_t>(b) & 3) == 0) load<true>(b, c);
    else load<false>(b, c);
  }
  template <bool A4> __device__ __forceinline__ void load(const u8* b, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int is = 0; is < 2; ++is) {
        qh[h][is] = ld32<A4>(b + 128 + 32 * h + 16 * is + 4 * c);
#pragma unroll
        for (int r1 = 0; r1 < 2; ++r1) ql[h][r1][is] = ld32<A4>(b + 64 * h + 32 * r1 + 16 * is + 4 * c);
      }
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = ld32<A4>(b + 192 + 4 * i);
    dh = ld16(b + 208);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int h = k >> 3, r = (k >> 1) & 3, is = k & 1, si = 8 * h + 2 * r + is;
    const u32 lw = ql[h][r & 1][is] >> (4 * (r >> 1)), hw = qh[h][is] >> (2 * r);
    const u32 sp = (si & 1) ? bcast_hi(s[si >> 1]) : bcast_lo(s[si >> 1]);
    // 1024 + 32 in each half: (1024 + q) - 1056 = q - 32, exact
    scaled((lw & M4) | ((hw << 4) & 0x30303030u), sp, 0x64206420u, p0, p1);
  }
};

// Q8_0, 34 B (2-aligned): d, 32 int8. Step k (0, 1): elements 16k + 4c .. +3. q + 128 < 256 keeps
// 1024 + q + 128 exact in f16.
template <> struct TcW<T_Q8_0> {
  static constexpr int QK = 32, BB = 34, STEPS = 2;
  static constexpr bool XPAIR = false;
  u32 q[2];
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dh = ld16(b);
    if ((reinterpret_cast<size_t>(b) & 3) == 2) {  // the int8s 4-aligned
      q[0] = ld32<true>(b + 2 + 4 * c);
      q[1] = ld32<true>(b + 18 + 4 * c);
    } else {
      q[0] = ld32<false>(b + 2 + 4 * c);
      q[1] = ld32<false>(b + 18 + 4 * c);
    }
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    scaled(q[k] ^ 0x80808080u, (u32)dh * 0x10001u, 0x64806480u, p0, p1);  // 1024 + 128
  }
};

// The 32-element types with nibbles (Q4_0, Q4_1, Q5_0, Q5_1): element i < 16 the low nibble of
// qs[i], element i + 16 the high one (and, for the Q5s, fifth bit i or i + 16 of the u32 qh).
// Step k (0, 1): elements 16k + 4c .. +3, the same four bytes of qs for both steps (low nibbles,
// then high). (1024 + q) is exact in f16, as for Q8_0.
// Q4_0, 18 B (2-aligned): d, 16 bytes of nibbles; value d * (q - 8).
template <> struct TcW<T_Q4_0> {
  static constexpr int QK = 32, BB = 18, STEPS = 2;
  static constexpr bool XPAIR = false;
  u32 qs;
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dh = ld16(b);
    qs = (reinterpret_cast<size_t>(b) & 3) == 2 ? ld32<true>(b + 2 + 4 * c) : ld32<false>(b + 2 + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    scaled((qs >> (4 * k)) & M4, (u32)dh * 0x10001u, 0x64086408u, p0, p1);  // 1024 + 8
  }
};

// IQ4_NL, 18 B (2-aligned): Q4_0's layout, value d * kvalues_iq4nl[q] (int8: as Q8_0 from there).
template <> struct TcW<T_IQ4_NL> : TcW<T_Q4_0> {
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int2 v = lut<KV_IQ4NL_LO, KV_IQ4NL_HI>(qs);  // .x the low nibbles' values, .y the high
    scaled((u32)(k ? v.y : v.x) ^ 0x80808080u, (u32)dh * 0x10001u, 0x64806480u, p0, p1);  // 1024 + 128
  }
};

// IQ4_XS, 136 B (8-aligned): d, scales_h (2 bits a sub-block), scales_l (a nibble each), then 16
// bytes a 32-element sub-block j, nibbles as IQ4_NL's; value d * (6-bit scale - 32) * kv[q]. Step
// k: sub-block k / 2, its low (k even) or high nibbles, elements 32(k/2) + 16(k%2) + 4c .. +3.
template <> struct TcW<T_IQ4_XS> {
  static constexpr int QK = 256, BB = 136, STEPS = 16;
  static constexpr bool XPAIR = false;
  uint2 hdr;  // .x d | scales_h << 16, .y scales_l
  u32 q[8];   // sub-block j's bytes 4c .. 4c + 3
  __device__ __forceinline__ static int xoff(int k, int c) { return 32 * (k >> 1) + 16 * (k & 1) + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    hdr = ld64_a8(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = ld32_a4(b + 8 + 16 * j + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const int j = k >> 1;
    const u32 ls = ((hdr.y >> (4 * j)) & 15u) | (((hdr.x >> (16 + 2 * j)) & 3u) << 4);
    const float sf = h2f((u16)hdr.x) * (float)((int)ls - 32);
    const int2 v = lut<KV_IQ4NL_LO, KV_IQ4NL_HI>(q[j]);
    scaled((u32)((k & 1) ? v.y : v.x) ^ 0x80808080u, pack_h2(sf, sf), 0x64806480u, p0, p1);  // 1024 + 128
  }
};

// Q4_1, 20 B (4-aligned): d, m, 16 bytes of nibbles; value d * q + m.
template <> struct TcW<T_Q4_1> {
  static constexpr int QK = 32, BB = 20, STEPS = 2;
  static constexpr bool XPAIR = false;
  u32 dm, qs;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dm = ld32_a4(b);
    qs = ld32_a4(b + 4 + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    affine((qs >> (4 * k)) & M4, bcast_lo(dm), bcast_hi(dm), p0, p1);
  }
};

// Q5_0, 22 B (2-aligned): d, qh (a u32 at byte 2), 16 bytes of nibbles; value d * (q - 16).
template <> struct TcW<T_Q5_0> {
  static constexpr int QK = 32, BB = 22, STEPS = 2;
  static constexpr bool XPAIR = false;
  u32 qs, hc;  // the lane's four bytes of nibbles; qh >> 4c (step k's fifth bits at 16k .. +3)
  u16 dh;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dh = ld16(b);
    hc = ((u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16)) >> (4 * c);
    qs = (reinterpret_cast<size_t>(b) & 3) == 2 ? ld32<true>(b + 6 + 4 * c) : ld32<false>(b + 6 + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    const u32 q = ((qs >> (4 * k)) & M4) | fifth_bits((hc >> (16 * k)) & 15u);
    scaled(q, (u32)dh * 0x10001u, 0x64106410u, p0, p1);  // 1024 + 16
  }
};

// Q5_1, 24 B (4-aligned): d, m, qh, 16 bytes of nibbles; value d * q + m.
template <> struct TcW<T_Q5_1> {
  static constexpr int QK = 32, BB = 24, STEPS = 2;
  static constexpr bool XPAIR = false;
  u32 dm, qs, hc;
  __device__ __forceinline__ static int xoff(int k, int c) { return 16 * k + 4 * c; }
  __device__ __forceinline__ void prep() {}
  __device__ __forceinline__ void fetch(const u8* b, int c) {
    dm = ld32_a4(b);
    hc = ld32_a4(b + 4) >> (4 * c);
    qs = ld32_a4(b + 8 + 4 * c);
  }
  __device__ __forceinline__ void frag(int k, u32& p0, u32& p1) const {
    affine(((qs >> (4 * k)) & M4) | fifth_bits((hc >> (16 * k)) & 15u), bcast_lo(dm), bcast_hi(dm), p0, p1);
  }
};

// B registers of a lane from 4 consecutive f16 of x at p (8-aligned, the staged copy): (e0, e1)
// and (e2, e3).
__device__ __forceinline__ void x_frag(const u16* p, u32& b0, u32& b1) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  b0 = v.x;
  b1 = v.y;
}
