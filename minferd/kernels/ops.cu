// Small fused ops of the forward pass, f32 activations, f16 KV cache.
// Every kernel reads token positions from device memory so that the decode step can be
// captured once as a CUDA graph and replayed with new positions.
#include "pdl.cuh"
#include <cuda_fp16.h>
#include "xquant.cuh"
#include "picks_sum.cuh"

#define WARP 32
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // NVRTC has no math.h
#endif

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// Sum over a block of up to 1024 threads; every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_sum(v);
    __syncthreads();  // part[] may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + WARP - 1) / WARP;
    v = lane < nw ? part[lane] : 0.f;
    return warp_sum(v);
}

// Row `row` of x normalised into out (and out16, where set): the block's share of it.
__device__ __forceinline__ void rmsnorm_row(const float* __restrict__ x, const float* __restrict__ w,
                                            float* __restrict__ out, long long row, int dim, float eps,
                                            __half* __restrict__ out16) {
    const float* xr = x + row * dim;
    float* orow = out + row * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(block_sum(ss) / dim + eps);
    // gridDim.y CTAs share a row (each sums all of it, from L2): a decode batch has few rows.
    for (int i = threadIdx.x + blockIdx.y * blockDim.x; i < dim; i += blockDim.x * gridDim.y) {
        float v = xr[i] * inv * w[i];
        orow[i] = v;
        if (out16) out16[row * dim + i] = __float2half_rn(v);
    }
}

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   (one block per row); with out16 set,
// also its f16 rounding (what a prefill GEMM reads: the separate cast was 13% of a pp2048).
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ out, int dim, float eps, __half* __restrict__ out16) {
    pdl_enter();
    rmsnorm_row(x, w, out, blockIdx.x, dim, eps, out16);
}

// rmsnorm_f32 of two tensors of rows of dim in one launch: blocks 0 .. rows - 1 take x's rows
// with w, the rest x2's with w2 (qwen3's q and k head norms: one graph node, not two).
extern "C" __global__ void rmsnorm_pair(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ out, int rows, const float* __restrict__ x2,
                                        const float* __restrict__ w2, float* __restrict__ out2, int dim, float eps) {
    pdl_enter();
    const int r = blockIdx.x;
    if (r < rows) rmsnorm_row(x, w, out, r, dim, eps, nullptr);
    else rmsnorm_row(x2, w2, out2, r - rows, dim, eps, nullptr);
}

// A row's values as rmsnorm_q_row reads them: x's row itself, or (Picks) an MoE token's
// residual plus its weighted picks, summed as moe_combine sums them (picks_sum.cuh).
struct Row {
    const float* __restrict__ r;
    __device__ __forceinline__ float4 at4(int i) const { return reinterpret_cast<const float4*>(r)[i]; }
    __device__ __forceinline__ float at(int i) const { return r[i]; }
};
struct Picks {
    const float* __restrict__ y; const float* __restrict__ wts; const float* __restrict__ res; int t, k, H;
    __device__ __forceinline__ float at(int h) const { return picks_sum(y, wts, res, t, k, H, h); }
    __device__ __forceinline__ float4 at4(int i) const { return make_float4(at(4 * i), at(4 * i + 1), at(4 * i + 2), at(4 * i + 3)); }
};

// A norm's weights are model weights, which no node of a graph writes: a kernel may read them
// before pdl_enter, while the node before it finishes (a decode step's norm otherwise waited for
// its weights from HBM, one round trip for each of a warp's blocks, after the node before it).
// A warp holds the weights of its first NORM_W blocks (dim up to 8192 at 256 threads and 4 CTAs
// a row); blocks past those read theirs in turn.
#define NORM_W 8
__device__ __forceinline__ void norm_w_ahead(const float* __restrict__ w, int dim, float (&wv)[NORM_W]) {
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP, stride = nw * gridDim.y;
    const int warp = threadIdx.x / WARP + blockIdx.y * nw;
#pragma unroll
    for (int r = 0; r < NORM_W; ++r) {
        const int kb = warp + r * stride;
        wv[r] = kb < dim / 32 ? __ldg(w + kb * 32 + lane) : 0.0f;
    }
}

