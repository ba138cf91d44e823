// f16 tensor-core GEMM for prefill: out (M, N) f32 = x (M, K) f16 @ W (N, K).T, f32 accumulation.
//
// One kernel template, gemm_f16<BT, BM, BN, WM, WN, MINB>; BT picks the B loader:
//   BT = -1 (W16): W is an f16 matrix (N, K) row-major (the resident copy dequant_f16 makes);
//                  its tiles are cp.async'ed into shared memory exactly like x's.
//   BT = a ggml type id (FUSED): W is the raw GGUF rows, uint8 (N, row_bytes). Whole blocks
//                  are cp.async'ed into shared memory as quantized bytes, decoded in
//                  registers, rounded to f16 (round to nearest even) and stored into an f16
//                  tile laid out exactly like the W16 loader's.
// Both loaders then feed one mma routine (ldmatrix + mma.sync m16n8k16, f16 in, f32
// accumulators) in one order: every output element accumulates k16 slices 0, 1, 2, ... into
// the same register. Since the decode (gemm_f16_decoders.cuh) yields the f16 values dequant_f16 yields, the
// FUSED output is bit-identical to the W16 output on dequant_f16's copy, for any tile
// config (the config changes which warp computes an element, never its k order).
// tests/cuda/test_fused_b.py holds the two to that, bit for bit, for every type.
//
// Why not blocks.cuh's Blk<T>::dec8 directly: those read through __ldg (ld.global.nc), which
// cannot read shared memory, and decoding straight from global memory stalls the warp on
// every load (one or two warps per scheduler here: no one else hides the latency). So the
// decoders in gemm_f16_decoders.cuh (SDec) restate blocks.cuh's arithmetic operation for operation -- the same
// operands, the same order, every product and sum rounded on its own with __fmul_rn /
// __fadd_rn / __fsub_rn -- reading the staged copy through plain shared loads of the same
// widths (the copy keeps each byte's address mod 16, so blocks.cuh's alignment table holds
// for it unchanged). Two substitutions are exact and so change no bit: small integers become
// floats through the 1.5*2^23 magic (an integer add and an f32 subtract, both exact, instead
// of I2F, a quarter-rate conversion), and two f16 roundings are one cvt.rn.f16x2.f32 (the
// same round-to-nearest-even per half as dequant.cu's f2h_rn).
//
// Main loop (BK = 32 elements of K per step, one __syncthreads per step):
//   - x tiles (BM x 32 f16) in an NS = 4 deep cp.async ring; W16 tiles the same;
//   - FUSED: raw chunks of KC elements (one 256-element super-block per row for the
//     K-quants, 8 blocks for the 32-element types, 128 elements for the float types) in a
//     2-deep ring, one chunk per CH = KC / 32 steps, and a 2-deep f16 B tile. Step t issues the
//     copies for later steps, decodes step t+1's B from the staged bytes into registers,
//     runs step t's mma (the compiler interleaves the integer/f32 decode with the tensor-core
//     work: one basic block), then stores the decoded f16 for step t+1.
// Tails: x rows >= M and k >= K are zero-filled by cp.async's src-size; W16 rows >= N too;
// FUSED rows >= N are never copied (their stale f16 only reaches output columns that are
// not written) and decoded k >= K are forced to 0. K % 8 == 0 always (16-byte x rows).
#include "pdl.cuh"
#include "gemm_f16_decoders.cuh"
#include "mma.cuh"

