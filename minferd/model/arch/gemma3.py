"""Gemma 3: embeddings scaled by sqrt(hidden), q/k norms, a norm before and after both the
attention and the MLP, a GELU-tanh gated MLP, sliding-window layers interleaved with global
ones (each with its own rope base), and the output tied to the embeddings.

GGUF stores Gemma's norm weights with the +1 already folded in, so they multiply as usual.
"""
from minferd.model.arch.llama import VECTOR, LlamaModel


class Gemma3Model(LlamaModel):
    @classmethod
    def layer_tensors(cls, s, p):
        t = super().layer_tensors(s, p)
        t[p + "attn_q_norm.weight"] = ((s.head_dim,), VECTOR)
        t[p + "attn_k_norm.weight"] = ((s.head_dim,), VECTOR)
        t[p + "post_attention_norm.weight"] = ((s.hidden,), VECTOR)
        t[p + "post_ffw_norm.weight"] = ((s.hidden,), VECTOR)
        return t

    @classmethod
    def optional_tensors(cls, s):
        return {}

    def layer(self, i, x, batch, cache):
        s, be, p = self.spec, self.be, f"blk.{i}."
        h = be.rmsnorm(x, self.w[p + "attn_norm.weight"], s.norm_eps)
        h = be.matmul(self.attention(i, h, batch, cache), self.w[p + "attn_output.weight"])
        x = x + be.rmsnorm(h, self.w[p + "post_attention_norm.weight"], s.norm_eps)
        h = be.rmsnorm(x, self.w[p + "ffn_norm.weight"], s.norm_eps)
        g, u = be.matmuls(h, [self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"]])
        h = be.matmul(be.gelu_gate(g, u), self.w[p + "ffn_down.weight"])
        return x + be.rmsnorm(h, self.w[p + "post_ffw_norm.weight"], s.norm_eps)
