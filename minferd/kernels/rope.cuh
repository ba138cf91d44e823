// Rotary embedding of one element pair, shared by ops.cu's rope kernels and mmvq.cu's q/k epilogue
// (the same arithmetic in both, so a fused and an unfused decode step agree bit for bit).
#pragma once

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