namespace gf {

constexpr int BK = 32;    // k elements per main-loop step: one 64-byte smem row per tile row
constexpr int NS = 4;     // depth of the x (and W16) cp.async ring
constexpr int W16 = -1;   // the B-loader id of the f16 matrix; other ids are ggml types

// Tiles of 32 f16 per row (64 bytes = four 16-byte chunks). Chunk c of row r sits at chunk
// c ^ ((r >> 1) & 3): the 8 rows an ldmatrix phase (or a cp.async / decode store phase)
// touches then fall on 8 distinct 16-byte bank groups; unswizzled, rows r and r + 2 collide.
__device__ __forceinline__ u32 swz(int r, int c) { return (u32)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }

// Staging geometry of the FUSED loader for type T (gemm_f16.py's _raw_stride mirrors RS).
template <int T> struct Geo {
  static constexpr int QK = Blk<T>::QK, BB = Blk<T>::BB;
  static constexpr int KC = QK == 1 ? 128 : 256;  // elements of one row per staged chunk
  static constexpr int CH = KC / BK;              // main-loop steps per chunk
  static constexpr int CB = KC / QK * BB;         // bytes of one row's chunk
  // Every block of a row is aligned to gcd(BB, 16) (blocks.cuh), so a chunk starts at most
  // 16 - AL bytes past a 16-byte boundary: the 16-byte window that covers it fits in RS.
  static constexpr int AL = BB % 16 == 0 ? 16 : BB % 8 == 0 ? 8 : BB % 4 == 0 ? 4 : 2;
  static constexpr int RS = (CB + 16 - AL + 15) / 16 * 16;
};

// cp.async of ROWS x 32 f16 tiles of a row-major matrix (ld elements per row) into the
// swizzled layout. Each thread always copies the same column chunk (tid % 4) of rows
// tid / 4 + i * THREADS / 4: pointers and row checks are set up once, a step only adds k0.
template <int ROWS, int THREADS>
struct TileLoader {
  static_assert(ROWS * 4 % THREADS == 0 && THREADS % 4 == 0, "tile copy must divide evenly among threads");
  static constexpr int N = ROWS * 4 / THREADS, RSTEP = THREADS / 4;
  const u16* base;  // row tid / 4 of the tile, column chunk tid % 4
  i64 rstride;      // RSTEP rows, in elements
  u32 dst0;         // smem offset (within a slot) of copy 0
  int c8;           // this thread's column offset: (tid % 4) * 8
  u32 rows_ok;      // bit i: row of copy i is < nrows

  __device__ __forceinline__ void init(const u16* g, i64 ld, int row0, int nrows, int tid) {
    const int r = tid >> 2;
    c8 = (tid & 3) * 8;
    base = g + (i64)(row0 + r) * ld + c8;
    rstride = (i64)RSTEP * ld;
    dst0 = swz(r, tid & 3);
    rows_ok = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) rows_ok |= (row0 + r + i * RSTEP < nrows ? 1u : 0u) << i;
  }
  // RSTEP is a multiple of 8, so swz(r + i * RSTEP, c) = swz(r, c) + i * RSTEP * 64.
  __device__ __forceinline__ void issue(u32 s, int k0, int K, const u16* fallback) const {
    static_assert(RSTEP % 8 == 0, "row step must keep the swizzle phase");
    const bool kok = k0 + c8 < K;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const bool ok = kok && (rows_ok >> i & 1);
      cp16(s + dst0 + i * RSTEP * 64, ok ? base + i * rstride + k0 : fallback, ok ? 16 : 0);
    }
  }
};

}  // namespace gf

