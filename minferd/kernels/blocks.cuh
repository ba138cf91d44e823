// Block decoders for every tensor type minferd accepts: the device twin of dequant_ref.py.
//
// Each Blk<TYPE>::dec8(blk, e0, v) writes the f32 values of elements e0..e0+7 of one block
// (e0 a multiple of 8), computed EXACTLY as ggml's dequantize_row_* and gguf.quants do:
// the same operands, the same operation order (dl = d*sc and ml = dmin*m first, then
// dl*q - ml). Bit-exactness needs every product rounded on its own, so these decoders use
// __fmul_rn/__fadd_rn/__fsub_rn: the compiler may not contract them into an FMA (an FMA
// rounds once where NumPy rounds twice, and Q4_K's dl*q - ml would differ in the last bit).
// No -fmad=false is needed; code outside these helpers keeps its FMAs.
//
// Alignment: a tensor's base is at least 16-aligned (CuPy allocations are 256-aligned) and
// block g sits at base + g * BB, so every block is aligned to gcd(BB, 16) and no more:
//   1  MXFP4 (17 B)
//   2  Q4_0 (18 B) Q5_0 (22) Q8_0 (34) Q3_K (110) Q6_K (210) IQ4_NL (18) F16 BF16
//   4  Q4_1 (20) Q2_K (84) F32
//   8  Q5_1 (24) IQ4_XS (136)
//   16 Q4_K (144) Q5_K (176)
// A load is only as wide as that alignment plus the field's offset allows FOR EVERY g
// (the Q5_0 seed: a u32 load of qh at 22g + 2 is misaligned on every even g and kills the
// kernel with cudaErrorMisalignedAddress). 2-aligned fields are read as pairs of u16.
//
// NVRTC has no standard headers here, so this file uses its own fixed-width names and
// converts f16 with inline PTX (cvt.rn = round to nearest even, as numpy's astype).
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// ggml type ids (gguf.GGMLQuantizationType), also the template arguments below.
enum : int {
  T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
  T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
  T_IQ4_NL = 20, T_IQ4_XS = 23, T_MXFP4 = 39,
};

