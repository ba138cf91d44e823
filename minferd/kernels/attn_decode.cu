// Batched, paged decode attention: one query row per sequence against an f16 KV cache laid
// out in fixed-size blocks (vLLM-style block tables), GQA, optional sliding window, f32 math.
//
// Why a kernel of its own: the one it replaced (ops.cu's, removed since) gave each query head a CTA,
// so a GQA group of G heads reads the same K/V G times (7x for Qwen2.5-7B), and it reduces
// every key's dot product across a warp with shuffles. Here one CTA serves a whole group: it
// streams its share of one kv head's keys through shared memory once and every query head of
// the group reads the tile from there.
//
// Work split (split-K flash decoding): CTA (split, kv head [x head chunk], sequence) takes a
// contiguous, tile-aligned share of that sequence's visible keys and writes an unnormalised
// partial (o, max, sum) per query head; attn_decode_merge combines the splits. The grid
// depends on the launcher's arguments only, never on device values (ctx_lens, block tables),
// so a captured CUDA graph replays correctly with new lengths; a split whose share is empty
// writes a neutral partial (max = -inf, sum = 0).
//
// Tiles of TK keys come in by cp.async, double-buffered: tile i+1 is in flight while tile i is
// used, and the block-table entries of tile i+2 are fetched into registers meanwhile, so no copy
// waits on a table lookup. Shared rows are padded by 8 halves (16 bytes): the 16-byte loads
// (and ldmatrix rows) of neighbouring rows hit distinct banks. Two kernels use the tiles:
//
// attn_decode_tc (d <= 128; the default there): tensor cores, 4 warps, each owning 16 keys of
// every 64-key tile with its own online softmax (no cross-warp step per tile: one barrier per
// tile). S^T (16 keys x 8 heads) = K Q^T and O^T (d x 8 heads) += V^T P by mma.m16n8k16 with
// f32 accumulation; q and p enter as f16 pairs hi + lo (x - hi rounded again), each product
// done twice, so they carry ~22 mantissa bits: the result matches f32 math to ~1e-6, not the
// ~1e-3 of plain f16 operands (K and V are f16 already: exact). q is scaled by a power of two
// per head first (its max |q| into [2^13, 2^14)) and p by 2^10, so neither half underflows
// into f16 subnormals; the scales come out exactly afterwards. Transposed products put a
// lane's S columns and O columns on the same two heads, so the softmax corrections need no
// shuffles. The 4 warps' (m, l, O) meet in shared memory once, after the last tile.
//
// attn_decode_split (SIMT f32, every head dim; the one for d > 128):
//   scores  4 warps split the head dim in quarters; lane l owns keys l, l + 32; each lane
//           computes all GM heads x its keys over its quarter (no reduction per key: q comes
//           from shared memory as broadcasts, a K chunk in registers serves every head); the
//           quarters meet in shared memory;
//   softmax warp w owns heads w, w + 4: one max reduction per head per tile, then p = exp2(s -
//           m) to shared memory and the correction exp2(m_old - m_new);
//   P V     thread (chunk c, key phase ks) owns 8 output elements of every head and walks keys
//           ks, ks + KS, ...: a V chunk loaded once serves GM heads. The accumulators are
//           rescaled only when some head's max moved (after the first tiles it rarely does).
//           The KS key phases meet in shared memory once, after the last tile.
// Scores are pre-scaled by scale * log2(e), so exp2 replaces exp; partial maxima are in that
// log2 domain, which only the merge reads.
//
// CPU reference: minferd/kernels/attn_decode.py's attn_decode_ref (tests/cuda/test_attn_decode.py).
#include "pdl.cuh"
#include "attn_decode_common.cuh"
#include "attn_decode_tc.cuh"

