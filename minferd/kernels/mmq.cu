// Quantized prefill GEMM (llama.cpp's MMQ idea on integer tensor cores):
//   out (M, N) f32 = x (M, K) f32 @ dequant(W)(N, K).T,  W = raw GGUF rows of a quantized type.
//
// 1. mmq_quantize_x: x -> int8 per 32 elements: a scale d = amax/127 and TWO planes,
//    x ~= d * (hi + lo/128) (hi = rint(x/d), lo = rint of the residual in 1/128 steps), plus
//    per block the sums of the quantized values (whole block, and each 16-element half) for
//    the min terms. Rows are padded to a multiple of 128 and K to a multiple of 128 with zeros,
//    so the GEMM never bounds-checks x. One plane (llama.cpp's q8_1) measured 0.5-0.75%
//    relative error on the tests' random data (numpy emulation of exactly this scheme): under
//    the 1e-2 contract but without much margin, and real activations have outliers. The second
//    plane costs one more mma per tile and one FMA per output element per 32-chunk; the kernel
//    is templated on PLANES so a one-plane variant can be measured (bench/mmq.py --planes).
//    The sums match the planes used (hi only, or hi + lo/128): then the result is exactly
//    x_quantized . dequant(W), whose error is ||x - x_q|| sized, not amplified by the mins.
//
// 2. mmq<TYPE, WN, WM, TN, TM, PLANES>: a CTA computes a BN x BM tile of out^T (BN = 16*TN*WN
//    weight rows, BM = 8*TM*WM tokens) with WN x WM warps, each a (16*TN) x (8*TM) sub-tile
//    of m16n8k32 s8 mma tiles (A = weights, row-major 16 x 32; B = x, "col" = each token's K
//    run). K advances 128 elements per step (4 chunks of 32) through two shared-memory stages:
//      - x (already int8) arrives by cp.async 16-byte copies, issued a step ahead;
//      - W blocks are read from global memory into registers one step ahead (each thread one
//        64-element "piece" of one row: half a 32-block pair or a quarter super-block),
//        decoded to int8 (signed where the type has a fixed offset, as Q4_0's q-8, so no
//        offset term is needed) and per-chunk float scales, and stored to the other stage
//        after this step's chunks are done, so the loads' latency hides behind the mmas.
//        Weight loads are only as wide as blocks.cuh's alignment table allows (u16 pairs for
//        the 2-aligned types: a tensor may start on an odd block).
//    Per 32-chunk every tile's int32 dot products are turned into f32 and scaled:
//        acc += dx[tok] * (dw[row] * C + mn[row] * S[tok])
//    (dw = the weight sub-block scale, mn = its min coefficient where the type has one, S =
//    the token's quantized-x sum over the chunk). Q2_K/Q3_K/Q6_K have a scale per 16 elements:
//    they run two m16n8k16 mmas per chunk (the same A/B registers split in halves) and scale
//    each half. int32 -> f32 uses the magic-number trick folded into the mma: the accumulator
//    starts at the bits of 1.5*2^23, so the mma leaves float bits of 1.5*2^23 + C and one FADD
//    recovers C exactly (|C| < 2^22 for every type: Q8_0's 32*128*127 is the largest; the
//    I2F instruction runs at 1/8 of the FMA rate on sm_90 and would be the bottleneck).
//    Fragments come from shared memory by ldmatrix (int8 k32 tiles are b16 8x8 matrices);
//    rows are padded to 144 bytes so the 8 row addresses of each matrix hit distinct banks.
//
// Wgmma (sm_90a) is deliberately not used: the module is compiled for plain sm_90.
#include "blocks.cuh"

#define M4 0x0F0F0F0Fu
#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f  // 1.5 * 2^23

constexpr int BK = 128;          // K elements per pipeline step (4 chunks of 32)
constexpr int ROWB = BK + 16;    // bytes per smem row (padding: conflict-free ldmatrix)
constexpr int MP_ALIGN = 128;    // x rows are padded to this (the largest BM)