// The block's share of one row normalised (out) and in the mat-vec format (xq, xds: the row's),
// and, where srow is set, the row's values themselves. Each CTA of the row's gridDim.y sums the
// whole row (from L2) and writes its share of 32-element blocks; wv: norm_w_ahead's weights.
// PRE: a warp's first NORM_W blocks' values are read with the sum's loads, not one after another.
template <bool PRE, class Src>
__device__ __forceinline__ void rmsnorm_q_row(const Src& src, const float* __restrict__ w, const float (&wv)[NORM_W],
                                              float* __restrict__ orow, int dim, float eps,
                                              signed char* __restrict__ xq, float2* __restrict__ xds,
                                              float* __restrict__ srow) {
    int lane = threadIdx.x % WARP, nw = blockDim.x / WARP, stride = nw * gridDim.y, nb = dim / 32;
    int warp = threadIdx.x / WARP + blockIdx.y * nw;
    float sv[NORM_W];
    if constexpr (PRE) {
#pragma unroll
        for (int r = 0; r < NORM_W; ++r) sv[r] = warp + r * stride < nb ? src.at((warp + r * stride) * 32 + lane) : 0.0f;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) {
        float4 v = src.at4(i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float inv = 1.0f / sqrtf(block_sum(ss) / dim + eps);
    auto block = [&](int kb, float wi, float s) {
        int i = kb * 32 + lane;
        if (srow) srow[i] = s;
        float v = s * inv * wi;
        orow[i] = v;
        quantize_block32(v, lane, xq + kb * 32, dim, xds + kb);
    };
#pragma unroll
    for (int r = 0; r < NORM_W; ++r)
        if (warp + r * stride < nb) block(warp + r * stride, wv[r], PRE ? sv[r] : src.at((warp + r * stride) * 32 + lane));
    for (int kb = warp + NORM_W * stride; kb < nb; kb += stride) block(kb, w[kb * 32 + lane], src.at(kb * 32 + lane));
}

// rmsnorm_f32 that also leaves its output in the mat-vec kernels' int8 format (xquant.cuh),
// so the q/k/v (or gate/up) mat-vecs that read it need no quantize_x launch. dim % 32 == 0.
// A row is spread over gridDim.y CTAs: one CTA per row was a 5 us step on one SM, 57 times a token.
extern "C" __global__ void rmsnorm_q(const float* __restrict__ x, const float* __restrict__ w,
                                     float* __restrict__ out, int dim, float eps, signed char* __restrict__ xq,
                                     float2* __restrict__ xds, int kbp) {
    float wv[NORM_W];
    norm_w_ahead(w, dim, wv);
    pdl_enter();
    const long long r = blockIdx.x;
    rmsnorm_q_row<false>(Row{x + r * dim}, w, wv, out + r * dim, dim, eps, xq + r * 2 * dim, xds + r * kbp, nullptr);
}

// rmsnorm_q's bits with PRE, over a CTA for each 8 blocks (cuda_ops.norm_ctas; pending.py's norm_pre,
// which makes it rmsnorm_q once measured: two bodies till then, each opening as pdl.cuh asks).
extern "C" __global__ void rmsnorm_q_pre(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                         int dim, float eps, signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
    float wv[NORM_W];
    norm_w_ahead(w, dim, wv);
    pdl_enter();
    const long long r = blockIdx.x;
    rmsnorm_q_row<true>(Row{x + r * dim}, w, wv, out + r * dim, dim, eps, xq + r * 2 * dim, xds + r * kbp, nullptr);
}

// An MoE decode layer's end and the next layer's first op in one node: sum (n, H) = res + each
// token's k picks of y (P, H), weighted (moe_combine), and rmsnorm_q of the sum with w (the next
// layer's input norm) into out and the mat-vec format. The same bits as the two launches.
extern "C" __global__ void combine_rmsnorm_q(const float* __restrict__ y, const float* __restrict__ wts, int k,
                                             const float* __restrict__ res, float* __restrict__ sum,
                                             const float* __restrict__ w, float* __restrict__ out, int dim, float eps,
                                             signed char* __restrict__ xq, float2* __restrict__ xds, int kbp) {
    float wv[NORM_W];
    norm_w_ahead(w, dim, wv);
    pdl_enter();
    const int t = blockIdx.x;
    rmsnorm_q_row<false>(Picks{y, wts, res, t, k, dim}, w, wv, out + (long long)t * dim, dim, eps,
                         xq + (long long)t * 2 * dim, xds + (long long)t * kbp, sum + (long long)t * dim);
}

// The gated MLP's activation, y = act(g) * u (act 0: SiLU, 1: GELU-tanh, 2: gpt-oss's clamped
// SwiGLU with alpha and limit, the arithmetic of cuda.py's _swiglu_oai), also written in the
// mat-vec format for ffn_down. One warp per 32-element block of the (n, K) inputs.
extern "C" __global__ void act_gate_q(const float* __restrict__ g, const float* __restrict__ u,
                                      float* __restrict__ y, int K, int n, int act, signed char* __restrict__ xq,
                                      float2* __restrict__ xds, int kbp, float alpha, float limit) {
    pdl_enter();
    long long gw = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP, nkb = K / 32;
    if (gw >= (long long)n * nkb) return;
    int c = gw / nkb, kb = gw % nkb;
    long long i = (long long)c * K + kb * 32 + lane;
    float a = g[i], v;
    if (act == 0) v = a / (1.0f + expf(-a)) * u[i];
    else if (act == 1) v = 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a))) * u[i];
    else {
        float gc = fminf(a, limit), uc = fminf(fmaxf(u[i], -limit), limit);
        v = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
    }
    y[i] = v;
    quantize_block32(v, lane, xq + (long long)c * 2 * K + kb * 32, K, xds + (long long)c * kbp + kb);
}