// x: f16 (M, K), rows of K elements (K % 8 == 0, 16-aligned). w: BT = W16: f16 (N, K) as bytes,
// w_rb = 2K; else raw rows of w_rb bytes. out: f32 (M, N). out_vec: N even and out 8-aligned.
// Grid: (ceil(M / BM), ceil(N / BN)); blockIdx.x walks M first, so the CTAs in flight share
// few W tiles (L2 reuse of the larger operand) and all of x. Dynamic smem: see gemm_f16.py.
// Grouped (an MoE's prefill): w0 stacks experts expert_bytes apart, x's rows are sorted by
// expert and padded to whole BM tiles, and tile_expert[blockIdx.x] names each M tile's expert
// (-1: a tile past the layout's rows, which the CTA leaves unwritten); bias, where set, is f32
// (experts, N), the tile's expert's row added in the epilogue (gpt-oss's expert biases).
template <int BT, int BM, int BN, int WM, int WN, int MINB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MINB)
    gemm_f16(const u16* __restrict__ x, const u8* __restrict__ w0, i64 w_rb, float* __restrict__ out, int M, int N,
             int K, int out_vec, const int* __restrict__ tile_expert, i64 expert_bytes,
             const float* __restrict__ bias) {
  pdl_enter();
  const int expert = tile_expert ? __ldg(tile_expert + blockIdx.x) : 0;
  if (expert < 0) return;
  const u8* __restrict__ w = w0 + (i64)expert * expert_bytes;
  using namespace gf;
  constexpr int THREADS = (BM / WM) * (BN / WN) * 32;
  constexpr bool FUSED = BT != W16;
  using G = Geo<FUSED ? BT : T_F16>;  // (unused by W16)
  constexpr int MI = WM / 16, NI = WN / 8;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BM % WM == 0 && BN % WN == 0, "bad warp tiling");
  static_assert(!FUSED || G::CH >= NS, "a raw chunk must be issued >= NS steps before its first decode");
  constexpr int A_BYTES = NS * BM * 64;
  constexpr int B_BYTES = FUSED ? 2 * BN * 64 : NS * BN * 64;
  constexpr int SMEM = A_BYTES + B_BYTES + (FUSED ? 2 * BN * G::RS : 0);
  // Decode work: 8-element groups of one step's B tile per thread; one row per thread.
  constexpr int GPT = BN * 4 / THREADS;
  static_assert(!FUSED || GPT == 1 || GPT == 2 || GPT == 4, "decode groups per thread must be 1, 2 or 4");

  extern __shared__ __align__(128) u8 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int S = (K + BK - 1) / BK;

  if (tid == 0) {  // a launcher that reserved less than the layout needs corrupts memory: fail loudly
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)SMEM) __trap();
  }

  const u32 sA = saddr(smem), sB = sA + A_BYTES, sR = sB + B_BYTES;
  u8* const pB = smem + A_BYTES;
  const u8* const pR = smem + A_BYTES + B_BYTES;

  // FUSED: this thread decodes groups j0 .. j0 + GPT - 1 of row rd of every step.
  const int rd = tid * GPT / 4, j0 = tid * GPT % 4;
  const u32 o_row = FUSED ? (u32)(reinterpret_cast<u64>(w + (i64)(n0 + rd) * w_rb) & 15) : 0;

  // Copy raw chunk c of rows n0 .. n0 + BN - 1 into buffer c & 1: per row, the 16-byte-aligned
  // window that covers the chunk's bytes, at the same offset mod 16 as in global memory. The
  // window's extra bytes lie in 16-byte segments that hold tensor bytes, so they are inside the
  // allocation's mapped memory (CuPy rounds allocations up to 512 bytes); they are never decoded.
  auto load_raw = [&](int c) {
    if constexpr (FUSED) {
      constexpr int WCH = G::RS / 16;
      const int cb0 = c * G::CB;
      const int nb = (int)min((i64)G::CB, w_rb - cb0);
#pragma unroll
      for (int i = 0; i < (BN * WCH + THREADS - 1) / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int r = q / WCH, ch = q - r * WCH;
        const int n = n0 + r;
        const u64 st = reinterpret_cast<u64>(w + (i64)n * w_rb + cb0);
        const u64 a0 = st & ~(u64)15;
        const int nch = (int)((st + nb - a0 + 15) >> 4);
        if (r < BN && n < N && ch < nch)
          cp16(sR + (c & 1) * (BN * G::RS) + r * G::RS + ch * 16, reinterpret_cast<const void*>(a0 + ch * 16), 16);
      }
    }
  };

  // Decode step tt's B (rows rd, groups j0..) from the staged chunk into packed f16 registers.
  auto decode = [&](int tt, u32 (&dq)[GPT][4]) {
    if constexpr (FUSED) {
      const int c = tt / G::CH;
      const int e = (tt - c * G::CH) * BK + j0 * 8;  // element within the chunk
      const u8* rrow = pR + (c & 1) * (BN * G::RS) + rd * G::RS + ((o_row + (u32)(c * G::CB)) & 15);
      const int kg = c * G::KC + e;
      float v[GPT][8];
      if constexpr (G::QK == 1) {
#pragma unroll
        for (int i = 0; i < GPT; ++i) SDec<BT>::dec8(rrow + (e + 8 * i) * G::BB, 0, v[i]);
      } else {  // the GPT groups lie in one block (QK >= 32 = BK, steps block-aligned)
        SDecN<BT, GPT>::run(rrow + (e / G::QK) * G::BB, e % G::QK, v);
      }
#pragma unroll
      for (int i = 0; i < GPT; ++i) {
#pragma unroll
        for (int p = 0; p < 4; ++p) dq[i][p] = pack_h2(v[i][2 * p], v[i][2 * p + 1]);
        // k >= K inside a step happens only for float types (K % 32 != 0); for block types it
        // is only the decode past the last step, into a buffer no mma reads. A mask, not a
        // branch, for the same reason as s_scale_min_k4.
        if constexpr (G::QK == 1) {
          const u32 keep = kg + 8 * i < K ? 0xFFFFFFFFu : 0u;
#pragma unroll
          for (int p = 0; p < 4; ++p) dq[i][p] &= keep;
        }
      }
    }
  };
  auto store_b = [&](int tt, const u32 (&dq)[GPT][4]) {
    u8* dst = pB + (tt & 1) * (BN * 64);
#pragma unroll
    for (int i = 0; i < GPT; ++i)
      *reinterpret_cast<uint4*>(dst + swz(rd, j0 + i)) = make_uint4(dq[i][0], dq[i][1], dq[i][2], dq[i][3]);
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int p = 0; p < 4; ++p) acc[mi][ni][p] = 0.f;

  // The one mma routine both loaders feed: k16 slices in order, (mi, ni) in order.
  auto mma_step = [&](u32 a_s, u32 b_s) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      u32 af[MI][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int r = wm * WM + mi * 16 + (lane & 15);
        ldsm4(a_s + swz(r, kk * 2 + (lane >> 4)), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
      }
#pragma unroll
      for (int p = 0; p < NI / 2; ++p) {
        const int r = wn * WN + p * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldsm4(b_s + swz(r, kk * 2 + ((lane >> 3) & 1)), bf[2 * p][0], bf[2 * p][1], bf[2 * p + 1][0],
              bf[2 * p + 1][1]);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma16816(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  };

  const u16* wh = reinterpret_cast<const u16*>(w);
  TileLoader<BM, THREADS> la;
  la.init(x, K, m0, M, tid);
  TileLoader<BN, THREADS> lb;  // W16 only
  if constexpr (!FUSED) lb.init(wh, w_rb / 2, n0, N, tid);
  // Prologue: steps 0 .. NS-2 in flight, one commit group each; raw chunk 0 rides in group 0.
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (s < S) {
      la.issue(sA + s * (BM * 64), s * BK, K, x);
      if constexpr (!FUSED) lb.issue(sB + s * (BN * 64), s * BK, K, wh);
    }
    if (s == 0) load_raw(0);
    cp_commit();
  }
  if constexpr (FUSED) {
    cp_wait<NS - 2>();  // group 0: raw chunk 0
    __syncthreads();
    u32 dq[GPT][4];
    decode(0, dq);
    store_b(0, dq);
  }

  // Step t: wait for group t (x tile t; for FUSED also every raw chunk step t+1 decodes: chunk
  // c + 1 is issued at step c*CH, in group NS-1 + c*CH, and first decoded at step (c+1)*CH - 1,
  // whose wait covers groups <= (c+1)*CH - 1: enough since CH >= NS). The barrier also ends
  // step t-1, so the ring slot of t-1, the f16 buffer of t+1 and raw buffer c-1 are free.
  for (int t = 0; t < S; ++t) {
    cp_wait<NS - 2>();
    __syncthreads();
    const int tn = t + NS - 1;
    if (tn < S) {
      la.issue(sA + (tn % NS) * (BM * 64), tn * BK, K, x);
      if constexpr (!FUSED) lb.issue(sB + (tn % NS) * (BN * 64), tn * BK, K, wh);
    }
    if constexpr (FUSED) {
      if (t % G::CH == 0 && (t / G::CH + 1) * G::KC < K) load_raw(t / G::CH + 1);
    }
    cp_commit();
    const u32 a_s = sA + (t % NS) * (BM * 64);
    if constexpr (FUSED) {
      u32 dq[GPT][4];
      decode(t + 1, dq);  // at t = S-1: past the end, into a buffer no mma reads
      mma_step(a_s, sB + (t & 1) * (BN * 64));
      store_b(t + 1, dq);
    } else {
      mma_step(a_s, sB + (t % NS) * (BN * 64));
    }
  }
  cp_wait<0>();

  // Epilogue: accumulator (mi, ni) holds rows +lane/4 and +8, columns 2*(lane%4) + {0, 1}.
  const float* __restrict__ brow = bias ? bias + (i64)expert * N : nullptr;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
      const int cn = n0 + wn * WN + ni * 8 + (lane & 3) * 2;
      const float b0 = brow && cn < N ? __ldg(brow + cn) : 0.0f, b1 = brow && cn + 1 < N ? __ldg(brow + cn + 1) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + wm * WM + mi * 16 + (lane >> 2) + 8 * h;
        if (r >= M) continue;
        float* o = out + (i64)r * N + cn;
        const float v0 = brow ? acc[mi][ni][2 * h] + b0 : acc[mi][ni][2 * h];
        const float v1 = brow ? acc[mi][ni][2 * h + 1] + b1 : acc[mi][ni][2 * h + 1];
        if (out_vec) {
          if (cn < N) *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
        } else {
          if (cn < N) o[0] = v0;
          if (cn + 1 < N) o[1] = v1;
        }
      }
    }
}
