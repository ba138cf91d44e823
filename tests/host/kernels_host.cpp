// The device decoders (blocks.cuh) and mat-vec units (mmvq.cu) compiled for the HOST with g++,
// so CI, which has no GPU, checks their arithmetic bit for bit against gguf and every load's
// natural alignment (the entry points report a misaligned one: the Q5_0 seed). CUDA built-ins
// get plain C++ twins below (the _rn ones through volatile, so they are never fused); asm paths
// are fenced off by MINFERD_HOST_TEST. Built with -mfma -ffp-contract=fast where the CPU has FMA,
// so a product-then-add written without the _rn helpers fuses here as nvcc would fuse it on the
// device, and the bit-for-bit check catches it wherever the two roundings differ. Driven by tests/unit/test_kernels_host.py.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <vector>
#define MINFERD_HOST_TEST 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define __shared__ static
static inline void __syncthreads() {}
using std::min; using std::max;
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static inline int2 make_int2(int a, int b) { return {a, b}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct D3 { unsigned x, y, z; };
static D3 threadIdx, blockIdx, blockDim, gridDim;
static int misaligned = 0;  // loads the device would have refused (cudaErrorMisalignedAddress)
template <class T> static inline T __ldg(const T* p) {
  if ((uintptr_t)p % alignof(T)) misaligned++;
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
static inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
static inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
  return c;
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {  // sh < 32 here
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (sh & 31));
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  uint64_t v = ((uint64_t)y << 32) | x; unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> 4 * i) & 7))) & 0xFF) << 8 * i;
  return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
