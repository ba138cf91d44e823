// FUSED_B's decoders (gemm_f16.cu): blocks.cuh's dec8 restated for quantized bytes staged in
// SHARED memory (blocks.cuh reads through __ldg, global memory only), operation for operation,
// so the f16 values equal the dequant kernel's bit for bit (tests/cuda/test_fused_b.py checks
// every type). Two exact rewrites: int -> float through 1.5*2^23 instead of I2F, and two f16
// roundings by one cvt.rn.f16x2.
#pragma once
#include "blocks.cuh"

// (float)q for |q| < 2^22, exactly, without I2F: 0x4B400000 + q is the float 1.5*2^23 + q.
__device__ __forceinline__ float fint(int q) { return __fsub_rn(__int_as_float(0x4B400000 + q), 12582912.0f); }

// (float)(byte i of n) - off, exactly, for the byte values and offsets used here: PRMT puts
// the byte under the exponent of 1.5*2^23 (0x4B4000bb), and one exact f32 subtract removes
// 1.5*2^23 + off. Replaces a shift, a mask, an add and I2F per element in the hot decoders.
__device__ __forceinline__ float byte_f(u32 n, int i, float off) {
  return __fsub_rn(__uint_as_float(__byte_perm(n, 0x4B400000u, 0x7650 + i)), 12582912.0f + off);
}

// ---- shared-memory decoders: blocks.cuh's dec8, operation for operation ------------------
// Loads as wide as blocks.cuh's for the same field (the staged copy has global's alignment).
__device__ __forceinline__ u32 s16(const u8* p) { return *reinterpret_cast<const u16*>(p); }
__device__ __forceinline__ u32 s32a2(const u8* p) { return s16(p) | (s16(p + 2) << 16); }
__device__ __forceinline__ u32 s32a4(const u8* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ uint2 s64a8(const u8* p) { return *reinterpret_cast<const uint2*>(p); }

// get_scale_min_k4 as blocks.cuh's, computing both cases and selecting: no branch, so the
// decode stays in the main loop's basic block and interleaves with the mma.
__device__ __forceinline__ void s_scale_min_k4(const u8* blk, int j, int& sc, int& m) {
  const u32 b0 = s32a4(blk + 4), b1 = s32a4(blk + 8), b2 = s32a4(blk + 12);
  const int sh = 8 * (j & 3);
  const u32 x0 = b0 >> sh, x1 = b1 >> sh, x2 = b2 >> sh;
  const int sc_lo = (int)(x0 & 63), m_lo = (int)(x1 & 63);
  const int sc_hi = (int)((x2 & 0xF) | ((x0 >> 6 & 3) << 4)), m_hi = (int)((x2 >> 4 & 0xF) | ((x1 >> 6 & 3) << 4));
  sc = j < 4 ? sc_lo : sc_hi;
  m = j < 4 ? m_lo : m_hi;
}

template <int T> struct SDec;

// Float types: 8 consecutive elements starting at p (e0 unused).
template <> struct SDec<T_F32> {
  __device__ static void dec8(const u8* p, int, float* v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(s32a4(p + 4 * i));
  }
};
template <> struct SDec<T_F16> {
  __device__ static void dec8(const u8* p, int, float* v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = h2f((u16)s16(p + 2 * i));
  }
};
template <> struct SDec<T_BF16> {
  __device__ static void dec8(const u8* p, int, float* v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(s16(p + 2 * i) << 16);
  }
};

template <> struct SDec<T_Q4_0> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk));
    const u8* q = blk + 2 + (e0 & 15);
    const u32 w0 = s32a2(q), w1 = s32a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, fint((int)((byte_of(w0, w1, i) >> sh) & 0xF) - 8));
  }
};

template <> struct SDec<T_Q4_1> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dm = s32a4(blk);
    const float d = h2f((u16)dm), m = h2f((u16)(dm >> 16));
    const u8* q = blk + 4 + (e0 & 15);
    const u32 w0 = s32a4(q), w1 = s32a4(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(__fmul_rn(d, fint((int)((byte_of(w0, w1, i) >> sh) & 0xF))), m);
  }
};

template <> struct SDec<T_Q5_0> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk));
    const u32 qh = s32a2(blk + 2);
    const u8* q = blk + 6 + (e0 & 15);
    const u32 w0 = s32a2(q), w1 = s32a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q5 = (int)(((byte_of(w0, w1, i) >> sh) & 0xF) | (((qh >> (e0 + i)) & 1) << 4));
      v[i] = __fmul_rn(d, fint(q5 - 16));
    }
  }
};

template <> struct SDec<T_Q5_1> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dm = s32a4(blk);
    const float d = h2f((u16)dm), m = h2f((u16)(dm >> 16));
    const u32 qh = s32a4(blk + 4);
    const u8* q = blk + 8 + (e0 & 15);
    const u32 w0 = s32a4(q), w1 = s32a4(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 q5 = ((byte_of(w0, w1, i) >> sh) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
      v[i] = __fadd_rn(__fmul_rn(d, fint((int)q5)), m);
    }
  }
};

