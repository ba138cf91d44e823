"""Which objects of a model loaded outside the pool outlive it on CUDA: the backend, the model, the
arena and its buffer after the collector runs, the local pool's bytes in use, and for what still
lives, who refers to it. s30 (H100): the first three went, yet each load kept 679 MiB (its arena's
buffer) in the pool; s31: the buffer's holders were its chunks' memory objects, themselves held by
nothing the collector sees (CuPy's split pool blocks, `no_gc`, left in cycles when their pool
died): cuda_memory._Owner lets the buffer go with the arena.

    python bench/leak_probe.py MODEL.gguf
"""
from __future__ import annotations

import argparse
import gc
import sys
import types
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed


DEPTH = 5  # referrer levels printed


def referrers(obj, depth: int = 0, seen: set | None = None) -> None:
    """Print what refers to obj, and what refers to those, DEPTH levels up (frames left out)."""
    seen = set() if seen is None else seen
    for r in gc.get_referrers(obj):
        if id(r) in seen or r is seen or isinstance(r, types.FrameType):
            continue
        seen.add(id(r))
        desc = type(r).__name__
        if isinstance(r, dict):
            desc += f" keys={[k for k, v in r.items() if v is obj][:3]}"
        print("  " * depth + "<-", desc, str(r)[:100].replace("\n", " "))
        if depth < DEPTH:
            referrers(r, depth + 1, seen)


def load_and_drop(model: str, path: str, graph: bool) -> tuple[list, tuple[int, int]]:
    """Weak references to (backend, model, arena, its buffer) of a load that ran a prefill (and a
    decode graph) and was then dropped, and the buffer's (address, size)."""
    from tests.cuda.test_local_resources import load_and_run  # CuPy: on the GPU machine only
    lm, _ = load_and_run(model, graph, path)
    m, be = lm.model, lm.model.be
    span = (be._arena_buf.data.ptr, be._arena_buf.nbytes)
    refs = []
    for o in (be, m, be.arena, be._arena_buf):
        try:
            refs.append(weakref.ref(o))
        except TypeError:  # no weak references to it: reported as gone (the array scan still looks)
            print(f" ({type(o).__name__} takes no weak reference)")
            refs.append(lambda: None)
    return refs, span


def arrays_inside(span: tuple[int, int]) -> list:
    """Live CuPy arrays (gc-tracked objects) whose memory lies in the dropped arena's buffer."""
    import cupy as cp
    lo, n = span
    return [o for o in gc.get_objects() if isinstance(o, cp.ndarray) and lo <= o.data.ptr < lo + n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    args = ap.parse_args(argv)
    from minferd.backend.cuda_memory import DeviceMemory  # CuPy: on the GPU machine only
    for path in ("mmq", "w16"):
        for graph in (False, True):
            refs, span = load_and_drop(args.model, path, graph)
            gc.collect()
            inside = arrays_inside(span)
            print(f" arrays alive inside the dropped buffer: {len(inside)}",
                  [(a.shape, str(a.dtype)) for a in inside[:8]])
            if inside:
                print(" the first one's referrers:")
                referrers(inside[0])
            alive = [r() is not None for r in refs]
            print(path, "graph" if graph else "eager", "alive (backend, model, arena, buffer):", alive,
                  "pool used", DeviceMemory.local().pool.used_bytes() >> 20, "MiB")
            for r, what in zip(refs, ("backend", "model", "arena", "buffer")):
                if r() is not None:
                    print(f" {what}'s referrers:")
                    referrers(r())
                    break  # the first one alive: what holds it holds the rest
    return 0


if __name__ == "__main__":
    sys.exit(main())