static inline int __shfl_xor_sync(unsigned, int v, int) { return v; }
typedef _Float16 __half;  // mmvq.cu's rope / KV epilogue (compiled here, not run)
static inline __half __float2half_rn(float x) { return (_Float16)x; }
static inline float h2f(unsigned short h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short f2h_rn(float x) { _Float16 f = (_Float16)x; unsigned short h; memcpy(&h, &f, 2); return h; }
#include "dequant.cu"
#include "mmvq.cu"
#include "gemm_f16_decoders.cuh"

// tcgemv.cu's f16x2 arithmetic and mma, on _Float16 (one rounding each, as the PTX ops round).
static inline float hlo(unsigned v) { return h2f((unsigned short)(v & 0xFFFF)); }
static inline float hhi(unsigned v) { return h2f((unsigned short)(v >> 16)); }
static inline unsigned h2pack(double lo, double hi) {
  return (unsigned)f2h_rn((float)(_Float16)lo) | ((unsigned)f2h_rn((float)(_Float16)hi) << 16);
}
static inline unsigned pack_h2(float lo, float hi) { return h2pack(lo, hi); }
static inline unsigned hsub2(unsigned a, unsigned b) { return h2pack((double)hlo(a) - hlo(b), (double)hhi(a) - hhi(b)); }
static inline unsigned hmul2(unsigned a, unsigned b) { return h2pack((double)hlo(a) * hlo(b), (double)hhi(a) * hhi(b)); }
static inline unsigned hfma2(unsigned a, unsigned b, unsigned c) {
  return h2pack((double)hlo(a) * hlo(b) + hlo(c), (double)hhi(a) * hhi(b) + hhi(c));
}
static inline void mma16816(float*, const unsigned*, unsigned, unsigned) {}  // the kernel's; twin below
#include "tcgemv.cu"

// One warp of tcgemv over all of K for 16-row tiles, lane by lane through TcW (the kernel's own
// fetch / frag / xoff), then mma.sync m16n8k16's product from the 32 lanes' fragments, by the PTX
// fragment layout: lane (g, c) holds A rows g, g+8 at k {2c, 2c+1} (regs 0, 1) and {2c+8, 2c+9}
// (regs 2, 3); B's k {2c, 2c+1} and {2c+8, 2c+9} of column g; D rows g, g+8 at columns 2c, 2c+1.
template <int T> static void tcgemv_rows(const u8* w, int rows, int K, const u16* x16, int M, float* out) {
  typedef TcW<T> W;
  const long long rb = (long long)K / W::QK * W::BB;
  const int nb = K / W::QK, m8 = (M + 7) / 8 * 8;
  std::vector<double> acc((size_t)rows * m8, 0.0);
  for (int r0 = 0; r0 < rows; r0 += 16)
    for (int b = 0; b < nb; ++b)
      for (int k = 0; k < W::STEPS; ++k) {
        float A[16][16], B[16][64];  // logical (row, k) and (k, token)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, c = lane & 3;
          unsigned a[4];
          for (int h = 0; h < 2; ++h) {
            W wt;
            wt.fetch(w + (long long)std::min(r0 + g + 8 * h, rows - 1) * rb + (long long)b * W::BB, c);
            wt.prep();
            wt.frag(k, a[h], a[2 + h]);
          }
          for (int h = 0; h < 2; ++h) {  // reg h: row g + 8h, k 2c, 2c+1; reg 2+h: k 2c+8, 2c+9
            A[g + 8 * h][2 * c] = hlo(a[h]); A[g + 8 * h][2 * c + 1] = hhi(a[h]);
            A[g + 8 * h][2 * c + 8] = hlo(a[2 + h]); A[g + 8 * h][2 * c + 9] = hhi(a[2 + h]);
          }
          for (int n = 0; n < m8 / 8; ++n) {  // the kernel's x_frag, rows past M clamped as there
            unsigned b0, b1;
            x_frag(x16 + (long long)std::min(8 * n + g, M - 1) * K + (long long)b * W::QK + W::xoff(k, c), b0, b1);
            B[2 * c][8 * n + g] = hlo(b0); B[2 * c + 1][8 * n + g] = hhi(b0);
            B[2 * c + 8][8 * n + g] = hlo(b1); B[2 * c + 9][8 * n + g] = hhi(b1);
          }
        }
        for (int i = 0; i < 16 && r0 + i < rows; ++i)
          for (int m = 0; m < m8; ++m) {
            double s = 0;
            for (int kk = 0; kk < 16; ++kk) s += (double)A[i][kk] * B[kk][m];
            acc[(size_t)(r0 + i) * m8 + m] += s;
          }
      }
  for (int r = 0; r < rows; ++r)
    for (int m = 0; m < M; ++m) out[(long long)m * rows + r] = (float)acc[(size_t)r * m8 + m];
}

