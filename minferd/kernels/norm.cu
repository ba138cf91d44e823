// The RMS norms of the forward pass, f32 rows: a prefill's (rmsnorm_f32, also writing the f16 its
// GEMMs read), a decode step's (rmsnorm_q, also writing the mat-vecs' int8 format; rmsnorm_h for
// 3-64 rows), qwen3's head norms (rmsnorm_pair) and an MoE layer's end with the next norm
// (combine_rmsnorm_q). cuda_ops.py launches them.
#include "pdl.cuh"
#include <cuda_fp16.h>
#include "xquant.cuh"
#include "picks_sum.cuh"
#include "reduce.cuh"

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
// A warp holds the weights of its first NORM_W blocks (at 256 threads, dim up to 8192 at 4 CTAs a
// row, 65536 at norm_ctas' 32); blocks past those read theirs in turn.
#define NORM_W 8
__device__ __forceinline__ void norm_w_ahead(const float* __restrict__ w, int dim, float (&wv)[NORM_W]) {
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP, stride = nw * gridDim.y;
    const int warp = threadIdx.x / WARP + blockIdx.y * nw;
#pragma unroll
    for (int r = 0; r < NORM_W; ++r) {
        const int kb = warp + r * stride;
        wv[r] = kb < dim / 32 ? ld_ahead(w + kb * 32 + lane) : 0.0f;  // coherent: above the wait (pdl.cuh)
    }
}

// What a normed 32-element block leaves beside out (o): the mat-vec format of its row (xq, xds;
// a decode step's), or its f16 rounding (o16; the 3-64 rows a tcgemv reads).
struct ToXq {
    float* __restrict__ o; signed char* __restrict__ xq; float2* __restrict__ xds; int dim;
    __device__ __forceinline__ void operator()(int kb, int lane, float v) const {
        o[kb * 32 + lane] = v;
        quantize_block32(v, lane, xq, dim, kb, xds);
    }
};
struct ToF16 {
    float* __restrict__ o; __half* __restrict__ o16;
    __device__ __forceinline__ void operator()(int kb, int lane, float v) const {
        o[kb * 32 + lane] = v;
        o16[kb * 32 + lane] = __float2half_rn(v);
    }
};

// The block's share of one row normalised, handed to emit, and, where srow is set, the row's
// values themselves. Each CTA of the row's gridDim.y sums the whole row (from L2) and emits its
// share of 32-element blocks; wv: norm_w_ahead's weights.
// PRE: a warp's first NORM_W blocks' values are read with the sum's loads, not one after another
// (combine_rmsnorm_q keeps it off: an MoE token's picks, never measured with it).
template <bool PRE, class Src, class Emit>
__device__ __forceinline__ void rmsnorm_q_row(const Src& src, const float* __restrict__ w, const float (&wv)[NORM_W],
                                              int dim, float eps, const Emit& emit, float* __restrict__ srow) {
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
        if (srow) srow[kb * 32 + lane] = s;
        emit(kb, lane, s * inv * wi);
    };
#pragma unroll
    for (int r = 0; r < NORM_W; ++r)
        if (warp + r * stride < nb) block(warp + r * stride, wv[r], PRE ? sv[r] : src.at((warp + r * stride) * 32 + lane));
    for (int kb = warp + NORM_W * stride; kb < nb; kb += stride) block(kb, w[kb * 32 + lane], src.at(kb * 32 + lane));
}

// rmsnorm_f32 that also leaves its output in the mat-vec kernels' int8 format (xquant.cuh),
// so the q/k/v (or gate/up) mat-vecs that read it need no quantize_x launch. dim % 32 == 0.
// A row is spread over gridDim.y CTAs (cuda_ops.norm_ctas: a warp for each 32-element block, 14 at
// the 7B's 3584): one CTA a row was a 5 us step on one SM, 57 times a token; 14 with each warp's
// values read with the sum (PRE) beat 4 read after it by 1.7% of the 7B's token (s38).
extern "C" __global__ void rmsnorm_q(const float* __restrict__ x, const float* __restrict__ w,
                                     float* __restrict__ out, int dim, float eps, signed char* __restrict__ xq,
                                     float2* __restrict__ xds, int kbp) {
    float wv[NORM_W];
    norm_w_ahead(w, dim, wv);
    pdl_enter();
    const long long r = blockIdx.x;
    rmsnorm_q_row<true>(Row{x + r * dim}, w, wv, dim, eps, ToXq{out + r * dim, xq + r * 2 * dim, xds + r * kbp, dim},
                        nullptr);
}

// rmsnorm_q's arithmetic for 3-64 rows, out and its f16 rounding (what tcgemv reads). dim % 32 == 0.
// rmsnorm_f32 took 0.30 ms of the 7B's 16-token prefill in 56 norms, this 0.16 (H100, s38).
extern "C" __global__ void rmsnorm_h(const float* __restrict__ x, const float* __restrict__ w,
                                     float* __restrict__ out, int dim, float eps, __half* __restrict__ out16) {
    float wv[NORM_W];
    norm_w_ahead(w, dim, wv);
    pdl_enter();
    const long long r = blockIdx.x;
    rmsnorm_q_row<true>(Row{x + r * dim}, w, wv, dim, eps, ToF16{out + r * dim, out16 + r * dim}, nullptr);
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
    rmsnorm_q_row<false>(Picks{y, wts, res, t, k, dim}, w, wv, dim, eps,
                         ToXq{out + (long long)t * dim, xq + (long long)t * 2 * dim, xds + (long long)t * kbp, dim},
                         sum + (long long)t * dim);
}
