"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q, k, v biases), and in place of
the MLP a router sending each token to n_expert_used of n_expert SwiGLU experts, plus one shared
SwiGLU expert every token runs, scaled by a sigmoid gate of its own.

As llama.cpp's qwen2moe graph: build_moe_ffn with softmax gating and norm_w false (the top k
keep their softmax-over-all weights, not renormalized), the shared expert's gate sigmoid(x . g)
with g a vector (ffn_gate_inp_shexp, GGUF shape {n_embd}).
"""
from minferd.model.arch.llama import MATMUL, VECTOR
from minferd.model.arch.qwen2 import Qwen2Model
from minferd.model.arch.qwen3moe import moe_layer, with_output


class Qwen2MoeModel(Qwen2Model):
    backends = ("cpu", "cuda")  # tests/cuda/test_moe_cuda.py (passed on the H200 in session 12)
    # Prefill routes on the host (backend/moe.py); so could decode's, and sigmoid_dot multiplies
    # through CuPy's cuBLAS, which refuses a capture: no graph for its passes.
    graph_safe = False

    @classmethod
    def expected_tensors(cls, s):
        return with_output(super().expected_tensors(s), s)

    @classmethod
    def layer_tensors(cls, s, p):
        t = moe_layer(super().layer_tensors(s, p), s, p)
        t[p + "ffn_gate_inp_shexp.weight"] = ((s.hidden,), VECTOR)
        t[p + "ffn_gate_shexp.weight"] = ((s.hidden, s.shared_ffn), MATMUL)
        t[p + "ffn_up_shexp.weight"] = ((s.hidden, s.shared_ffn), MATMUL)
        t[p + "ffn_down_shexp.weight"] = ((s.shared_ffn, s.hidden), MATMUL)
        return t

    def mlp(self, p, h, residual):
        w, be = self.w, self.be
        shared = be.matmul(be.swiglu(*be.matmuls(h, [w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"]])),
                           w[p + "ffn_down_shexp.weight"])
        out = be.moe(h, w[p + "ffn_gate_inp.weight"], w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"],
                     w[p + "ffn_down_exps.weight"], self.spec.n_expert_used, residual=residual, norm_topk=False)
        return out + shared * be.sigmoid_dot(h, w[p + "ffn_gate_inp_shexp.weight"])