template <> struct SDec<T_Q8_0> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk));
    const u8* q = blk + 2 + e0;
    // int8 q + 128 = (q ^ 0x80) as a byte: byte_f with off = 128 gives (float)q exactly.
    const u32 w0 = s32a2(q) ^ 0x80808080u, w1 = s32a2(q + 4) ^ 0x80808080u;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(byte_f(i < 4 ? w0 : w1, i & 3, 128.f), d);
  }
};

template <> struct SDec<T_Q2_K> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = s32a4(blk + 80);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
    const u32 sc = (s32a4(blk + (s & ~3)) >> (8 * (s & 3))) & 0xFF;
    const float dl = __fmul_rn(d, fint((int)(sc & 0xF))), ml = __fmul_rn(dmin, fint((int)(sc >> 4)));
    const u8* q = blk + 16 + 32 * h + l0;
    const u32 w0 = s32a4(q), w1 = s32a4(q + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, fint((int)((byte_of(w0, w1, i) >> (2 * j)) & 3))), ml);
  }
};

template <> struct SDec<T_Q3_K> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk + 108));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31, t = e0 >> 5;
    const int lo_i = s & 7, hi_i = 8 + (s & 3);
    const u32 lo_b = (s16(blk + 96 + (lo_i & ~1)) >> (8 * (lo_i & 1))) & 0xFF;
    const u32 hi_b = (s16(blk + 96 + (hi_i & ~1)) >> (8 * (hi_i & 1))) & 0xFF;
    const int sc = (int)(((s < 8 ? lo_b : lo_b >> 4) & 0xF) | (((hi_b >> (2 * (s >> 2))) & 3) << 4)) - 32;
    const float dl = __fmul_rn(d, fint(sc));
    const u8* q = blk + 32 + 32 * h + l0;
    const u32 w0 = s32a2(q), w1 = s32a2(q + 4);
    const u32 m0 = s32a2(blk + l0), m1 = s32a2(blk + l0 + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q3 = (int)((byte_of(w0, w1, i) >> (2 * j)) & 3) - (((byte_of(m0, m1, i) >> t) & 1) ? 0 : 4);
      v[i] = __fmul_rn(dl, fint(q3));
    }
  }
};

template <> struct SDec<T_Q4_K> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = s32a4(blk);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int sb = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    s_scale_min_k4(blk, sb, sc, m);
    const float dl = __fmul_rn(d, fint(sc)), ml = __fmul_rn(dmin, fint(m));
    const uint2 w = s64a8(blk + 16 + 32 * (sb >> 1) + l0);
    const int sh = (sb & 1) ? 4 : 0;
    // the nibble of every byte at once: (byte >> sh) & 0xF for 4 bytes per word
    const u32 n0 = (w.x >> sh) & 0x0F0F0F0Fu, n1 = (w.y >> sh) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, byte_f(i < 4 ? n0 : n1, i & 3, 0.f)), ml);
  }
};

template <> struct SDec<T_Q5_K> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dd = s32a4(blk);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int sb = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    s_scale_min_k4(blk, sb, sc, m);
    const float dl = __fmul_rn(d, fint(sc)), ml = __fmul_rn(dmin, fint(m));
    const uint2 w = s64a8(blk + 48 + 32 * (sb >> 1) + l0);
    const uint2 hb = s64a8(blk + 16 + l0);
    const int sh = (sb & 1) ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 q5 = ((byte_of(w.x, w.y, i) >> sh) & 0xF) | (((byte_of(hb.x, hb.y, i) >> sb) & 1) << 4);
      v[i] = __fsub_rn(__fmul_rn(dl, fint((int)q5)), ml);
    }
  }
};

template <> struct SDec<T_Q6_K> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk + 208));
    const int s = e0 >> 4, h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
    const int sc = (int)(i8)((s16(blk + 192 + (s & ~1)) >> (8 * (s & 1))) & 0xFF);
    const float dl = __fmul_rn(d, fint(sc));
    const u8* ql = blk + 64 * h + 32 * (j & 1) + l0;
    const u8* qh = blk + 128 + 32 * h + l0;
    const u32 a0 = s32a2(ql), a1 = s32a2(ql + 4), b0 = s32a2(qh), b1 = s32a2(qh + 4);
    const int sh = (j >> 1) * 4;
    // 6-bit q of 4 elements per word: low nibble | (2 high bits << 4), each byte 0..63
    const u32 n0 = ((a0 >> sh) & 0x0F0F0F0Fu) | (((b0 >> (2 * j)) & 0x03030303u) << 4);
    const u32 n1 = ((a1 >> sh) & 0x0F0F0F0Fu) | (((b1 >> (2 * j)) & 0x03030303u) << 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(dl, byte_f(i < 4 ? n0 : n1, i & 3, 32.f));  // q6 - 32
  }
};