// Shapes and the shared-memory layout (bytes) of a SIMT split CTA serving GM query heads;
// attn_decode.py's smem_bytes() mirrors BYTES, and the kernel traps if it was launched with less.
template <int D, int GM>
struct Cfg {
  static constexpr int TK = D <= 128 ? 64 : 32;  // keys per tile (two stages of K and V must fit)
  static constexpr int KK = TK / WARP;           // keys per lane in the score loop and the softmax
  static constexpr int GP = GM <= 2 ? GM : (GM + 3) / 4 * 4;  // p row stride (16-byte loads)
  static constexpr int ROW = D + 8;              // halves per shared row
  static constexpr int NC = D / 8;               // 16-byte chunks per row
  static constexpr int KS = NT / NC;             // key phases of the P V loop
  static constexpr int PV_THREADS = NC * KS;     // < NT where NC does not divide NT (D = 96, ...)
  static constexpr int PV_KEYS = (TK + KS - 1) / KS;  // keys per thread per tile at most
  static constexpr int DQ = D / 4;               // head-dim elements per warp in the score loop
  static constexpr int JH = (GM + 3) / 4;        // heads per warp in the softmax
  static constexpr int KV_BYTES = 2 * 2 * TK * ROW * 2;  // two stages of K and V tiles
  static constexpr int FIN_BYTES = KS * GM * D * 4;      // the P V partials of every key phase
  static constexpr int A_BYTES = KV_BYTES > FIN_BYTES ? KV_BYTES : FIN_BYTES;
  static constexpr int Q_OFF = A_BYTES;                  // q (GM, D) f32, pre-scaled
  static constexpr int RED_OFF = Q_OFF + GM * D * 4;     // score quarters (4, GM, TK) f32
  static constexpr int P_OFF = RED_OFF + 4 * GM * TK * 4;  // p (TK, GP) f32
  static constexpr int C_OFF = P_OFF + TK * GP * 4;      // corrections (GP) f32
  static constexpr int BYTES = C_OFF + (GP * 4 + 15) / 16 * 16;
};

