// The MMQ kernel's weight decoders (mmq.cu's mmq_unpack): per type, Dec<TYPE> turns a 64-element
// "piece" of a GGUF row into int8 values and per-chunk scales (and min coefficients), ready for
// the integer tensor-core tiles. Loads stay within blocks.cuh's alignment table.
// tests/cuda/test_mmq.py holds every type to the f64 reference.
#pragma once
#include "blocks.cuh"


// Bytes v (unsigned, v < 128 + OFF) minus OFF as int8x4, without carries between bytes.
template <int OFF> __device__ __forceinline__ u32 sbias(u32 v) {
  return (v + (u32)(128 - OFF) * 0x01010101u) ^ 0x80808080u;
}
__device__ __forceinline__ void st16(u8* p, u32 a, u32 b, u32 c, u32 d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}

// ---------------------------------------------------------------------------------------
// Piece decoders. A piece is 64 consecutive elements of a row (2 chunks of 32). fetch(row, P,
// nb) issues the global loads of global piece P (elements 64P..64P+63) of the row and nothing
// else; store(wrow, ws, cs, P) decodes them into 64 int8 at wrow (chunk q at wrow + 32q) and
// NS floats of scales per chunk at ws + q*cs. KIND: 0 = one scale per 32, 1 = scale + min
// coefficient per 32, 2 = two scales per 32 (per 16), 3 = two scales + two mins per 32.
template <int TYPE> struct Dec;

template <> struct Dec<T_Q4_0> {  // 18 B, 2-aligned; q - 8 as signed bytes
  static constexpr int NS = 1, KIND = 0, QK = 32;
  u32 w[2][4];
  u16 dh[2];
  bool ok[2];
  __device__ void fetch(const u8* row, int P, int nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int kb = 2 * P + q;
      ok[q] = kb < nb;
      const u8* b = row + (i64)min(kb, nb - 1) * 18;
      dh[q] = ld16(b);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[q][i] = ld32_a2(b + 2 + 4 * i);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      u32 lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { lo[i] = sbias<8>(w[q][i] & M4); hi[i] = sbias<8>((w[q][i] >> 4) & M4); }
      st16(wrow + 32 * q, lo[0], lo[1], lo[2], lo[3]);
      st16(wrow + 32 * q + 16, hi[0], hi[1], hi[2], hi[3]);
      ws[q * cs] = ok[q] ? h2f(dh[q]) : 0.0f;
    }
  }
};

template <> struct Dec<T_Q4_1> {  // 20 B, 4-aligned; y = d*q + m
  static constexpr int NS = 2, KIND = 1, QK = 32;
  u32 w[2][4], dm[2];
  bool ok[2];
  __device__ void fetch(const u8* row, int P, int nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int kb = 2 * P + q;
      ok[q] = kb < nb;
      const u8* b = row + (i64)min(kb, nb - 1) * 20;
      dm[q] = ld32_a4(b);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[q][i] = ld32_a4(b + 4 + 4 * i);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      st16(wrow + 32 * q, w[q][0] & M4, w[q][1] & M4, w[q][2] & M4, w[q][3] & M4);
      st16(wrow + 32 * q + 16, (w[q][0] >> 4) & M4, (w[q][1] >> 4) & M4, (w[q][2] >> 4) & M4, (w[q][3] >> 4) & M4);
      ws[q * cs] = ok[q] ? h2f((u16)dm[q]) : 0.0f;
      ws[q * cs + 1] = ok[q] ? h2f((u16)(dm[q] >> 16)) : 0.0f;
    }
  }
};

template <> struct Dec<T_Q5_0> {  // 22 B, 2-aligned (qh as two u16); q - 16 signed
  static constexpr int NS = 1, KIND = 0, QK = 32;
  u32 w[2][4], qh[2];
  u16 dh[2];
  bool ok[2];
  __device__ void fetch(const u8* row, int P, int nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int kb = 2 * P + q;
      ok[q] = kb < nb;
      const u8* b = row + (i64)min(kb, nb - 1) * 22;
      dh[q] = ld16(b);
      qh[q] = ld32_a2(b + 2);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[q][i] = ld32_a2(b + 6 + 4 * i);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      u32 lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] = sbias<16>((w[q][i] & M4) | spread4((qh[q] >> (4 * i)) & 0xF));
        hi[i] = sbias<16>(((w[q][i] >> 4) & M4) | spread4((qh[q] >> (16 + 4 * i)) & 0xF));
      }
      st16(wrow + 32 * q, lo[0], lo[1], lo[2], lo[3]);
      st16(wrow + 32 * q + 16, hi[0], hi[1], hi[2], hi[3]);
      ws[q * cs] = ok[q] ? h2f(dh[q]) : 0.0f;
    }
  }
};

