"""Qwen3 (dense): the llama decoder with an RMSNorm on each head of q and k before rope."""
from minferd.model.arch.llama import VECTOR, LlamaModel


class Qwen3Model(LlamaModel):
    @classmethod
    def layer_tensors(cls, s, p):
        t = super().layer_tensors(s, p)
        t[p + "attn_q_norm.weight"] = ((s.head_dim,), VECTOR)
        t[p + "attn_k_norm.weight"] = ((s.head_dim,), VECTOR)
        return t