// Spread the 4 bits of n (0..15) to bit 4 of each byte: the 5th bit of 4 Q5 elements.
__device__ __forceinline__ u32 spread4(u32 n) { return (n * 0x02040810u) & 0x10101010u; }
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

// ---------------------------------------------------------------------------------------
// x quantizer. Thread = 8 consecutive elements, 4 threads = one 32-block. Writes, for x rows
// m < Mp (rows >= M and columns >= K are zeros):
//   xq  int8 [2][Mp][Kp]      plane 0 = hi, plane 1 = lo (x ~= d*(hi + lo/128))
//   xd  f32  [Kp/32][Mp]      d (block-major so a tile's scales are contiguous: cp.async)
//   xs  f32  [2][Kp/32][Mp]   sum of the block's quantized values: [0] hi only, [1] hi + lo/128
//   xs16 f32x2 [2][Kp/32][Mp] the same per 16-element half (Q2_K's mins)
extern "C" __global__ void __launch_bounds__(256)
mmq_quantize_x(const float* __restrict__ x, int M, int K, int Mp, int Kp, i8* __restrict__ xq,
               float* __restrict__ xd, float* __restrict__ xs, float2* __restrict__ xs16) {
  const i64 gt = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const int kq = Kp >> 3;
  if (gt >= (i64)Mp * kq) return;  // Kp % 128 == 0: whole warps leave together
  const int m = (int)(gt / kq), k = (int)(gt % kq) * 8;
  float v[8];
  if (m < M && k < K) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + (i64)m * K + k));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + (i64)m * K + k + 4));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
  u32 h0 = 0, h1 = 0, l0 = 0, l1 = 0;
  int shi = 0, slo = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float t = v[i] * id;
    const int hi = max(-127, min(127, __float2int_rn(t)));
    const int lo = max(-64, min(64, __float2int_rn((t - (float)hi) * 128.0f)));
    shi += hi;
    slo += lo;
    if (i < 4) { h0 |= (u32)(hi & 0xFF) << (8 * i); l0 |= (u32)(lo & 0xFF) << (8 * i); }
    else { h1 |= (u32)(hi & 0xFF) << (8 * (i - 4)); l1 |= (u32)(lo & 0xFF) << (8 * (i - 4)); }
  }
  const i64 o = (i64)m * Kp + k;
  *reinterpret_cast<uint2*>(xq + o) = make_uint2(h0, h1);
  *reinterpret_cast<uint2*>(xq + (i64)Mp * Kp + o) = make_uint2(l0, l1);
  // per-16 sums (lanes 4i, 4i+1: first half; 4i+2, 4i+3: second), then the whole block
  const int hhi = shi + __shfl_xor_sync(0xffffffffu, shi, 1), hlo = slo + __shfl_xor_sync(0xffffffffu, slo, 1);
  const int ohi = __shfl_xor_sync(0xffffffffu, hhi, 2), olo = __shfl_xor_sync(0xffffffffu, hlo, 2);
  if ((threadIdx.x & 3) == 0) {
    const int kb = k >> 5;
    const i64 nkb = Kp >> 5, i = (i64)kb * Mp + m, pl = nkb * Mp;
    xd[i] = d;
    const float a1 = (float)hhi, b1 = (float)ohi;
    const float a2 = a1 + (float)hlo * (1.0f / 128.0f), b2 = b1 + (float)olo * (1.0f / 128.0f);
    xs[i] = a1 + b1;
    xs[pl + i] = (float)(hhi + ohi) + (float)(hlo + olo) * (1.0f / 128.0f);
    xs16[i] = make_float2(a1, b1);
    xs16[pl + i] = make_float2(a2, b2);
  }
}