template <> struct Dec<T_Q5_1> {  // 24 B, 8-aligned; y = d*q + m
  static constexpr int NS = 2, KIND = 1, QK = 32;
  uint2 h[2], v0[2], v1[2];
  bool ok[2];
  __device__ void fetch(const u8* row, int P, int nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int kb = 2 * P + q;
      ok[q] = kb < nb;
      const u8* b = row + (i64)min(kb, nb - 1) * 24;
      h[q] = ld64_a8(b);
      v0[q] = ld64_a8(b + 8);
      v1[q] = ld64_a8(b + 16);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const u32 w[4] = {v0[q].x, v0[q].y, v1[q].x, v1[q].y}, qh = h[q].y;
      u32 lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] = (w[i] & M4) | spread4((qh >> (4 * i)) & 0xF);
        hi[i] = ((w[i] >> 4) & M4) | spread4((qh >> (16 + 4 * i)) & 0xF);
      }
      st16(wrow + 32 * q, lo[0], lo[1], lo[2], lo[3]);
      st16(wrow + 32 * q + 16, hi[0], hi[1], hi[2], hi[3]);
      ws[q * cs] = ok[q] ? h2f((u16)h[q].x) : 0.0f;
      ws[q * cs + 1] = ok[q] ? h2f((u16)(h[q].x >> 16)) : 0.0f;
    }
  }
};

template <> struct Dec<T_Q8_0> {  // 34 B, 2-aligned; int8 as is
  static constexpr int NS = 1, KIND = 0, QK = 32;
  u32 w[2][8];
  u16 dh[2];
  bool ok[2];
  __device__ void fetch(const u8* row, int P, int nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int kb = 2 * P + q;
      ok[q] = kb < nb;
      const u8* b = row + (i64)min(kb, nb - 1) * 34;
      dh[q] = ld16(b);
#pragma unroll
      for (int i = 0; i < 8; ++i) w[q][i] = ld32_a2(b + 2 + 4 * i);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      st16(wrow + 32 * q, w[q][0], w[q][1], w[q][2], w[q][3]);
      st16(wrow + 32 * q + 16, w[q][4], w[q][5], w[q][6], w[q][7]);
      ws[q * cs] = ok[q] ? h2f(dh[q]) : 0.0f;
    }
  }
};

// K-quants: piece p = P % 4 of super-block P / 4 = chunks 2p, 2p+1 of the block (the chunk
// index of the 32 elements 32c..32c+31). For Q2_K/Q3_K/Q6_K, chunk c = 4h + j (h = p/2,
// j = 2(p%2) + q) is "128h + 32j + l" in ggml's layout.

template <> struct Dec<T_Q2_K> {  // 84 B, 4-aligned; y = (d*sc)*q - dmin*m per 16
  static constexpr int NS = 4, KIND = 3, QK = 256;
  u32 qw[8], sc4, dd;
  __device__ void fetch(const u8* row, int P, int) {
    const int p = P & 3, h = p >> 1;
    const u8* b = row + (i64)(P >> 2) * 84;
    dd = ld32_a4(b + 80);
    sc4 = ld32_a4(b + 4 * p);  // scale|min bytes of sub-blocks 4p..4p+3
#pragma unroll
    for (int i = 0; i < 8; ++i) qw[i] = ld32_a4(b + 16 + 32 * h + 4 * i);
  }
  __device__ void store(u8* wrow, float* ws, int cs, int P) const {
    const int p = P & 3;
    const float d = h2f((u16)dd), dmin = h2f((u16)(dd >> 16));
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int j = 2 * (p & 1) + q;
      u32 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = (qw[i] >> (2 * j)) & 0x03030303u;
      st16(wrow + 32 * q, v[0], v[1], v[2], v[3]);
      st16(wrow + 32 * q + 16, v[4], v[5], v[6], v[7]);
      const u32 sa = (sc4 >> (16 * q)) & 0xFF, sb = (sc4 >> (16 * q + 8)) & 0xFF;
      float* o = ws + q * cs;
      o[0] = d * (float)(sa & 0xF);
      o[1] = d * (float)(sb & 0xF);
      o[2] = -dmin * (float)(sa >> 4);
      o[3] = -dmin * (float)(sb >> 4);
    }
  }
};