// Rotary embedding of one pair (xa, xb) of element pair i of a head at position p:
// theta = p * scale * base^(-2i/d) / ff[i]. neox pairs the halves (i, i + d/2), normal pairs
// adjacent elements (2i, 2i + 1): the caller picks the indices.
__device__ __forceinline__ void rope_pair(float& xa, float& xb, int p, int i, int d, float base, float scale,
                                          const float* __restrict__ ff) {
    float inv = powf(base, -2.0f * i / d);
    if (ff) inv /= ff[i];
    float s, c;
    sincosf((float)p * scale * inv, &s, &c);
    float a = xa, b = xb;
    xa = a * c - b * s;
    xb = a * s + b * c;
}

// Rotary embedding of x (n, heads, d) in place; positions pos[n].
extern "C" __global__ void rope_f32(float* __restrict__ x, const int* __restrict__ pos, int n, int heads, int d,
                                    float base, float scale, int neox, const float* __restrict__ ff) {
    pdl_enter();
    int half = d / 2;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * heads * half) return;
    int i = t % half;
    long long row = t / half;  // token * heads + head
    float* xr = x + row * d;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    rope_pair(xr[a], xr[b], pos[row / heads], i, d, base, scale, ff);
}

// rope of q in place and of k, then k and v into the f16 cache at slot slot_of[token]: what
// rope_f32 twice and kv_write_f16 do, in one launch (a decode step runs one per layer).
// Threads cover (token, head, pair) over the q heads and then the k heads.
extern "C" __global__ void rope_kv(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                   __half* __restrict__ K, __half* __restrict__ V, const int* __restrict__ pos,
                                   int n, int hq, int hkv, int d, float base, float scale, int neox,
                                   const float* __restrict__ ff, const int* __restrict__ slot_of) {
    pdl_enter();
    int half = d / 2;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * (hq + hkv) * half) return;
    int i = t % half;
    long long row = t / half;  // token * (hq + hkv) + head
    int tok = row / (hq + hkv), h = row % (hq + hkv);
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    int p = pos[tok];
    if (h < hq) {
        float* xr = q + ((long long)tok * hq + h) * d;
        rope_pair(xr[a], xr[b], p, i, d, base, scale, ff);
        return;
    }
    long long src = ((long long)tok * hkv + (h - hq)) * d;
    long long dst = ((long long)slot_of[tok] * hkv + (h - hq)) * d;
    float ka = k[src + a], kb = k[src + b];
    rope_pair(ka, kb, p, i, d, base, scale, ff);
    K[dst + a] = __float2half_rn(ka);
    K[dst + b] = __float2half_rn(kb);
    V[dst + a] = __float2half_rn(v[src + a]);
    V[dst + b] = __float2half_rn(v[src + b]);
}

