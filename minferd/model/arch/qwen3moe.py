"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention, and in place of the MLP a router
sending each token to n_expert_used of n_expert SwiGLU experts. No shared expert.

Routing is llama.cpp's build_moe_ffn as qwen3moe calls it: softmax over all the router's
logits, the top k kept and renormalized to sum 1 (expert_weights_norm), no further scale.
"""
from minferd.model.arch.llama import EXPERTS, MATMUL, ROUTER
from minferd.model.arch.qwen3 import Qwen3Model


class Qwen3MoeModel(Qwen3Model):
    backends = ("cpu", "cuda")  # tests/cuda/test_moe_cuda.py
    graph_safe = False  # the routing may come back to the host, a layer at a time (backend/moe.py)
    device_moe = True  # where it stays on the device, graphs can hold the pass (cuda_moe.moe_reads_host)

    @classmethod
    def layer_tensors(cls, s, p):
        return moe_layer(super().layer_tensors(s, p), s, p)

    def mlp(self, p, h, residual):
        w = self.w
        return self.be.moe(h, w[p + "ffn_gate_inp.weight"], w[p + "ffn_gate_exps.weight"],
                           w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"],
                           self.spec.n_expert_used, residual=residual, then_norm=self.norm_after(int(p.split(".")[1])))


def moe_layer(t: dict, s, p: str, dense=("ffn_gate", "ffn_up", "ffn_down")) -> dict:
    """Layer `p`'s dense tensors `t` with its MLP (the `dense` ones) swapped for the router and
    the stacked experts (qwen2moe's and gpt-oss's too)."""
    for name in dense:
        del t[p + name + ".weight"]
    return t | expert_tensors(s, p)


def with_output(t: dict, s) -> dict:
    """The model's tensors with an untied output: llama.cpp requires one for these MoEs."""
    return t | {"output.weight": ((s.hidden, s.n_vocab), MATMUL)}


def expert_tensors(s, p: str) -> dict:
    """The router and the stacked experts of layer `p` (gpt-oss's too)."""
    # Experts stacked on a third axis: expert e is rows e*R .. (e+1)*R of the 2D view, where R is
    # the middle dimension (expert_ffn for gate and up, hidden for down).
    return {p + "ffn_gate_inp.weight": ((s.hidden, s.n_expert), ROUTER),
            p + "ffn_gate_exps.weight": ((s.hidden, s.expert_ffn, s.n_expert), EXPERTS),
            p + "ffn_up_exps.weight": ((s.hidden, s.expert_ffn, s.n_expert), EXPERTS),
            p + "ffn_down_exps.weight": ((s.expert_ffn, s.hidden, s.n_expert), EXPERTS)}
