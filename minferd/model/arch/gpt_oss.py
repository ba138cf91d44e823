"""gpt-oss (OpenAI gpt-oss-20b, -120b), as llama.cpp runs it (LLM_ARCH_OPENAI_MOE,
src/models/openai-moe-iswa.cpp): biased q, k, v and output projections; attention sinks, a learned
logit per head that joins every softmax's denominator (it takes probability, gives no value);
sliding-window layers (the even ones) alternating with full ones; rope with YaRN scaling on every
layer; and in place of the MLP a router without a shared expert.

Routing is build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: the top k of the
router's biased logits, their softmax as the weights (the same numbers as qwen3moe's softmax then
renormalization). Each expert is biased and gated by swiglu_oai. The norm before the MLP is
post_attention_norm (llama.cpp's attn_post_norm); there is no ffn_norm, and no tied output.
"""
import numpy as np

from minferd.model.arch.llama import VECTOR, LlamaModel
from minferd.model.arch.qwen3moe import expert_tensors, with_output

# build_moe_ffn's constants for LLM_FFN_SWIGLU_OAI_MOE (the reference's alpha and clamp).
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


class GptOssModel(LlamaModel):
    backends = ("cpu", "cuda")  # tests/cuda/test_gpt_oss_cuda.py (passed on the H200 in session 14)
    graph_safe = False  # the routing may come back to the host, a layer at a time (backend/moe.py)
    device_moe = True  # where it stays on the device, graphs can hold the pass (cuda_moe.moe_reads_host)

    @classmethod
    def expected_tensors(cls, s):
        return with_output(super().expected_tensors(s), s)

    @classmethod
    def layer_tensors(cls, s, p):
        t = super().layer_tensors(s, p)
        for dense in ("ffn_norm", "ffn_gate", "ffn_up", "ffn_down"):
            del t[p + dense + ".weight"]
        t[p + "post_attention_norm.weight"] = ((s.hidden,), VECTOR)
        for name, n in (("attn_q", s.q_dim), ("attn_k", s.kv_dim), ("attn_v", s.kv_dim), ("attn_output", s.hidden)):
            t[p + name + ".bias"] = ((n,), VECTOR)
        t[p + "attn_sinks.weight"] = ((s.n_heads,), VECTOR)
        t |= expert_tensors(s, p)
        t[p + "ffn_gate_inp.bias"] = ((s.n_expert,), VECTOR)
        # Expert e's bias is row e: the same stacking as the experts, one axis down.
        t[p + "ffn_gate_exps.bias"] = ((s.expert_ffn, s.n_expert), VECTOR)
        t[p + "ffn_up_exps.bias"] = ((s.expert_ffn, s.n_expert), VECTOR)
        t[p + "ffn_down_exps.bias"] = ((s.hidden, s.n_expert), VECTOR)
        return t

    @classmethod
    def optional_tensors(cls, s):
        return {}  # YaRN, not rope_freqs, is what stretches gpt-oss's rope

    def __init__(self, spec, weights, backend):
        super().__init__(spec, weights, backend)
        # YaRN as every backend's plain rope takes it: each pair's blended frequency as a freq
        # factor (the position scale then 1), and cos and sin's factor mscale on q and k alike,
        # which is mscale^2 on every attention logit.
        s, y = spec, spec.yarn
        ff = (lambda b: None) if y is None else \
            (lambda b: backend.to_device(y.freq_factors(s.head_dim, b, s.rope_scale).astype(np.float32)))
        self.rope_ff = {b: ff(b) for b in {s.rope_base, s.rope_base_swa}}
        self.rope_scale = s.rope_scale if y is None else 1.0
        self.logit_scale = s.attn_scale * (1.0 if y is None else y.mscale(s.rope_scale) ** 2)

    def attention(self, i, x, batch, cache):
        s, be = self.spec, self.be
        q, k, v = self.qkv(i, x)
        swa = s.swa_layers[i]
        base = s.rope_base_swa if swa else s.rope_base
        q = be.rope_kv(q, k, v, cache, i, batch, base, self.rope_scale, s.rope_type == "neox", self.rope_ff[base])
        return be.attention(q, cache, i, batch, s.sliding_window if swa else 0, self.logit_scale,
                            sinks=self.w[f"blk.{i}.attn_sinks.weight"])

    def layer(self, i, x, batch, cache):
        s, be, w, p = self.spec, self.be, self.w, f"blk.{i}."
        h = be.rmsnorm(x, w[p + "attn_norm.weight"], s.norm_eps)
        x = be.matmul(self.attention(i, h, batch, cache), w[p + "attn_output.weight"], w[p + "attn_output.bias"],
                      residual=x)
        h = be.rmsnorm(x, w[p + "post_attention_norm.weight"], s.norm_eps)
        exps = [p + f"ffn_{m}_exps" for m in ("gate", "up", "down")]
        return be.moe(h, w[p + "ffn_gate_inp.weight"], *(w[e + ".weight"] for e in exps), s.n_expert_used,
                      residual=x, router_bias=w[p + "ffn_gate_inp.bias"], exps_bias=tuple(w[e + ".bias"] for e in exps),
                      oai_glu=(SWIGLU_ALPHA, SWIGLU_LIMIT), then_norm=self.norm_after(i))
