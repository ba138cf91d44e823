// The merge done by the last split CTA of a (sequence, head chunk) instead of a kernel of its
// own (attn_decode_merge): one graph node a layer fewer. Each split CTA, once its partials are
// written, bumps its group's counter word; the one that makes it `splits` merges the group's
// gc heads into out (the kernel's mout; its `out` stays null, as for any split count above 1)
// from the partials the others wrote (read through L2: __ldcg) and resets the word for
// the next launch or graph replay. counters null: the merge kernel runs after (the launcher's
// choice), and this returns at once. Every thread of the CTA calls it (it synchronises), with
// the kernel's dynamic shared memory, free by then, as scratch for the weights (a static array
// would cost the d = 256 kernels a resident CTA per SM whether they merge or not).
#pragma once

__device__ __forceinline__ void merge_if_last(unsigned* __restrict__ counters, const float* __restrict__ part_o,
                                              const float2* __restrict__ part_ml, const float* __restrict__ sinks,
                                              float* __restrict__ out, signed char* __restrict__ xq,
                                              float2* __restrict__ xds, int kbp, int b, int hq, int D, int h0,
                                              int gc, int splits, long long row0, int tid,
                                              unsigned char* scratch) {
  if (!counters) return;
  __shared__ bool last;
  float (*wgt)[MAX_SPLITS] = reinterpret_cast<float (*)[MAX_SPLITS]>(scratch);  // (GMAX, MAX_SPLITS)
  float* inv = reinterpret_cast<float*>(scratch) + GMAX * MAX_SPLITS;
  unsigned* word = counters + (long long)blockIdx.z * gridDim.y + blockIdx.y;
  __syncthreads();  // this CTA's partials are written, and nothing reads the scratch any more
  if (tid == 0) {
    __threadfence();  // ... and visible to the CTA that merges
    last = atomicAdd(word, 1u) == (unsigned)splits - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (tid < gc) {  // a head's split weights, as attn_decode_merge's first warp makes them
    const float2* ml = part_ml + (row0 + tid) * splits;
    float M = -INFINITY, S = 0.f;
    for (int s = 0; s < splits; ++s) M = fmaxf(M, __ldcg(&ml[s].x));
    for (int s = 0; s < splits; ++s) {
      const float2 x = __ldcg(ml + s);
      const float w = x.x == -INFINITY ? 0.f : exp2f(x.x - M);  // empty splits weigh 0
      wgt[tid][s] = w;
      S += x.y * w;
    }
    if (sinks) S += exp2f(__ldg(sinks + h0 + tid) * 1.4426950408889634f - M);
    inv[tid] = S > 0.f ? 1.0f / S : 0.f;
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += NT) {  // warps hold whole 32-element blocks (D % 32 == 0)
    const int hh = i / D, e = i % D;
    const float* po = part_o + (row0 + hh) * splits * D + e;
    float o = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = wgt[hh][s];
      if (w != 0.f) o = fmaf(w, __ldcg(po + (long long)s * D), o);  // an empty split's o was never written
    }
    write_out(out, xq, xds, kbp, b, hq, D, h0 + hh, e, o * inv[hh]);
  }
  if (tid == 0) *word = 0u;
}
