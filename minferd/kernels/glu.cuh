// The gated MLP's activation of one element, y = act(g) * u: act 0 SiLU, 1 GELU-tanh, 2 gpt-oss's
// clamped SwiGLU with alpha and limit (cuda_ops' _swiglu_oai arithmetic). ops.cu's act_gate_q and
// mmvq.cu's mmvq_ids_glu share it, so the fused launch gives the two launches' bits.
#pragma once

__device__ __forceinline__ float glu_act(float a, float u, int act, float alpha, float limit) {
    if (act == 0) return a / (1.0f + expf(-a)) * u;
    if (act == 1) return 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a))) * u;
    const float gc = fminf(a, limit), uc = fminf(fmaxf(u, -limit), limit);
    return gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
}