#ifndef MINFERD_HOST_TEST  // (a host build of these decoders checks them without a GPU)
__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h_rn(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#endif

// Loads through the read-only path. The suffix is the alignment the caller guarantees.
__device__ __forceinline__ u16 ld16(const u8* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
__device__ __forceinline__ u32 ld32_a2(const u8* p) {  // two aligned halves: never a misaligned u32
  return (u32)ld16(p) | ((u32)ld16(p + 2) << 16);
}
__device__ __forceinline__ u32 ld32_a4(const u8* p) { return __ldg(reinterpret_cast<const unsigned int*>(p)); }
__device__ __forceinline__ uint2 ld64_a8(const u8* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ uint4 ld128_a16(const u8* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Packed-int8 helpers the int8 kernels share (mmvq_units.cuh, mmq_decoders.cuh).
#define M4 0x0F0F0F0Fu  // the low nibble of every byte
// Spread the 4 bits of n (0..15) to bit 4 of each byte: the 5th bit of 4 Q5 elements.
// n * 0x02040810 puts bit i at 8i + 4 (and the other copies where they collide with nothing).
__device__ __forceinline__ u32 spread4(u32 n) { return (n * 0x02040810u) & 0x10101010u; }

// Nibble / byte i (0..7) of two little-endian words.
__device__ __forceinline__ u32 byte_of(u32 w0, u32 w1, int i) { return ((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xFF; }
// Entry q (0..15) of a 16-entry int8 table packed in two u64s: in registers, no memory table.
__device__ __forceinline__ int table16(u64 lo, u64 hi, u32 q) { return (int)(i8)(((q < 8 ? lo : hi) >> (8 * (q & 7))) & 0xFF); }
constexpr u64 KV_IQ4NL_LO = 0xf6eaddcfbfad9881ull, KV_IQ4NL_HI = 0x7159453526190d01ull;  // kvalues_iq4nl
constexpr u64 KV_MXFP4_LO = 0x0c08060403020100ull, KV_MXFP4_HI = 0xf4f8fafcfdfeff00ull;  // e2m1, doubled

// Q4_K/Q5_K 6-bit scale and min of sub-block j (ggml get_scale_min_k4); s = bytes 4..15.
__device__ __forceinline__ void scale_min_k4(const u8* blk, int j, int& sc, int& m) {
  // bytes 4..15 are 16-aligned + 4 -> three u32 loads (both types are 16-aligned)
  const u32 b0 = ld32_a4(blk + 4), b1 = ld32_a4(blk + 8), b2 = ld32_a4(blk + 12);
  const int sh = 8 * (j & 3);
  if (j < 4) {
    sc = (b0 >> sh) & 63;
    m = (b1 >> sh) & 63;
  } else {
    sc = ((b2 >> sh) & 0xF) | (((b0 >> sh) >> 6 & 3) << 4);
    m = ((b2 >> sh) >> 4 & 0xF) | (((b1 >> sh) >> 6 & 3) << 4);
  }
}

template <int TYPE> struct Blk;

// Plain float types: a "block" is one element; dec8 reads up to 8 (n valid) at row + e0.
template <> struct Blk<T_F32> {
  static constexpr int QK = 1, BB = 4;
  __device__ static void dec(const u8* row, int e0, int n, float* v) {
    const float* p = reinterpret_cast<const float*>(row) + e0;
    for (int i = 0; i < n; ++i) v[i] = __ldg(p + i);
  }
};
template <> struct Blk<T_F16> {
  static constexpr int QK = 1, BB = 2;
  __device__ static void dec(const u8* row, int e0, int n, float* v) {
    for (int i = 0; i < n; ++i) v[i] = h2f(ld16(row + 2 * (e0 + i)));
  }
};
template <> struct Blk<T_BF16> {
  static constexpr int QK = 1, BB = 2;
  __device__ static void dec(const u8* row, int e0, int n, float* v) {
    // bf16 is the top half of an f32: a shift, no arithmetic (as gguf's BF16 dequant).
    for (int i = 0; i < n; ++i) v[i] = __uint_as_float((u32)ld16(row + 2 * (e0 + i)) << 16);
  }
};

template <> struct Blk<T_Q4_0> {
  // [0:2] f16 d, [2:18] nibbles: element l is the low nibble of byte l, l+16 its high one.
  static constexpr int QK = 32, BB = 18;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk));
    const u8* q = blk + 2 + (e0 & 15);
    const u32 w0 = ld32_a2(q), w1 = ld32_a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, (float)((int)((byte_of(w0, w1, i) >> sh) & 0xF) - 8));
  }
};

template <> struct Blk<T_Q4_1> {
  // [0:2] f16 d, [2:4] f16 m, [4:20] nibbles as Q4_0; y = d*q + m.
  static constexpr int QK = 32, BB = 20;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dm = ld32_a4(blk);
    const float d = h2f((u16)dm), m = h2f((u16)(dm >> 16));
    const u8* q = blk + 4 + (e0 & 15);  // 20g + 4 + {0, 8}: 4-aligned
    const u32 w0 = ld32_a4(q), w1 = ld32_a4(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(__fmul_rn(d, (float)((byte_of(w0, w1, i) >> sh) & 0xF)), m);
  }
};

template <> struct Blk<T_Q5_0> {
  // [0:2] f16 d, [2:6] qh (bit j = 5th bit of element j), [6:22] nibbles; y = d*(q-16).
  static constexpr int QK = 32, BB = 22;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk));
    const u32 qh = ld32_a2(blk + 2);  // 22g + 2: misaligned for a u32 on every even g
    const u8* q = blk + 6 + (e0 & 15);
    const u32 w0 = ld32_a2(q), w1 = ld32_a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q5 = (int)(((byte_of(w0, w1, i) >> sh) & 0xF) | (((qh >> (e0 + i)) & 1) << 4));
      v[i] = __fmul_rn(d, (float)(q5 - 16));
    }
  }
};

template <> struct Blk<T_Q5_1> {
  // [0:2] f16 d, [2:4] f16 m, [4:8] qh, [8:24] nibbles; y = d*q + m.
  static constexpr int QK = 32, BB = 24;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dm = ld32_a4(blk);
    const float d = h2f((u16)dm), m = h2f((u16)(dm >> 16));
    const u32 qh = ld32_a4(blk + 4);
    const u8* q = blk + 8 + (e0 & 15);
    const u32 w0 = ld32_a4(q), w1 = ld32_a4(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 q5 = ((byte_of(w0, w1, i) >> sh) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
      v[i] = __fadd_rn(__fmul_rn(d, (float)q5), m);
    }
  }
};

