// Small fused ops of the forward pass, f32 activations, f16 KV cache.
// Every kernel reads token positions from device memory so that the decode step can be
// captured once as a CUDA graph and replayed with new positions.
#include <cuda_fp16.h>

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

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   (one block per row)
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ out, int dim, float eps) {
    const float* xr = x + (long long)blockIdx.x * dim;
    float* orow = out + (long long)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * inv * w[i];
}

// Rotary embedding of x (n, heads, d) in place; positions pos[n]. neox rotates the halves
// (i, i + d/2), normal rotates adjacent pairs (2i, 2i + 1). theta = pos * scale * base^(-2i/d) / ff[i].
extern "C" __global__ void rope_f32(float* __restrict__ x, const int* __restrict__ pos, int n, int heads, int d,
                                    float base, float scale, int neox, const float* __restrict__ ff) {
    int half = d / 2;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * heads * half) return;
    int i = t % half;
    long long row = t / half;  // token * heads + head
    int tok = row / heads;
    float inv = powf(base, -2.0f * i / d);
    if (ff) inv /= ff[i];
    float theta = (float)pos[tok] * scale * inv;
    float s, c;
    sincosf(theta, &s, &c);
    float* xr = x + row * d;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float xa = xr[a], xb = xr[b];
    xr[a] = xa * c - xb * s;
    xr[b] = xa * s + xb * c;
}

// K/V (n, kv_heads, d) f32 -> the f16 cache rows at slot pos % slots.
extern "C" __global__ void kv_write_f16(const float* __restrict__ k, const float* __restrict__ v,
                                        __half* __restrict__ K, __half* __restrict__ V,
                                        const int* __restrict__ pos, int n, int row, int slots) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * row) return;
    int tok = t / row, e = t % row;
    long long dst = (long long)(pos[tok] % slots) * row + e;
    K[dst] = __float2half_rn(k[t]);
    V[dst] = __float2half_rn(v[t]);
}

// Decode attention, pass 1 (split-K flash decoding): block (split, head) scans its share of
// the keys visible from the one query at position pos[0]; writes (max, sum, o) partials.
// Keys live at slot p % slots; visible: p in [max(0, pos - window + 1, pos + 1 - slots), pos].
// blockDim = 128 (4 warps); a warp takes one key at a time; lanes split the head dimension.
#define DMAX 256
extern "C" __global__ void attn_decode_partial(const float* __restrict__ q, const __half* __restrict__ K,
                                               const __half* __restrict__ V, const int* __restrict__ pos,
                                               int slots, int window, float scale, int heads, int kv_heads,
                                               int d, int splits, float* __restrict__ part_o,
                                               float* __restrict__ part_ms) {
    int split = blockIdx.x, h = blockIdx.y, kvh = h / (heads / kv_heads);
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    int p = pos[0];
    int lo = p + 1 - slots;
    if (window > 0 && p - window + 1 > lo) lo = p - window + 1;
    if (lo < 0) lo = 0;
    int n_keys = p + 1 - lo;
    int per = (n_keys + splits - 1) / splits;
    int k0 = lo + split * per, k1 = min(k0 + per, p + 1);
    const float* qh = q + (long long)h * d;
    float qv[DMAX / WARP], acc[DMAX / WARP];
    int nd = d / WARP;
    for (int j = 0; j < nd; j++) { qv[j] = qh[lane + j * WARP] * scale; acc[j] = 0.f; }
    float m = -INFINITY, s = 0.f;
    for (int key = k0 + warp; key < k1; key += nwarps) {
        long long base = ((long long)(key % slots) * kv_heads + kvh) * d;
        float dot = 0.f;
        for (int j = 0; j < nd; j++) dot += qv[j] * __half2float(K[base + lane + j * WARP]);
        dot = warp_sum(dot);
        float m2 = fmaxf(m, dot), corr = __expf(m - m2), w = __expf(dot - m2);
        s = s * corr + w;
        for (int j = 0; j < nd; j++) acc[j] = acc[j] * corr + w * __half2float(V[base + lane + j * WARP]);
        m = m2;
    }
    // Combine the warps of this block.
    __shared__ float wm[4], ws[4], wo[4][DMAX];
    if (lane == 0) { wm[warp] = m; ws[warp] = s; }
    for (int j = 0; j < nd; j++) wo[warp][lane + j * WARP] = acc[j];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < nwarps; w++) M = fmaxf(M, wm[w]);
        float S = 0.f, c[4];
        for (int w = 0; w < nwarps; w++) { c[w] = wm[w] == -INFINITY ? 0.f : __expf(wm[w] - M); S += ws[w] * c[w]; }
        long long out = ((long long)split * heads + h);
        for (int j = 0; j < nd; j++) {
            float o = 0.f;
            for (int w = 0; w < nwarps; w++) o += wo[w][lane + j * WARP] * c[w];
            part_o[out * d + lane + j * WARP] = o;
        }
        if (lane == 0) { part_ms[out * 2] = M; part_ms[out * 2 + 1] = S; }
    }
}

// Decode attention, pass 2: merge the splits of each head (one warp per head).
extern "C" __global__ void attn_decode_merge(const float* __restrict__ part_o, const float* __restrict__ part_ms,
                                             float* __restrict__ out, int heads, int d, int splits) {
    int h = blockIdx.x, lane = threadIdx.x;
    float M = -INFINITY;
    for (int sp = 0; sp < splits; sp++) M = fmaxf(M, part_ms[((long long)sp * heads + h) * 2]);
    float S = 0.f;
    for (int sp = 0; sp < splits; sp++) {
        float m = part_ms[((long long)sp * heads + h) * 2];
        if (m != -INFINITY) S += part_ms[((long long)sp * heads + h) * 2 + 1] * __expf(m - M);
    }
    for (int e = lane; e < d; e += WARP) {
        float o = 0.f;
        for (int sp = 0; sp < splits; sp++) {
            float m = part_ms[((long long)sp * heads + h) * 2];
            if (m != -INFINITY) o += part_o[((long long)sp * heads + h) * d + e] * __expf(m - M);
        }
        out[(long long)h * d + e] = o / S;
    }
}

// Prefill attention: masked softmax over f32 scores (rows, L) in place, one block per row.
// Row r is query i = r % n at position q0 + i; column j is the key at position k0 + j.
extern "C" __global__ void masked_softmax_f32(float* __restrict__ sc, int n, int L, int q0, int k0, int window) {
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