template <> struct Dec<T_Q3_K> {  // 110 B, 2-aligned; y = (d*(sc-32))*((q | hbit<<2) - 4) per 16
  static constexpr int NS = 2, KIND = 2, QK = 256;
  u32 qw[8], hm[8], lo4, hi4;
  u16 dh;
  __device__ void fetch(const u8* row, int P, int) {
    const int p = P & 3, h = p >> 1;
    const u8* b = row + (i64)(P >> 2) * 110;
    dh = ld16(b + 108);
    lo4 = ld32_a2(b + 96 + 4 * (p & 1));  // low nibbles of scales 4p..4p+3 (nibble p/2)
    hi4 = ld32_a2(b + 104);               // their top 2 bits: bits 2p of bytes 8..11
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      qw[i] = ld32_a2(b + 32 + 32 * h + 4 * i);
      hm[i] = ld32_a2(b + 4 * i);
    }
  }
  __device__ void store(u8* wrow, float* ws, int cs, int P) const {
    const int p = P & 3;
    const float d = h2f(dh);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int j = 2 * (p & 1) + q, c = 2 * p + q;  // c: chunk in the block = hmask bit
      u32 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = sbias<4>(((qw[i] >> (2 * j)) & 0x03030303u) | (((hm[i] >> c) & 0x01010101u) << 2));
      st16(wrow + 32 * q, v[0], v[1], v[2], v[3]);
      st16(wrow + 32 * q + 16, v[4], v[5], v[6], v[7]);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int kk = 2 * q + k;  // sub-block 4p + kk
        const int sc = (int)((((lo4 >> (8 * kk)) >> (4 * (p >> 1))) & 0xF) | ((((hi4 >> (8 * kk)) >> (2 * p)) & 3) << 4)) - 32;
        ws[q * cs + k] = d * (float)sc;
      }
    }
  }
};

// Q4_K/Q5_K 6-bit scales and mins of sub-blocks 2p, 2p+1 (ggml get_scale_min_k4, 4 at a time;
// b0..b2 = bytes 4..15 of the block).
__device__ __forceinline__ void k45_scales(u32 b0, u32 b1, u32 b2, int p, u32& sc0, u32& sc1, u32& m0, u32& m1) {
  const u32 scw = p < 2 ? (b0 & 0x3F3F3F3Fu) : ((b2 & M4) | ((b0 >> 2) & 0x30303030u));
  const u32 mw = p < 2 ? (b1 & 0x3F3F3F3Fu) : (((b2 >> 4) & M4) | ((b1 >> 2) & 0x30303030u));
  const int sh = 16 * (p & 1);
  sc0 = (scw >> sh) & 0xFF; sc1 = (scw >> (sh + 8)) & 0xFF;
  m0 = (mw >> sh) & 0xFF; m1 = (mw >> (sh + 8)) & 0xFF;
}

template <> struct Dec<T_Q4_K> {  // 144 B, 16-aligned; y = (d*sc)*q - dmin*m per 32
  static constexpr int NS = 2, KIND = 1, QK = 256;
  uint4 hdr, v0, v1;
  __device__ void fetch(const u8* row, int P, int) {
    const int p = P & 3;
    const u8* b = row + (i64)(P >> 2) * 144;
    hdr = ld128_a16(b);
    v0 = ld128_a16(b + 16 + 32 * p);
    v1 = ld128_a16(b + 32 + 32 * p);
  }
  __device__ void store(u8* wrow, float* ws, int cs, int P) const {
    const int p = P & 3;
    st16(wrow, v0.x & M4, v0.y & M4, v0.z & M4, v0.w & M4);
    st16(wrow + 16, v1.x & M4, v1.y & M4, v1.z & M4, v1.w & M4);
    st16(wrow + 32, (v0.x >> 4) & M4, (v0.y >> 4) & M4, (v0.z >> 4) & M4, (v0.w >> 4) & M4);
    st16(wrow + 48, (v1.x >> 4) & M4, (v1.y >> 4) & M4, (v1.z >> 4) & M4, (v1.w >> 4) & M4);
    u32 sc0, sc1, m0, m1;
    k45_scales(hdr.y, hdr.z, hdr.w, p, sc0, sc1, m0, m1);
    const float d = h2f((u16)hdr.x), dmin = h2f((u16)(hdr.x >> 16));
    ws[0] = d * (float)sc0; ws[1] = -dmin * (float)m0;
    ws[cs] = d * (float)sc1; ws[cs + 1] = -dmin * (float)m1;
  }
};

