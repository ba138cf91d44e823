"""Why the int8 kernels quantize x in two planes: the logit error of a whole model when every
prefill matmul input is rounded to one int8 plane per 32 elements (llama.cpp's q8_1) or to
two (x = d * (hi + lo/254), mmvq.cu and mmq.cu), against exact f32 inputs, on the CPU backend.

    python bench/activation_planes.py [MODEL] [--seqs 3] [--tokens 48]

2026-11-29, the real gemma3-270m, 3 x 48 tokens: one plane 3.1e-2..4.8e-2 relative error and
top-1 agreement 90-94% (past the 2e-2 / 95% the CUDA paths are held to); two planes
1.7e-4..3.0e-4 and 100%.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rounded(x: np.ndarray, planes: int) -> np.ndarray:
    """x as the int8 kernels see it (quantize_x_ref, xquant.cuh's twin): d * hi with one plane,
    d * (hi + lo/254) with two."""
    from minferd.kernels.quantize_ref import quantize_x_ref
    n, K = x.shape
    xq, xds, _ = quantize_x_ref(x)
    d = np.repeat(xds[:, :K // 32, 0].astype(np.float64), 32, axis=1)
    q = xq[:, 0].astype(np.float64) + (xq[:, 1] / 254.0 if planes == 2 else 0.0)
    return (d * q).astype(np.float32)


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
    mode = {"planes": 0}
    exact = CpuBackend.matmul

    def matmul(self, x, w, bias=None, residual=None):
        if mode["planes"] and x.shape[0] > 8 and w.qtype.is_quantized:
            x = rounded(np.asarray(x, np.float32), mode["planes"])
        return exact(self, x, w, bias, residual)

    CpuBackend.matmul = matmul
    lm = load_local(args.model, "mmq", threads=args.threads, ctx=args.tokens)
    rng = np.random.default_rng(0)
    for s in range(args.seqs):
        ids = rng.integers(300, min(lm.spec.n_vocab, 30000), args.tokens)
        out = {}
        for planes in (0, 1, 2):
            mode["planes"] = planes
            cache = lm.model.new_cache(lm.model.be.untracked(), args.tokens)
            out[planes] = prefill(lm.model, ids, cache, all_logits=True)
        for planes in (1, 2):
            err = np.linalg.norm(out[planes] - out[0]) / np.linalg.norm(out[0])
            agree = float((out[planes].argmax(1) == out[0].argmax(1)).mean())
            print(f"sequence {s}, {planes} plane(s): relative error {err:.2e}, top-1 agreement {agree:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
