// attn_decode.cu's tensor-core kernel (d <= 128, the default there): its shared-memory layout
// and the kernel. attn_decode.cu's header describes the method.
#pragma once
#include "pdl.cuh"
#include "attn_decode_common.cuh"

// The tensor-core kernel's layout (bytes): two K/V stages of 64 keys (after the last tile, the
// 4 warps' O partials), each warp's P^T (GMAX heads x 16 keys, hi then lo halves) and the 4
// warps' (m, l) per head. attn_decode.py's smem_bytes_tc() mirrors BYTES.
template <int D>
struct CfgTC {
  static constexpr int TK = 64, ROW = D + 8, DT = D / 16;  // DT: 16-wide k-steps and m-tiles of d
  static constexpr int KV_BYTES = 2 * 2 * TK * ROW * 2;
  static constexpr int FIN_BYTES = 4 * GMAX * D * 4;
  static constexpr int A_BYTES = KV_BYTES > FIN_BYTES ? KV_BYTES : FIN_BYTES;
  static constexpr int PW_OFF = A_BYTES;
  static constexpr int ML_OFF = PW_OFF + 4 * 2 * GMAX * 16 * 2;
  static constexpr int BYTES = ML_OFF + 4 * GMAX * 2 * 4;
  static_assert(D % 16 == 0 && D <= 128, "tensor-core decode: d a multiple of 16 up to 128");
};

#define PSCALE 1024.0f  // p in [0, 1] enters the P V product as 2^10 p: its f16 halves stay normal

