"""How long the GPU idles between decode tokens: one sequence's decode step replayed back to back
with nothing on the host between (the device's own time a token), against the same step with the
host waiting for each token (the argmax copied back before the next launch, as engine.step does).
The difference is the least a synchronous decode loop leaves idle; bench/latency.py's tg128 through
the daemon, run in the same call, adds the engine's own Python. Past ~5%, a pipelined decode (the
next step launched before the token is read) is worth writing (bench/NOTES.md, session 31).

    python bench/decode_gap.py MODEL.gguf [--device cuda] [--path mmq|w16] [--depth 100] [--tokens 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from minferd.backend.batch import Batch  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402

BLOCK = 32


def timed_steps(be, m, batch, cache, n: int, wait_each: bool) -> float:
    """Milliseconds a token over n decode steps of `batch`; wait_each: the token to the host each step."""
    be.to_host(be.decode(m, batch, cache)[0, :1])  # the graph captured, and the device idle
    t0 = time.perf_counter()
    for _ in range(n):
        logits = be.decode(m, batch, cache)
        if wait_each:
            int(be.to_host(logits[0].argmax()))
    be.to_host(logits[0, :1])
    return (time.perf_counter() - t0) * 1e3 / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--path", default="mmq", help="the matmul path the model loads with (mmq, w16)")
    ap.add_argument("--depth", type=int, default=100, help="tokens in the cache before the decoded one")
    ap.add_argument("--tokens", type=int, default=200, help="steps timed per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not 1 <= args.depth <= 4096 or not 1 <= args.tokens <= 100_000 or not 1 <= args.rounds <= 100:
        ap.error("--depth 1..4096, --tokens 1..100000, --rounds 1..100")
    lm = load_local(args.model, args.path, device=args.device, ctx=args.depth + 1)
    m, be = lm.model, lm.model.be
    blocks = -(-(args.depth + 1) // BLOCK)
    cache = m.new_cache(be.untracked(), (blocks + 1) * BLOCK)
    table = list(range(blocks))
    m.forward_batch(Batch.build([(list(range(1, args.depth + 1)), 0, table)], BLOCK), cache)
    step = Batch.build([([7], args.depth, table)], BLOCK, width=blocks)
    free, waited = [], []
    for _ in range(args.rounds):  # in turns, so a drift of the clocks touches both alike
        free.append(timed_steps(be, m, step, cache, args.tokens, wait_each=False))
        waited.append(timed_steps(be, m, step, cache, args.tokens, wait_each=True))
    f, w = statistics.median(free), statistics.median(waited)
    print(f"{Path(args.model).name} ({args.path}, {args.device}), depth {args.depth}, medians of {args.rounds} "
          f"rounds of {args.tokens} steps")
    print(f"  back to back      {f:.3f} ms a token ({1e3 / f:.1f} tok/s)")
    print(f"  token to the host {w:.3f} ms a token ({1e3 / w:.1f} tok/s): {w - f:.3f} ms idle, {(w - f) / w:.1%}")
    lm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