template <> struct Dec<T_Q5_K> {  // 176 B, 16-aligned; Q4_K plus a 5th bit from qh
  static constexpr int NS = 2, KIND = 1, QK = 256;
  uint4 hdr, h0, h1, v0, v1;
  __device__ void fetch(const u8* row, int P, int) {
    const int p = P & 3;
    const u8* b = row + (i64)(P >> 2) * 176;
    hdr = ld128_a16(b);
    h0 = ld128_a16(b + 16);
    h1 = ld128_a16(b + 32);
    v0 = ld128_a16(b + 48 + 32 * p);
    v1 = ld128_a16(b + 64 + 32 * p);
  }
  __device__ void store(u8* wrow, float* ws, int cs, int P) const {
    const int p = P & 3, s0 = 2 * p, s1 = 2 * p + 1;
#define Q5K_LO(w, hb) (((w) & M4) | ((((hb) >> s0) & 0x01010101u) << 4))
#define Q5K_HI(w, hb) ((((w) >> 4) & M4) | ((((hb) >> s1) & 0x01010101u) << 4))
    st16(wrow, Q5K_LO(v0.x, h0.x), Q5K_LO(v0.y, h0.y), Q5K_LO(v0.z, h0.z), Q5K_LO(v0.w, h0.w));
    st16(wrow + 16, Q5K_LO(v1.x, h1.x), Q5K_LO(v1.y, h1.y), Q5K_LO(v1.z, h1.z), Q5K_LO(v1.w, h1.w));
    st16(wrow + 32, Q5K_HI(v0.x, h0.x), Q5K_HI(v0.y, h0.y), Q5K_HI(v0.z, h0.z), Q5K_HI(v0.w, h0.w));
    st16(wrow + 48, Q5K_HI(v1.x, h1.x), Q5K_HI(v1.y, h1.y), Q5K_HI(v1.z, h1.z), Q5K_HI(v1.w, h1.w));
#undef Q5K_LO
#undef Q5K_HI
    u32 sc0, sc1, m0, m1;
    k45_scales(hdr.y, hdr.z, hdr.w, p, sc0, sc1, m0, m1);
    const float d = h2f((u16)hdr.x), dmin = h2f((u16)(hdr.x >> 16));
    ws[0] = d * (float)sc0; ws[1] = -dmin * (float)m0;
    ws[cs] = d * (float)sc1; ws[cs + 1] = -dmin * (float)m1;
  }
};

template <> struct Dec<T_Q6_K> {  // 210 B, 2-aligned; y = (d*sc)*(q - 32) per 16
  static constexpr int NS = 2, KIND = 2, QK = 256;
  u32 ql[16], qh[8], sc4;
  u16 dh;
  __device__ void fetch(const u8* row, int P, int) {
    const int p = P & 3, h = p >> 1;
    const u8* b = row + (i64)(P >> 2) * 210;
    dh = ld16(b + 208);
    sc4 = ld32_a2(b + 192 + 4 * p);  // int8 scales of sub-blocks 4p..4p+3
#pragma unroll
    for (int i = 0; i < 16; ++i) ql[i] = ld32_a2(b + 64 * h + 4 * i);  // j even: [0:32], odd: [32:64]
#pragma unroll
    for (int i = 0; i < 8; ++i) qh[i] = ld32_a2(b + 128 + 32 * h + 4 * i);
  }
  __device__ void store(u8* wrow, float* ws, int cs, int P) const {
    const int p = P & 3, sh = 4 * (p & 1);
    const float d = h2f(dh);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int j = 2 * (p & 1) + q;
      u32 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = sbias<32>(((ql[8 * q + i] >> sh) & M4) | (((qh[i] >> (2 * j)) & 0x03030303u) << 4));
      st16(wrow + 32 * q, v[0], v[1], v[2], v[3]);
      st16(wrow + 32 * q + 16, v[4], v[5], v[6], v[7]);
      ws[q * cs] = d * (float)(int)(i8)(sc4 >> (16 * q));
      ws[q * cs + 1] = d * (float)(int)(i8)(sc4 >> (16 * q + 8));
    }
  }
};