template <int T> static void dec_rows(const u8* w, int rows, int K, float* out) {
  const long long rb = (long long)K / Blk<T>::QK * Blk<T>::BB;
  for (int r = 0; r < rows; ++r)
    for (int e0 = 0; e0 < K; e0 += 8) {
      const u8* row = w + r * rb;
      if constexpr (Blk<T>::QK == 1) Blk<T>::dec(row, e0, std::min(8, K - e0), out + (long long)r * K + e0);
      else Blk<T>::dec8(row + (e0 / Blk<T>::QK) * Blk<T>::BB, e0 % Blk<T>::QK, out + (long long)r * K + e0);
    }
}
// FUSED_B's shared-memory decoders over the same rows (host memory stands in for the staged copy).
template <int T> static void sdec_rows(const u8* w, int rows, int K, float* out) {
  const long long rb = (long long)K / Blk<T>::QK * Blk<T>::BB;
  for (int r = 0; r < rows; ++r)
    for (int e0 = 0; e0 < K; e0 += 8) {
      const u8* row = w + r * rb;
      if constexpr (Blk<T>::QK == 1) SDec<T>::dec8(row + (long long)e0 * Blk<T>::BB, 0, out + (long long)r * K + e0);
      else SDec<T>::dec8(row + (e0 / Blk<T>::QK) * Blk<T>::BB, e0 % Blk<T>::QK, out + (long long)r * K + e0);
    }
}
// Serial twin of the mmvq kernel loop (per row: every unit, walked as the kernel walks them), n columns.
template <int T> static void mmvq_rows(const u8* w, int rows, int K, const i8* xq, const float2* xds, int kbp, int n, float* out) {
  typedef typename UnitOf<T>::T Unit;
  const long long rb = (long long)K / Unit::QK * Unit::BB;
  const int nb = K / Unit::QK;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < n; ++c) {
      float acc = 0;
      for (int i = 0; i < nb * Unit::U; ++i) {  // mmvq_rows' walk: Q8_0's in x's stored order, and Q4_0's
        const bool xw = T == T_Q8_0 || T == T_Q4_0;  // as its one-warp-a-row shapes (KW = 1) walk
        const int p = i / Unit::U, b = xw ? xq_block_at(p, nb) : p;
        Unit u; u.fetch(w + r * rb + (long long)b * Unit::BB, i % Unit::U); u.decode();
        const long long xb = xw ? 32LL * p : Unit::QK == 32 ? 32LL * xq_block_pos(b, nb) : (long long)b * Unit::QK;
        acc += u.dot(u.xload(xq + (long long)c * 2 * K + xb, K, xds + (long long)c * kbp + b * (Unit::QK / 32)));
      }
      out[(long long)c * rows + r] = acc;
    }
}
// Entry points: 0 done, 1 unknown type, 2 some load was misaligned for its width.
extern "C" int dec(int t, const u8* w, int rows, int K, float* out) {
  misaligned = 0;
  switch (t) {
#define C(T) case T: dec_rows<T>(w, rows, K, out); return misaligned ? 2 : 0;
    C(0) C(1) C(30) C(2) C(3) C(6) C(7) C(8) C(10) C(11) C(12) C(13) C(14) C(20) C(23) C(39)
  }
  return 1;
}
extern "C" int sdec(int t, const u8* w, int rows, int K, float* out) {
  switch (t) {
#define S(T) case T: sdec_rows<T>(w, rows, K, out); return 0;
    S(0) S(1) S(30) S(2) S(3) S(6) S(7) S(8) S(10) S(11) S(12) S(13) S(14) S(20) S(23) S(39)
  }
  return 1;
}
// x16: f16 (M, K), as the backend hands it over; the warp twin above.
extern "C" int tc(int t, const u8* w, int rows, int K, const u16* x16, int M, float* out) {
  misaligned = 0;
  switch (t) {
    case 2: tcgemv_rows<2>(w, rows, K, x16, M, out); break;
    case 3: tcgemv_rows<3>(w, rows, K, x16, M, out); break;
    case 6: tcgemv_rows<6>(w, rows, K, x16, M, out); break;
    case 7: tcgemv_rows<7>(w, rows, K, x16, M, out); break;
    case 8: tcgemv_rows<8>(w, rows, K, x16, M, out); break;
    case 12: tcgemv_rows<12>(w, rows, K, x16, M, out); break;
    case 13: tcgemv_rows<13>(w, rows, K, x16, M, out); break;
    case 14: tcgemv_rows<14>(w, rows, K, x16, M, out); break;
    case 20: tcgemv_rows<20>(w, rows, K, x16, M, out); break;
    case 23: tcgemv_rows<23>(w, rows, K, x16, M, out); break;
    default: return 1;
  }
  return misaligned ? 2 : 0;
}
extern "C" int mv(int t, const u8* w, int rows, int K, const i8* xq, const float2* xds, int kbp, int n, float* out) {
  misaligned = 0;
  switch (t) {
#define M(T) case T: mmvq_rows<T>(w, rows, K, xq, xds, kbp, n, out); return misaligned ? 2 : 0;
    M(2) M(3) M(6) M(7) M(8) M(10) M(11) M(12) M(13) M(14) M(20) M(23) M(39) M(114)
  }
  return 1;
}