// The partials of attn_decode_split, by tensor cores (see the header); group chunks of up to
// GMAX heads, padded to the mma's 8 columns with zero queries. Grid (splits, hkv * nch, B), NT
// threads, CfgTC::BYTES of dynamic smem.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g+8 x cols 2t, 2t+1
// (a0, a1) and 2t+8, 2t+9 (a2, a3); B (k x n) rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) x col g;
// C rows g (c0, c1), g+8 (c2, c3) x cols 2t, 2t+1. Here S^T: A = K (16 keys x 16 dims, ldmatrix),
// B = Q^T (registers), C = keys x heads; O^T: A = V^T (16 dims x 16 keys, ldmatrix.trans),
// B = P (16 keys x heads, through the warp's P^T in shared memory), C = dims x heads.
template <int D>
__global__ void __launch_bounds__(NT, 3)
attn_decode_tc(const float* __restrict__ q, const __half* __restrict__ Kc, const __half* __restrict__ Vc,
               const int* __restrict__ block_tables, const int* __restrict__ ctx_lens,
               float* __restrict__ part_o, float2* __restrict__ part_ml, int hq, int hkv, int group, int nch,
               int n_slots, int max_blocks, int log2bs, int window, float qscale, int splits,
                  float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
  pdl_enter();
  typedef CfgTC<D> C;
  constexpr int TK = C::TK, ROW = C::ROW, DT = C::DT;
  extern __shared__ __align__(16) unsigned char smem[];
  check_smem(C::BYTES);
  __half* kv = reinterpret_cast<__half*>(smem);

  const int split = blockIdx.x, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
  const int g0 = chunk * GMAX, gc = min(GMAX, group - g0);
  const int h0 = kvh * group + g0;
  int k0, k1;
  split_share(ctx_lens, b, max_blocks, log2bs, window, splits, split, TK, k0, k1);
  const long long row0 = (long long)b * hq + h0;
  if (k0 >= k1) {
    empty_share(out, xq, xds, kbp, part_ml, row0, b, hq, D, h0, gc, splits, split, tid);
    return;
  }
  const int ntiles = (k1 - k0 + TK - 1) / TK;
  TileLoader<D, TK> ld{Kc, Vc, block_tables + (long long)b * max_blocks, kv, tid, k1, log2bs, n_slots, hkv, kvh};
  ld.fetch(k0);
  ld.issue(k0, 0);
  if (ntiles > 1) ld.fetch(k0 + TK);

  // Q^T fragments: lane (g, t) holds head g's elements 16kk + 2t, +1 (b0) and +8, +9 (b1),
  // times cs, a power of two that puts the head's max |q| in [2^13, 2^14); pad heads are 0.
  u32 qhi[DT][2], qlo[DT][2];
  float sc0, sc1;  // score scales of this lane's S columns, heads 2t and 2t + 1
  {
    float2 qv[DT][2];
    float amax = 0.f;
    const float* qh = q + (row0 + g) * D;
#pragma unroll
    for (int kk = 0; kk < DT; ++kk)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        qv[kk][j] = g < gc ? *reinterpret_cast<const float2*>(qh + kk * 16 + 2 * t + 8 * j) : make_float2(0.f, 0.f);
        amax = fmaxf(amax, fmaxf(fabsf(qv[kk][j].x), fabsf(qv[kk][j].y)));
      }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the 4 lanes of head g
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int ex;
    frexpf(amax, &ex);
    const float cs = amax > 0.f ? ldexpf(1.f, 14 - ex) : 1.f;
#pragma unroll
    for (int kk = 0; kk < DT; ++kk)
#pragma unroll
      for (int j = 0; j < 2; ++j) split_h2(qv[kk][j].x * cs, qv[kk][j].y * cs, qhi[kk][j], qlo[kk][j]);
    sc0 = qscale / __shfl_sync(0xffffffffu, cs, 8 * t);      // lane 4 * (2t) holds head 2t's cs
    sc1 = qscale / __shfl_sync(0xffffffffu, cs, 8 * t + 4);  // and lane 4 * (2t + 1) head 2t + 1's
  }

  float o[DT][4];  // O^T fragments: dims 16dt + g (o0, o1), + 8 (o2, o3) x heads 2t, 2t + 1
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2t, 2t + 1; l: this lane's keys
  __half* pw = reinterpret_cast<__half*>(smem + C::PW_OFF) + warp * 2 * GMAX * 16;  // P^T hi, then lo
  const int kw = warp * 16;  // this warp's keys of every tile

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
    if (kw >= nvalid) continue;  // warp-uniform: none of this warp's keys in this tile

    // S^T = K Q^T (f32 accumulation of the hi and lo products).
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < DT; ++kk) {
      u32 a0, a1, a2, a3;
      ldsm_x4(a0, a1, a2, a3, Ks + (kw + (lane & 15)) * ROW + kk * 16 + (lane >> 4) * 8);
      mma16816(s, a0, a1, a2, a3, qhi[kk][0], qhi[kk][1]);
      mma16816(s, a0, a1, a2, a3, qlo[kk][0], qlo[kk][1]);
    }
    // s0, s1: key kw + g, heads 2t, 2t + 1; s2, s3: key kw + g + 8.
    const bool v0 = kw + g < nvalid, v1 = kw + g + 8 < nvalid;
    const float x0 = v0 ? s[0] * sc0 : -INFINITY, x1 = v0 ? s[1] * sc1 : -INFINITY;
    const float x2 = v1 ? s[2] * sc0 : -INFINITY, x3 = v1 ? s[3] * sc1 : -INFINITY;
    float t0 = fmaxf(x0, x2), t1 = fmaxf(x1, x3);