template <> struct Blk<T_Q8_0> {
  // [0:2] f16 d, [2:34] int8; y = q*d.
  static constexpr int QK = 32, BB = 34;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk));
    const u8* q = blk + 2 + e0;
    const u32 w0 = ld32_a2(q), w1 = ld32_a2(q + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn((float)(i8)byte_of(w0, w1, i), d);
  }
};

template <> struct Blk<T_Q2_K> {
  // [0:16] scale|min nibbles per 16 elements, [16:80] 2-bit q (element 128h+32j+l = bits 2j
  // of byte 32h+l), [80:82] f16 d, [82:84] f16 dmin; y = (d*sc)*q - dmin*m.
  static constexpr int QK = 256, BB = 84;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = ld32_a4(blk + 80);  // 84g + 80: 4-aligned
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
    const u32 sc = (ld32_a4(blk + (s & ~3)) >> (8 * (s & 3))) & 0xFF;
    const float dl = __fmul_rn(d, (float)(sc & 0xF)), ml = __fmul_rn(dmin, (float)(sc >> 4));
    const u8* q = blk + 16 + 32 * h + l0;
    const u32 w0 = ld32_a4(q), w1 = ld32_a4(q + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, (float)((byte_of(w0, w1, i) >> (2 * j)) & 3)), ml);
  }
};

template <> struct Blk<T_Q3_K> {
  // [0:32] hmask, [32:96] 2-bit q (as Q2_K), [96:108] 16 6-bit scales (offset 32), [108:110]
  // f16 d. Element 32t + l has bit t of hmask[l] as its 3rd bit; value = (q | hbit<<2) - 4.
  // y = (d*(sc-32))*q.
  static constexpr int QK = 256, BB = 110;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk + 108));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31, t = e0 >> 5;
    // scale s: low nibble from byte s%8 (low half for s<8), top 2 bits from byte 8 + s%4
    // at bit 2*(s/4). Bytes through aligned u16 loads (the block is only 2-aligned).
    const int lo_i = s & 7, hi_i = 8 + (s & 3);
    const u32 lo_b = (ld16(blk + 96 + (lo_i & ~1)) >> (8 * (lo_i & 1))) & 0xFF;
    const u32 hi_b = (ld16(blk + 96 + (hi_i & ~1)) >> (8 * (hi_i & 1))) & 0xFF;
    const int sc = (int)(((s < 8 ? lo_b : lo_b >> 4) & 0xF) | (((hi_b >> (2 * (s >> 2))) & 3) << 4)) - 32;
    const float dl = __fmul_rn(d, (float)sc);
    const u8* q = blk + 32 + 32 * h + l0;
    const u32 w0 = ld32_a2(q), w1 = ld32_a2(q + 4);
    const u32 m0 = ld32_a2(blk + l0), m1 = ld32_a2(blk + l0 + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q3 = (int)((byte_of(w0, w1, i) >> (2 * j)) & 3) - (((byte_of(m0, m1, i) >> t) & 1) ? 0 : 4);
      v[i] = __fmul_rn(dl, (float)q3);
    }
  }
};

template <> struct Blk<T_Q4_K> {
  // [0:2] f16 d, [2:4] f16 dmin, [4:16] 6-bit scales/mins, [16:144] nibbles: 32-byte run c
  // holds sub-block 2c (low nibbles) and 2c+1 (high). y = (d*sc)*q - (dmin*m).
  static constexpr int QK = 256, BB = 144;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = ld32_a4(blk);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int sb = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    scale_min_k4(blk, sb, sc, m);
    const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
    const uint2 w = ld64_a8(blk + 16 + 32 * (sb >> 1) + l0);  // 144g + 16 + 32c + 8k: 8-aligned
    const int sh = (sb & 1) ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, (float)((byte_of(w.x, w.y, i) >> sh) & 0xF)), ml);
  }
};

