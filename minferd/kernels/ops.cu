// Small fused ops of the forward pass, f32 activations, f16 KV cache: the gated activation, rope
// and the KV write, the softmax (the norms are norm.cu).
// Every kernel reads token positions from device memory so that the decode step can be
// captured once as a CUDA graph and replayed with new positions.
#include "pdl.cuh"
#include <cuda_fp16.h>
#include "xquant.cuh"
#include "reduce.cuh"
#include "rope.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // NVRTC has no math.h
#endif

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
    quantize_block32(v, lane, xq + (long long)c * 2 * K, K, kb, xds + (long long)c * kbp);
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