// The partials: part_o (B, hq, splits, D) f32 unnormalised, part_ml (B, hq, splits) of (max in
// the log2 domain, sum). Grid (splits, hkv * nch, B), NT threads, Cfg::BYTES of dynamic smem.
template <int D, int GM>
__global__ void __launch_bounds__(NT, 3)
attn_decode_split(const float* __restrict__ q, const __half* __restrict__ Kc, const __half* __restrict__ Vc,
                  const int* __restrict__ block_tables, const int* __restrict__ ctx_lens,
                  float* __restrict__ part_o, float2* __restrict__ part_ml, int hq, int hkv, int group, int nch,
                  int n_slots, int max_blocks, int log2bs, int window, float qscale, int splits,
                  float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
  pdl_enter();
  typedef Cfg<D, GM> C;
  constexpr int TK = C::TK, KK = C::KK, GP = C::GP, ROW = C::ROW, NC = C::NC, KS = C::KS;
  constexpr int DQ = C::DQ, JH = C::JH;
  extern __shared__ __align__(16) unsigned char smem[];
  check_smem(C::BYTES);
  __half* kv = reinterpret_cast<__half*>(smem);  // stage s: K at s * 2 * TK * ROW, V after it
  float* qs = reinterpret_cast<float*>(smem + C::Q_OFF);
  float* red = reinterpret_cast<float*>(smem + C::RED_OFF);
  float* ps = reinterpret_cast<float*>(smem + C::P_OFF);
  float* corr = reinterpret_cast<float*>(smem + C::C_OFF);

  const int split = blockIdx.x, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
  const int g0 = chunk * GMAX, gc = min(GM, group - g0);  // this CTA's heads: h0 .. h0 + gc - 1
  const int h0 = kvh * group + g0;
  int k0, k1;
  split_share(ctx_lens, b, max_blocks, log2bs, window, splits, split, TK, k0, k1);
  const long long row0 = (long long)b * hq + h0;  // (sequence, first head) row of the partials
  if (k0 >= k1) {
    empty_share(out, xq, xds, kbp, part_ml, row0, b, hq, D, h0, gc, splits, split, tid);
    return;
  }
  const int ntiles = (k1 - k0 + TK - 1) / TK;
  TileLoader<D, TK> ld{Kc, Vc, block_tables + (long long)b * max_blocks, kv, tid, k1, log2bs, n_slots, hkv, kvh};
  ld.fetch(k0);
  ld.issue(k0, 0);  // in flight while q is staged
  if (ntiles > 1) ld.fetch(k0 + TK);

  const float* qb = q + row0 * D;
  for (int i = tid; i < GM * D; i += NT) qs[i] = i / D < gc ? qb[i] * qscale : 0.f;
  for (int i = tid; i < TK * GP; i += NT) ps[i] = 0.f;  // pad heads keep p = 0 (never written)
  if (tid < GP) corr[tid] = 1.f;  // pad heads: a correction of 1 never asks for a rescale

  float acc[GM][8];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  float m[JH], l[JH];  // warp w: heads w + 4 j; l is this lane's share of the sum
#pragma unroll
  for (int j = 0; j < JH; ++j) { m[j] = -INFINITY; l[j] = 0.f; }
  const int pc = tid % NC, pks = tid / NC;  // P V: chunk and key phase

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile it landed for all; iteration it - 1 is done with the other stage
    if (it + 1 < ntiles) {
      ld.issue(k0 + (it + 1) * TK, (it + 1) & 1);
      if (it + 2 < ntiles) ld.fetch(k0 + (it + 2) * TK);
    }
    const __half* Ks = kv + (it & 1) * 2 * TK * ROW;
    const __half* Vs = Ks + TK * ROW;
    const int nvalid = min(TK, k1 - (k0 + it * TK));

    // Scores over this warp's quarter of the head dim.
    {
      float s[GM][KK];
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) s[g][kk] = 0.f;
#pragma unroll
      for (int j = 0; j < DQ / 8; ++j) {
        const int e = warp * DQ + j * 8;
        float kf[KK][8];
#pragma unroll
        for (int kk = 0; kk < KK; ++kk)
          h8_to_f32(*reinterpret_cast<const uint4*>(Ks + (lane + WARP * kk) * ROW + e), kf[kk]);
#pragma unroll
        for (int g = 0; g < GM; ++g) {
          const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + e);
          const float4 qb4 = *reinterpret_cast<const float4*>(qs + g * D + e + 4);
#pragma unroll
          for (int kk = 0; kk < KK; ++kk) {
            float v = s[g][kk];
            v = fmaf(qa.x, kf[kk][0], v); v = fmaf(qa.y, kf[kk][1], v);
            v = fmaf(qa.z, kf[kk][2], v); v = fmaf(qa.w, kf[kk][3], v);
            v = fmaf(qb4.x, kf[kk][4], v); v = fmaf(qb4.y, kf[kk][5], v);
            v = fmaf(qb4.z, kf[kk][6], v); v = fmaf(qb4.w, kf[kk][7], v);
            s[g][kk] = v;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) red[(warp * GM + g) * TK + lane + WARP * kk] = s[g][kk];
    }
    __syncthreads();

    // Online softmax, one update per head per tile.
#pragma unroll
    for (int j = 0; j < JH; ++j) {
      const int g = warp + 4 * j;
      if (g < gc) {  // warp-uniform
        float sv[KK], tmax = -INFINITY;
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          const int key = lane + WARP * kk;
          const float v = red[g * TK + key] + red[(GM + g) * TK + key] + red[(2 * GM + g) * TK + key] +
                          red[(3 * GM + g) * TK + key];
          sv[kk] = key < nvalid ? v : -INFINITY;
          tmax = fmaxf(tmax, sv[kk]);
        }
        tmax = warp_max(tmax);  // finite: a tile holds at least one visible key
        const float mn = fmaxf(m[j], tmax);
        const float c = exp2f(m[j] - mn);  // m = -inf (first tile): 0, and acc is still 0
        float psum = 0.f;
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          const float p = exp2f(sv[kk] - mn);  // masked keys: exp2(-inf) = 0
          ps[(lane + WARP * kk) * GP + g] = p;
          psum += p;
        }
        l[j] = l[j] * c + psum;
        m[j] = mn;
        if (lane == 0) corr[g] = c;
      }
    }
    __syncthreads();

    // O = O * corr + P V.
    if (tid < C::PV_THREADS) {
      float cr[GP];
      load_row<GP>(corr, cr);
      bool moved = false;
#pragma unroll
      for (int g = 0; g < GM; ++g) moved |= cr[g] != 1.f;
      if (moved) {  // CTA-uniform: every thread reads the same corrections
#pragma unroll
        for (int g = 0; g < GM; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] *= cr[g];
      }
#pragma unroll
      for (int kk = 0; kk < C::PV_KEYS; ++kk) {
        const int k = pks + kk * KS;
        if (k < nvalid) {
          float vf[8], p[GP];
          h8_to_f32(*reinterpret_cast<const uint4*>(Vs + k * ROW + pc * 8), vf);
          load_row<GP>(ps + k * GP, p);
#pragma unroll
          for (int g = 0; g < GM; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p[g], vf[i], acc[g][i]);
        }
      }
    }
  }

  // The key phases meet in shared memory (over the tile stages: all reads of them are done).
  __syncthreads();
  float* fin = reinterpret_cast<float*>(smem);  // (KS, GM, D)
  if (tid < C::PV_THREADS) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      float4* dst = reinterpret_cast<float4*>(fin + (pks * GM + g) * D + pc * 8);
      dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    }
  }
#pragma unroll
  for (int j = 0; j < JH; ++j) {
    const int g = warp + 4 * j;
    if (g < gc) {
      const float sum = warp_sum(l[j]);
      if (lane == 0) {
        if (!out) part_ml[(row0 + g) * splits + split] = make_float2(m[j], sum);
        corr[g] = sum;  // the corrections are done with: the sums, for a finished out
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += NT) {
    const int g = i / D, e = i % D;
    float o = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) o += fin[(ks * GM + g) * D + e];
    if (out) write_out(out, xq, xds, kbp, b, hq, D, h0 + g, e, o / corr[g]);
    else part_o[((row0 + g) * splits + split) * D + e] = o;
  }
}