// ---------------------------------------------------------------------------------------
// Tensor-core and async-copy primitives (inline PTX, sm_80+).
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// d = a (16x32 s8, row) * b (32x8 s8, col) + MAGIC: float bits of 1.5*2^23 + the dot product.
__device__ __forceinline__ void mma_k32(int* d, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC_I));
}
__device__ __forceinline__ void mma_k16(int* d, u32 a0, u32 a1, u32 b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(MAGIC_I));
}
// The f32 value of a MAGIC-biased accumulator (one plane), or hi + lo/128 (two planes): the
// FADD constant folds both biases, and the FMA rounds once.
__device__ __forceinline__ float unbias1(int h) { return __int_as_float(h) - MAGIC_F; }
__device__ __forceinline__ float unbias2(int h, int l) {
  return fmaf(__int_as_float(l), 1.0f / 128.0f, __int_as_float(h) - (MAGIC_F + MAGIC_F / 128.0f));
}

// Shared-memory stage layout (bytes), shared with mmq.py's smem_bytes().
template <int BN, int BM, int NS, int KIND, int PLANES> struct Stage {
  static constexpr int W = 0;                                  // int8 [BN][ROWB]
  static constexpr int X = W + BN * ROWB;                      // int8 [PLANES][BM][ROWB]
  static constexpr int WS = X + PLANES * BM * ROWB;            // f32 [4][BN][NS]
  static constexpr int XD = WS + 4 * BN * NS * 4;              // f32 [4][BM]
  static constexpr int XS = XD + 4 * BM * 4;                   // f32 [4][BM] (KIND 1)
  static constexpr int XS16 = XS + (KIND == 1 ? 4 * BM * 4 : 0);  // f32x2 [4][BM] (KIND 3)
  static constexpr int BYTES = XS16 + (KIND == 3 ? 4 * BM * 8 : 0);
};

