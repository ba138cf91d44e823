"""Qwen2 / Qwen2.5: the llama decoder with biases on the q, k and v projections."""
from minferd.model.arch.llama import VECTOR, LlamaModel


class Qwen2Model(LlamaModel):
    @classmethod
    def layer_tensors(cls, s, p):
        t = super().layer_tensors(s, p)
        t[p + "attn_q.bias"] = ((s.q_dim,), VECTOR)
        t[p + "attn_k.bias"] = ((s.kv_dim,), VECTOR)
        t[p + "attn_v.bias"] = ((s.kv_dim,), VECTOR)
        return t