// Pass 2: out[b, h*D + e] = sum_s o_s[e] w_s / sum_s l_s w_s with w_s = exp2(m_s - max_s m_s).
// One CTA per (sequence, head); thread (c4, sg) reads float4 column c4 of splits sg, sg + SG,
// ... (SG = blockDim / (D/4), the launcher's choice), all its loads issued before the first
// warp turns the (max, sum) pairs into weights, so the two L2 round trips overlap (at B = 1
// there are only hq CTAs and up to 128 splits to read). The SG sums meet in shared memory and
// the first D threads finish: a row with no visible key (ctx_len 0) gets zeros. With xq set,
// out is also written in the mat-vec kernels' int8 format (xquant.cuh; the whole (B, hq*D)
// output is one column per sequence): those D threads hold whole 32-element blocks, D % 32 == 0.
template <int D>
__global__ void __launch_bounds__(MERGE_THREADS)
attn_decode_merge(const float* __restrict__ part_o, const float2* __restrict__ part_ml, float* __restrict__ out,
                  int hq, int splits, const float* __restrict__ sinks, signed char* __restrict__ xq,
                  float2* __restrict__ xds, int kbp) {
  pdl_enter();
  constexpr int V4 = D / 4;
  constexpr int SGMAX = MERGE_THREADS / V4;
  constexpr int SPT = (MAX_SPLITS + SGMAX - 1) / SGMAX;  // splits per thread at most
  __shared__ float wgt[MAX_SPLITS];
  __shared__ float inv_s;
  __shared__ __align__(16) float4 sums[SGMAX * V4];
  const long long bh = blockIdx.x;
  const int b = (int)(bh / hq), h = (int)(bh % hq);
  const int tid = threadIdx.x, c4 = tid % V4, sg = tid / V4, nsg = blockDim.x / V4;
  const float4* po = reinterpret_cast<const float4*>(part_o + bh * splits * D) + c4;
  float4 v[SPT];
#pragma unroll
  for (int j = 0; j < SPT; ++j) {
    const int s = sg + j * nsg;
    v[j] = s < splits ? po[(long long)s * V4] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (tid < WARP) {
    const float2* ml = part_ml + bh * splits;
    float mj[MAX_SPLITS / WARP], lj[MAX_SPLITS / WARP], M = -INFINITY;
#pragma unroll
    for (int j = 0; j < MAX_SPLITS / WARP; ++j) {
      const int s = tid + WARP * j;
      const float2 x = s < splits ? ml[s] : make_float2(-INFINITY, 0.f);
      mj[j] = x.x;
      lj[j] = x.y;
      M = fmaxf(M, x.x);
    }
    M = warp_max(M);
    float S = 0.f;
#pragma unroll
    for (int j = 0; j < MAX_SPLITS / WARP; ++j) {
      const int s = tid + WARP * j;
      const float w = mj[j] == -INFINITY ? 0.f : exp2f(mj[j] - M);  // empty splits weigh 0
      if (s < splits) wgt[s] = w;
      S += lj[j] * w;
    }
    S = warp_sum(S);
    // gpt-oss's sink: one more logit of the head in the softmax's denominator, with no value. It
    // is unscaled; M is in the kernels' log2 domain (scale * log2 e folded into the scores).
    if (sinks) S += exp2f(__ldg(sinks + h) * 1.4426950408889634f - M);
    if (tid == 0) inv_s = S > 0.f ? 1.0f / S : 0.f;
  }
  __syncthreads();
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < SPT; ++j) {
    const int s = sg + j * nsg;
    const float w = s < splits ? wgt[s] : 0.f;
    if (w != 0.f) {  // an empty split's o was never written: skip it, never multiply by 0
      o.x = fmaf(w, v[j].x, o.x); o.y = fmaf(w, v[j].y, o.y);
      o.z = fmaf(w, v[j].z, o.z); o.w = fmaf(w, v[j].w, o.w);
    }
  }
  if (sg < nsg) sums[sg * V4 + c4] = o;
  __syncthreads();
  if (tid < D) {
    const float* sf = reinterpret_cast<const float*>(sums);
    float r = 0.f;
    for (int i = 0; i < nsg; ++i) r += sf[i * D + tid];
    r *= inv_s;
    const int K = hq * D, k = h * D + tid;
    out[(long long)b * K + k] = r;
    if (xq) quantize_block32(r, tid % WARP, xq + (long long)b * 2 * K, K, k / 32, xds + (long long)b * kbp);
  }
}