// qwen3's q and k head norms (rmsnorm_pair's, with wq / wk) and then rope_kv, in one launch: one
// warp a (token, head), for prefills (cuda_ops.NORM_ROPE_MIN_ROWS: a decode step lost with it,
// s16). The sum of squares is added in the order block_sum adds it for a 256-thread CTA (a lane's elements 256 apart, each warp's 32, then the warps' sums as a warp
// sum), so the normed values, and all that follows, are rmsnorm_pair's then rope_kv's bits.
// q is read and written in place (no __restrict__ on it).
extern "C" __global__ void norm_rope_kv(float* q, const float* __restrict__ k, const float* __restrict__ v,
                                        __half* __restrict__ K, __half* __restrict__ V, const int* __restrict__ pos,
                                        int n, int hq, int hkv, int d, float base, float scale, int neox,
                                        const float* __restrict__ ff, const int* __restrict__ slot_of,
                                        const float* __restrict__ wq, const float* __restrict__ wk, float eps) {
    pdl_enter();
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;  // token * (hq + hkv) + head
    const int lane = threadIdx.x % WARP;
    if (row >= (long long)n * (hq + hkv)) return;  // whole warps leave together
    const int tok = row / (hq + hkv), h = row % (hq + hkv), kh = h - hq;
    const bool isq = h < hq;
    float* src = isq ? q + ((long long)tok * hq + h) * d : const_cast<float*>(k) + ((long long)tok * hkv + kh) * d;
    const float* w = isq ? wq : wk;
    float mine = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float s = 0.f;
        for (int e = 32 * j + lane; e < d; e += 256) s += src[e] * src[e];
        s = warp_sum(s);
        if (lane == j) mine = s;
    }
    const float inv = 1.0f / sqrtf(warp_sum(mine) / d + eps);
    const int half = d / 2, p = pos[tok];
    const long long dst = isq ? 0 : ((long long)slot_of[tok] * hkv + kh) * d;
    const float* vs = v + ((long long)tok * hkv + kh) * d;
    for (int i = lane; i < half; i += WARP) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float xa = src[a] * inv * w[a], xb = src[b] * inv * w[b];
        rope_pair(xa, xb, p, i, d, base, scale, ff);
        if (isq) {
            src[a] = xa;
            src[b] = xb;
        } else {
            K[dst + a] = __float2half_rn(xa);
            K[dst + b] = __float2half_rn(xb);
            V[dst + a] = __float2half_rn(vs[a]);
            V[dst + b] = __float2half_rn(vs[b]);
        }
    }
}

// K/V (n, kv_heads, d) f32 -> the f16 cache rows at slot slot_of[token].
extern "C" __global__ void kv_write_f16(const float* __restrict__ k, const float* __restrict__ v,
                                        __half* __restrict__ K, __half* __restrict__ V,
                                        const int* __restrict__ slot_of, int n, int row) {
    pdl_enter();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * row) return;
    int tok = t / row, e = t % row;
    long long dst = (long long)slot_of[tok] * row + e;
    K[dst] = __float2half_rn(k[t]);
    V[dst] = __float2half_rn(v[t]);
}

// Prefill attention: masked softmax over f32 scores (rows, L) in place, one block per row.
// Row r is query i = r % n at position q0 + i; column j is the key at position k0 + j.
extern "C" __global__ void masked_softmax_f32(float* __restrict__ sc, int n, int L, int q0, int k0, int window) {
    pdl_enter();
    long long r = blockIdx.x;
    int qp = q0 + (int)(r % n);
    float* row = sc + r * L;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        int kp = k0 + j;
        bool ok = kp <= qp && (window == 0 || qp - kp < window);
        if (ok) mx = fmaxf(mx, row[j]);
    }
    __shared__ float red[32];
    mx = warp_max(mx);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = mx;
    __syncthreads();
    if (threadIdx.x < WARP) {
        float v = threadIdx.x < (blockDim.x + WARP - 1) / WARP ? red[threadIdx.x] : -INFINITY;
        v = warp_max(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    mx = red[0];
    float s = 0.f;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        int kp = k0 + j;
        bool ok = kp <= qp && (window == 0 || qp - kp < window);
        s += ok ? __expf(row[j] - mx) : 0.f;
    }
    float inv = 1.0f / block_sum(s);
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        int kp = k0 + j;
        bool ok = kp <= qp && (window == 0 || qp - kp < window);
        row[j] = ok ? __expf(row[j] - mx) * inv : 0.f;
    }
}
