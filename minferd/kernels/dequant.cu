// Dequantize GGUF rows to f16 (the W16 cache, warmed once at load) or f32/f16 gathered
// rows (the embedding lookup). Values come from blocks.cuh's decoders, so each element is
// gguf's f32 value exactly, then rounded once to f16 (round to nearest even).
// CPU reference: dequant_ref.py (bit-equal to gguf.quants.dequantize).
#include "pdl.cuh"
#include "blocks.cuh"

// One thread per 8 consecutive elements of an output row: the 8 outputs are one 16-byte
// f16 store (32 bytes for f32), and neighbouring threads write neighbouring chunks, so the
// writes (the larger side: 2 B/element against 0.56 for Q4_K) are fully coalesced. A
// block's scale fields are read by every thread of that block; they hit in L1.
//
// OUT_F16: 1 -> u16 (f16 bits), 0 -> f32. ids: row indices into w (nullptr: rows row0..).
// VEC: output rows are 16-aligned and K % 8 == 0 -> vector stores.
template <int TYPE, int OUT_F16, int VEC>
__global__ void dequant(const u8* __restrict__ w, i64 row_bytes, int nrows_w, int K,
                        const int* __restrict__ ids, int row0, int nrows_out, void* __restrict__ out) {
  pdl_enter();
  const int chunks = (K + 7) >> 3;
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (i64)nrows_out * chunks) return;
  const int r = (int)(t / chunks), e0 = (int)(t % chunks) * 8;
  const int src = ids ? __ldg(ids + r) : row0 + r;
  const int n = min(8, K - e0);
  float v[8];
  if (src < 0 || src >= nrows_w) {
    // An id outside the table is a bug upstream; NaN makes it loud instead of a silent zero.
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __int_as_float(0x7fc00000);
  } else {
    const u8* row = w + (i64)src * row_bytes;
    if constexpr (Blk<TYPE>::QK == 1) {
      Blk<TYPE>::dec(row, e0, n, v);
    } else {
      constexpr int QK = Blk<TYPE>::QK;
      Blk<TYPE>::dec8(row + (i64)(e0 / QK) * Blk<TYPE>::BB, e0 % QK, v);
    }
  }
  const i64 o = (i64)r * K + e0;
  if constexpr (OUT_F16) {
    u16* dst = reinterpret_cast<u16*>(out) + o;
    if (VEC) {
      uint4 pk;
      pk.x = (u32)f2h_rn(v[0]) | ((u32)f2h_rn(v[1]) << 16);
      pk.y = (u32)f2h_rn(v[2]) | ((u32)f2h_rn(v[3]) << 16);
      pk.z = (u32)f2h_rn(v[4]) | ((u32)f2h_rn(v[5]) << 16);
      pk.w = (u32)f2h_rn(v[6]) | ((u32)f2h_rn(v[7]) << 16);
      *reinterpret_cast<uint4*>(dst) = pk;
    } else {
      for (int i = 0; i < n; ++i) dst[i] = f2h_rn(v[i]);
    }
  } else {
    float* dst = reinterpret_cast<float*>(out) + o;
    if (VEC) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int i = 0; i < n; ++i) dst[i] = v[i];
    }
  }
}