template <> struct Blk<T_Q5_K> {
  // As Q4_K with [16:48] qh before the nibbles at [48:176]: 5th bit of element 32s + l is
  // bit s of qh[l].
  static constexpr int QK = 256, BB = 176;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = ld32_a4(blk);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int sb = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    scale_min_k4(blk, sb, sc, m);
    const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
    const uint2 w = ld64_a8(blk + 48 + 32 * (sb >> 1) + l0);
    const uint2 hb = ld64_a8(blk + 16 + l0);
    const int sh = (sb & 1) ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 q5 = ((byte_of(w.x, w.y, i) >> sh) & 0xF) | (((byte_of(hb.x, hb.y, i) >> sb) & 1) << 4);
      v[i] = __fsub_rn(__fmul_rn(dl, (float)q5), ml);
    }
  }
};

template <> struct Blk<T_Q6_K> {
  // [0:128] ql, [128:192] qh, [192:208] int8 scales per 16, [208:210] f16 d. Element
  // 128h + 32j + l: low 4 bits from ql[64h + 32(j%2) + l] (high nibble for j >= 2), top 2
  // bits = bits 2j of qh[32h + l]; value - 32. y = (d*sc)*q.
  static constexpr int QK = 256, BB = 210;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk + 208));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
    const int sc = (int)(i8)((ld16(blk + 192 + (s & ~1)) >> (8 * (s & 1))) & 0xFF);
    const float dl = __fmul_rn(d, (float)sc);
    const u8* ql = blk + 64 * h + 32 * (j & 1) + l0;
    const u8* qh = blk + 128 + 32 * h + l0;
    const u32 a0 = ld32_a2(ql), a1 = ld32_a2(ql + 4), b0 = ld32_a2(qh), b1 = ld32_a2(qh + 4);
    const int sh = (j >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q6 = (int)(((byte_of(a0, a1, i) >> sh) & 0xF) | (((byte_of(b0, b1, i) >> (2 * j)) & 3) << 4)) - 32;
      v[i] = __fmul_rn(dl, (float)q6);
    }
  }
};

template <> struct Blk<T_IQ4_NL> {
  // [0:2] f16 d, [2:18] nibbles as Q4_0, each an index into kvalues_iq4nl; y = d*kv[q].
  static constexpr int QK = 32, BB = 18;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f(ld16(blk));
    const u8* q = blk + 2 + (e0 & 15);
    const u32 w0 = ld32_a2(q), w1 = ld32_a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, (float)table16(KV_IQ4NL_LO, KV_IQ4NL_HI, (byte_of(w0, w1, i) >> sh) & 0xF));
  }
};

template <> struct Blk<T_IQ4_XS> {
  // [0:2] f16 d, [2:4] u16 scales_h (2 bits per 32-sub-block), [4:8] scales_l (a nibble each),
  // [8:136] 16 bytes per sub-block j, nibbles as IQ4_NL's. dl = d*(6-bit scale - 32); y = dl*kv[q].
  static constexpr int QK = 256, BB = 136;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dh = ld32_a4(blk);  // 136g: 8-aligned
    const float d = h2f((u16)dh);
    const int j = e0 >> 5, l0 = e0 & 31;
    const u32 sl = (ld32_a4(blk + 4) >> (4 * j)) & 0xF, sh2 = ((dh >> 16) >> (2 * j)) & 3;
    const float dl = __fmul_rn(d, (float)((int)(sl | (sh2 << 4)) - 32));
    const uint2 w = ld64_a8(blk + 8 + 16 * j + (l0 & 15));  // 136g + 8 + 16j + {0, 8}: 8-aligned
    const int sh = l0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(dl, (float)table16(KV_IQ4NL_LO, KV_IQ4NL_HI, (byte_of(w.x, w.y, i) >> sh) & 0xF));
  }
};

template <> struct Blk<T_MXFP4> {
  // [0] e8m0 exponent, [1:17] nibbles as Q4_0, each an e2m1 value (doubled: the scale is halved,
  // ggml_e8m0_to_fp32_half). 17-byte blocks are only byte-aligned: byte loads.
  static constexpr int QK = 32, BB = 17;
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 e = __ldg(blk);
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    const u8* q = blk + 1 + (e0 & 15);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, (float)table16(KV_MXFP4_LO, KV_MXFP4_HI, ((u32)__ldg(q + i) >> sh) & 0xF));
  }
};
