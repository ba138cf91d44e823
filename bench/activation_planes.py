"""Why the int8 kernels quantize x in two planes, and how coarse its scale may be: the logit
error of a whole model when every prefill matmul input is rounded as mmq.cu rounds it (one
int8 plane, llama.cpp's q8_1, or two: x = d * (hi + lo/128)) with one scale per 32 elements,
per 128, or per token row, against exact f32 inputs, on the CPU backend.

    python bench/activation_planes.py [MODEL] [--seqs 3] [--tokens 48]

2026-11-30, the real gemma3-270m, 3 x 48 tokens, relative error / top-1 agreement:
  one plane per 32     3.8e-2..4.7e-2 / 85-92%  (past the 2e-2 / 95% the CUDA paths are held to)
  two planes per 32    3.3e-4..5.1e-4 / 100%
  two planes per 128   3.7e-4..6.5e-4 / 100%
  two planes per row   1.2e-3..1.4e-3 / 100%
One scale per token row is accurate enough, and it takes x's scale out of the K loop entirely
(out = dx[token] * sum over chunks of w-scaled int dot products): one fewer multiply per output
element and chunk. mmq.cu uses it since 2026-11-30 (two planes per row).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rounded(x: np.ndarray, planes: int, block: int = 32) -> np.ndarray:
    """x as mmq.cu's quantizer leaves it: per `block` elements (0: the whole row, one scale a
    token) d = amax/127, hi = rint(x/d) and, with two planes, lo = rint((x/d - hi) * 128);
    x ~= d * (hi + lo/128)."""
    n, K = x.shape
    b = x.reshape(n, -1, block or K).astype(np.float64)
    amax = np.abs(b).max(-1, keepdims=True)
    d = np.where(amax > 0, amax / 127.0, 1.0)
    hi = np.clip(np.rint(b / d), -127, 127)
    q = hi + (np.clip(np.rint((b / d - hi) * 128), -64, 64) / 128 if planes == 2 else 0.0)
    return (d * q).reshape(n, K).astype(np.float32)


# (planes, elements per scale; 0 = one scale per token row)
SCHEMES = [(1, 32), (2, 32), (2, 128), (2, 0)]


def main(argv=None) -> int:
    from minferd.backend.cpu import CpuBackend
    from minferd.model.generate import prefill
    from minferd.model.loader import load_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="gemma3-270m")
    ap.add_argument("--seqs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    mode = {"scheme": None}
    exact = CpuBackend.matmul

    def matmul(self, x, w, bias=None, residual=None):
        if mode["scheme"] and x.shape[0] > 8 and w.qtype.is_quantized:
            x = rounded(np.asarray(x, np.float32), *mode["scheme"])
        return exact(self, x, w, bias, residual)

    CpuBackend.matmul = matmul
    lm = load_local(args.model, "mmq", threads=args.threads, ctx=args.tokens)
    rng = np.random.default_rng(0)
    for s in range(args.seqs):
        ids = rng.integers(300, min(lm.spec.n_vocab, 30000), args.tokens)
        out = {}
        for scheme in [None] + SCHEMES:
            mode["scheme"] = scheme
            cache = lm.model.new_cache(lm.model.be.untracked(), args.tokens)
            out[scheme] = prefill(lm.model, ids, cache, all_logits=True)
        for planes, block in SCHEMES:
            got = out[(planes, block)]
            err = np.linalg.norm(got - out[None]) / np.linalg.norm(out[None])
            agree = float((got.argmax(1) == out[None].argmax(1)).mean())
            print(f"sequence {s}, {planes} plane(s) per {block or 'row'}: relative error {err:.2e}, "
                  f"top-1 agreement {agree:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