#pragma unroll
    for (int off = 4; off < WARP; off <<= 1) {  // over g: the 8 lanes of this t
      t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, off));
      t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, off));
    }
    const float mn0 = fmaxf(m0, t0), mn1 = fmaxf(m1, t1);  // finite: key kw is visible
    const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // m = -inf (first tile): 0
    const float p0 = exp2f(x0 - mn0), p1 = exp2f(x1 - mn1), p2 = exp2f(x2 - mn0), p3 = exp2f(x3 - mn1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= c0; o[dt][1] *= c1; o[dt][2] *= c0; o[dt][3] *= c1;
    }

    // P^T (heads x 16 keys) as f16 hi and lo planes, then read back as the B fragments of P.
    {
      const float pv[4] = {p0 * PSCALE, p1 * PSCALE, p2 * PSCALE, p3 * PSCALE};
      const int at[4] = {(2 * t) * 16 + g, (2 * t + 1) * 16 + g, (2 * t) * 16 + g + 8, (2 * t + 1) * 16 + g + 8};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half hi = __float2half_rn(pv[i]);
        pw[at[i]] = hi;
        pw[GMAX * 16 + at[i]] = __float2half_rn(pv[i] - __half2float(hi));
      }
    }
    __syncwarp();
    const u32 bh0 = *reinterpret_cast<const u32*>(pw + g * 16 + 2 * t);
    const u32 bh1 = *reinterpret_cast<const u32*>(pw + g * 16 + 2 * t + 8);
    const u32 bl0 = *reinterpret_cast<const u32*>(pw + GMAX * 16 + g * 16 + 2 * t);
    const u32 bl1 = *reinterpret_cast<const u32*>(pw + GMAX * 16 + g * 16 + 2 * t + 8);
    __syncwarp();  // pw is rewritten by the next tile

    // O^T += V^T P.
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      u32 a0, a1, a2, a3;
      ldsm_x4_trans(a0, a1, a2, a3, Vs + (kw + (lane & 7) + ((lane >> 4) << 3)) * ROW + dt * 16 + ((lane >> 3) & 1) * 8);
      mma16816(o[dt], a0, a1, a2, a3, bh0, bh1);
      mma16816(o[dt], a0, a1, a2, a3, bl0, bl1);
    }
  }

  // The 4 warps' (m, l, O) meet in shared memory (over the tile stages: all reads are done).
#pragma unroll
  for (int off = 4; off < WARP; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();
  float* fin = reinterpret_cast<float*>(smem);               // (4 warps, GMAX heads, D)
  float* ml = reinterpret_cast<float*>(smem + C::ML_OFF);    // (4 warps, GMAX heads, 2)
  float* fw = fin + warp * GMAX * D;
  const float inv = 1.0f / PSCALE;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    fw[(2 * t) * D + 16 * dt + g] = o[dt][0] * inv;
    fw[(2 * t + 1) * D + 16 * dt + g] = o[dt][1] * inv;
    fw[(2 * t) * D + 16 * dt + g + 8] = o[dt][2] * inv;
    fw[(2 * t + 1) * D + 16 * dt + g + 8] = o[dt][3] * inv;
  }
  if (g == 0) {
    float* mw = ml + warp * GMAX * 2;
    mw[(2 * t) * 2] = m0;
    mw[(2 * t) * 2 + 1] = l0;
    mw[(2 * t + 1) * 2] = m1;
    mw[(2 * t + 1) * 2 + 1] = l1;
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += NT) {
    const int hh = i / D, e = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, ml[(w * GMAX + hh) * 2]);
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float mw = ml[(w * GMAX + hh) * 2];
      const float wt = mw == -INFINITY ? 0.f : exp2f(mw - M);  // idle warps weigh 0
      acc += wt == 0.f ? 0.f : wt * fin[(w * GMAX + hh) * D + e];
      L += wt * ml[(w * GMAX + hh) * 2 + 1];
    }
    if (out) write_out(out, xq, xds, kbp, b, hq, D, h0 + hh, e, acc / L);
    else part_o[((row0 + hh) * splits + split) * D + e] = acc;
  }
  if (tid < gc && !out) {
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, ml[(w * GMAX + tid) * 2]);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float mw = ml[(w * GMAX + tid) * 2];
      L += mw == -INFINITY ? 0.f : exp2f(mw - M) * ml[(w * GMAX + tid) * 2 + 1];
    }
    part_ml[(row0 + tid) * splits + split] = make_float2(M, L);
  }
}