// out[m, n] = sum_k x[m, k] W[n, k] for m < M, n < N. Grid (ceil(M/BM), ceil(N/BN)).
// W: N rows of row_bytes (nb blocks). x: the quantizer's arrays for Mp rows and Kp columns;
// xs/xs16 point at the plane-PLANES sums.
template <int TYPE, int WN, int WM, int TN, int TM, int PLANES>
__global__ void __launch_bounds__(WN * WM * 32, 1)
mmq(const u8* __restrict__ W, i64 row_bytes, int N, int nb, int M, int Mp, int Kp,
    const i8* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
    const float2* __restrict__ xs16, float* __restrict__ out) {
  typedef Dec<TYPE> D;
  constexpr int NT = WN * WM * 32, BN = 16 * TN * WN, BM = 8 * TM * WM;
  constexpr int NS = D::NS, KIND = D::KIND, PP = BN * 2 / NT;  // pieces per thread per step
  typedef Stage<BN, BM, NS, KIND, PLANES> S;
  static_assert(BN * 2 % NT == 0 && PP >= 1 && 4 % PP == 0, "pieces must split evenly");
  static_assert(TM % 2 == 0, "B fragments load two n8 tiles at a time");
  static_assert(MP_ALIGN % BM == 0, "x rows are padded for whole BM tiles");
  extern __shared__ __align__(16) u8 smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp / WM, wm = warp % WM, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int nsteps = Kp / BK;
  const i64 plane = (i64)Mp * Kp;

  // this thread's pieces: row r = idx/2 of the tile, local piece lp = idx%2 (elements 64lp..)
  const u8* prow[PP];
  int pr[PP], plp[PP];
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const int idx = tid + i * NT;
    pr[i] = idx >> 1;
    plp[i] = idx & 1;
    prow[i] = W + (i64)min(n0 + pr[i], N - 1) * row_bytes;  // tail rows: any valid row, discarded
  }

  auto load_x = [&](int s, u8* st) {  // cp.async of x's step-s tile into stage st
    const int k0 = s * BK;
#pragma unroll
    for (int idx = tid; idx < PLANES * BM * (BK / 16); idx += NT) {
      const int pl = idx / (BM * (BK / 16)), rem = idx % (BM * (BK / 16)), r = rem / (BK / 16), q = rem % (BK / 16);
      cp_async16(smem_u32(st + S::X + (pl * BM + r) * ROWB + 16 * q), xq + pl * plane + (i64)(m0 + r) * Kp + k0 + 16 * q);
    }
    const int kb0 = k0 / 32;
    for (int idx = tid; idx < BM; idx += NT) {  // 4 chunks x BM/4 float4
      const int c = idx / (BM / 4), q = idx % (BM / 4);
      cp_async16(smem_u32(st + S::XD + (c * BM + 4 * q) * 4), xd + (i64)(kb0 + c) * Mp + m0 + 4 * q);
      if constexpr (KIND == 1)
        cp_async16(smem_u32(st + S::XS + (c * BM + 4 * q) * 4), xs + (i64)(kb0 + c) * Mp + m0 + 4 * q);
    }
    if constexpr (KIND == 3) {
      for (int idx = tid; idx < 2 * BM; idx += NT) {  // 4 chunks x BM/2 float4
        const int c = idx / (BM / 2), q = idx % (BM / 2);
        cp_async16(smem_u32(st + S::XS16 + (c * BM + 2 * q) * 8), xs16 + (i64)(kb0 + c) * Mp + m0 + 2 * q);
      }
    }
    cp_async_commit();
  };
  auto store_piece = [&](const D& dec, int i, int s, u8* st) {
    float* ws = reinterpret_cast<float*>(st + S::WS) + (2 * plp[i] * BN + pr[i]) * NS;
    dec.store(st + S::W + pr[i] * ROWB + 64 * plp[i], ws, BN * NS, 2 * s + plp[i]);
  };

  float acc[TN][TM][4];
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // one 32-chunk c of the stage st
  auto chunk = [&](const u8* st, int c) {
    u32 a[TN][4], b[PLANES][TM][2];
    const u32 sw = smem_u32(st + S::W), sx = smem_u32(st + S::X);
#pragma unroll
    for (int i = 0; i < TN; ++i) {
      const int r = wn * TN * 16 + 16 * i + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldsm_x4(sw + r * ROWB + 32 * c + (lane >> 4) * 16, a[i][0], a[i][1], a[i][2], a[i][3]);
    }
#pragma unroll
    for (int pl = 0; pl < PLANES; ++pl)
#pragma unroll
      for (int jj = 0; jj < TM / 2; ++jj) {
        const int r = wm * TM * 8 + 16 * jj + (lane & 7) + (lane >> 4) * 8;
        ldsm_x4(sx + (pl * BM + r) * ROWB + 32 * c + ((lane >> 3) & 1) * 16,
                b[pl][2 * jj][0], b[pl][2 * jj][1], b[pl][2 * jj + 1][0], b[pl][2 * jj + 1][1]);
      }
    const float* ws = reinterpret_cast<const float*>(st + S::WS) + c * BN * NS;
    const float* sxd = reinterpret_cast<const float*>(st + S::XD) + c * BM;
    const float* sxs = reinterpret_cast<const float*>(st + S::XS) + c * BM;
    const float4* sxs16 = reinterpret_cast<const float4*>(st + S::XS16) + c * BM / 2;
    float sc[TN][2][NS];  // row scales of rows g (h = 0) and g + 8 of each 16-row tile
#pragma unroll
    for (int i = 0; i < TN; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* rs = ws + (wn * TN * 16 + 16 * i + g + 8 * h) * NS;
        if constexpr (NS == 1) sc[i][h][0] = rs[0];
        if constexpr (NS == 2) { const float2 v = *reinterpret_cast<const float2*>(rs); sc[i][h][0] = v.x; sc[i][h][1] = v.y; }
        if constexpr (NS == 4) {
          const float4 v = *reinterpret_cast<const float4*>(rs);
          sc[i][h][0] = v.x; sc[i][h][1] = v.y; sc[i][h][2] = v.z; sc[i][h][3] = v.w;
        }
      }
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      const int col = wm * TM * 8 + 8 * j + 2 * t;  // tokens col, col + 1
      const float2 dx = *reinterpret_cast<const float2*>(sxd + col);
      float2 sx = make_float2(0.f, 0.f);
      float4 s16 = make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (KIND == 1) sx = *reinterpret_cast<const float2*>(sxs + col);
      if constexpr (KIND == 3) s16 = sxs16[col / 2];  // (a, b) of col, then of col + 1
#pragma unroll
      for (int i = 0; i < TN; ++i) {
        float f[2][4];  // [half][element] (one half for KIND 0/1)
        if constexpr (KIND <= 1) {
          int ch[4];
          mma_k32(ch, a[i], b[0][j][0], b[0][j][1]);
          if constexpr (PLANES == 2) {
            int cl[4];
            mma_k32(cl, a[i], b[1][j][0], b[1][j][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) f[0][e] = unbias2(ch[e], cl[e]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) f[0][e] = unbias1(ch[e]);
          }
        } else {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            int ch[4];
            mma_k16(ch, a[i][2 * hf], a[i][2 * hf + 1], b[0][j][hf]);
            if constexpr (PLANES == 2) {
              int cl[4];
              mma_k16(cl, a[i][2 * hf], a[i][2 * hf + 1], b[1][j][hf]);
#pragma unroll
              for (int e = 0; e < 4; ++e) f[hf][e] = unbias2(ch[e], cl[e]);
            } else {
#pragma unroll
              for (int e = 0; e < 4; ++e) f[hf][e] = unbias1(ch[e]);
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // row g (h = 0) or g + 8
          const float* r = sc[i][h];
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // token col + e
            const int ei = 2 * h + e;
            float tt;
            if constexpr (KIND == 0) tt = f[0][ei] * r[0];
            if constexpr (KIND == 1) tt = fmaf(r[1], e ? sx.y : sx.x, f[0][ei] * r[0]);
            if constexpr (KIND == 2) tt = fmaf(f[1][ei], r[1], f[0][ei] * r[0]);
            if constexpr (KIND == 3) {
              tt = fmaf(f[1][ei], r[1], f[0][ei] * r[0]);
              tt = fmaf(r[2], e ? s16.z : s16.x, tt);
              tt = fmaf(r[3], e ? s16.w : s16.y, tt);
            }
            acc[i][j][ei] = fmaf(tt, e ? dx.y : dx.x, acc[i][j][ei]);
          }
        }
      }
    }
  };

  // prologue: step 0 into stage 0
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    D dec;
    dec.fetch(prow[i], plp[i], nb);
    store_piece(dec, i, 0, smem);
  }
  load_x(0, smem);
  cp_async_wait_all();
  __syncthreads();

  for (int s = 0; s < nsteps; ++s) {
    u8* cur = smem + (s & 1) * S::BYTES;
    u8* nxt = smem + ((s + 1) & 1) * S::BYTES;
    const bool more = s + 1 < nsteps;
    if (more) load_x(s + 1, nxt);
#pragma unroll
    for (int ph = 0; ph < PP; ++ph) {
      D dec;
      if (more) dec.fetch(prow[ph], 2 * (s + 1) + plp[ph], nb);
#pragma unroll 1
      for (int c = ph * (4 / PP); c < (ph + 1) * (4 / PP); ++c) chunk(cur, c);
      if (more) store_piece(dec, ph, s + 1, nxt);
    }
    cp_async_wait_all();
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + wn * TN * 16 + 16 * i + g + 8 * (e >> 1);
        const int m = m0 + wm * TM * 8 + 8 * j + 2 * t + (e & 1);
        if (n < N && m < M) out[(i64)m * N + n] = acc[i][j][e];
      }
}