// The table-lookup types (blocks.cuh's IQ4_NL, IQ4_XS, MXFP4): fint of the table's int8 for
// blocks.cuh's (float) conversion, which is the same exact value. FUSED_B does not instantiate
// them yet (CUDA_TYPES); tests/unit/test_kernels_host.py checks them against gguf.
template <> struct SDec<T_IQ4_NL> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const float d = h2f((u16)s16(blk));
    const u8* q = blk + 2 + (e0 & 15);
    const u32 w0 = s32a2(q), w1 = s32a2(q + 4);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, fint(table16(KV_IQ4NL_LO, KV_IQ4NL_HI, (byte_of(w0, w1, i) >> sh) & 0xF)));
  }
};
template <> struct SDec<T_IQ4_XS> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 dh = s32a4(blk);
    const int j = e0 >> 5, l0 = e0 & 31;
    const u32 sl = (s32a4(blk + 4) >> (4 * j)) & 0xF, sh2 = ((dh >> 16) >> (2 * j)) & 3;
    const float dl = __fmul_rn(h2f((u16)dh), fint((int)(sl | (sh2 << 4)) - 32));
    const uint2 w = s64a8(blk + 8 + 16 * j + (l0 & 15));
    const int sh = l0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(dl, fint(table16(KV_IQ4NL_LO, KV_IQ4NL_HI, (byte_of(w.x, w.y, i) >> sh) & 0xF)));
  }
};
template <> struct SDec<T_MXFP4> {
  __device__ static void dec8(const u8* blk, int e0, float* v) {
    const u32 e = blk[0];
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    const u8* q = blk + 1 + (e0 & 15);
    const int sh = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, fint(table16(KV_MXFP4_LO, KV_MXFP4_HI, ((u32)q[i] >> sh) & 0xF)));
  }
};

// NG consecutive 8-element groups e0, e0 + 8, ... of one block, all inside one 32-element
// k-step (so one Q4_K sub-block): by default NG dec8 calls; the hot K-quants read the block
// header and compute the sub-block scale once per thread per step instead of once per group
// (the compiler does not merge the repeated shared loads itself). Same operations per value.
template <int T, int NG> struct SDecN {
  __device__ static void run(const u8* blk, int e0, float (*v)[8]) {
#pragma unroll
    for (int g = 0; g < NG; ++g) SDec<T>::dec8(blk, e0 + 8 * g, v[g]);
  }
};

template <int NG> struct SDecN<T_Q4_K, NG> {
  __device__ static void run(const u8* blk, int e0, float (*v)[8]) {
    const u32 dd = s32a4(blk);
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
    const int sb = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    s_scale_min_k4(blk, sb, sc, m);
    const float dl = __fmul_rn(d, fint(sc)), ml = __fmul_rn(dmin, fint(m));
    const int sh = (sb & 1) ? 4 : 0;
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const uint2 w = s64a8(blk + 16 + 32 * (sb >> 1) + l0 + 8 * g);
      const u32 n0 = (w.x >> sh) & 0x0F0F0F0Fu, n1 = (w.y >> sh) & 0x0F0F0F0Fu;
#pragma unroll
      for (int i = 0; i < 8; ++i) v[g][i] = __fsub_rn(__fmul_rn(dl, byte_f(i < 4 ? n0 : n1, i & 3, 0.f)), ml);
    }
  }
};

template <int NG> struct SDecN<T_Q6_K, NG> {
  __device__ static void run(const u8* blk, int e0, float (*v)[8]) {
    const float d = h2f((u16)s16(blk + 208));
    const int h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31, sh = (j >> 1) * 4;
    const u8* ql = blk + 64 * h + 32 * (j & 1) + l0;
    const u8* qh = blk + 128 + 32 * h + l0;
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const int s = (e0 + 8 * g) >> 4;
      const int sc = (int)(i8)((s16(blk + 192 + (s & ~1)) >> (8 * (s & 1))) & 0xFF);
      const float dl = __fmul_rn(d, fint(sc));
      const u32 a0 = s32a2(ql + 8 * g), a1 = s32a2(ql + 8 * g + 4), b0 = s32a2(qh + 8 * g), b1 = s32a2(qh + 8 * g + 4);
      const u32 n0 = ((a0 >> sh) & 0x0F0F0F0Fu) | (((b0 >> (2 * j)) & 0x03030303u) << 4);
      const u32 n1 = ((a1 >> sh) & 0x0F0F0F0Fu) | (((b1 >> (2 * j)) & 0x03030303u) << 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[g][i] = __fmul_rn(dl, byte_f(i < 4 ? n0 : n1, i & 3, 32.f));
    }
  }
};
