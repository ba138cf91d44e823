"""A seeded randomized soak of the pool: loads with random plans and contexts, unloads,
generates (some cancelled), pins, keep-alive expiry, demotions, promotions and bad files, over
synthetic models whose total is `--over` times the budget. After every operation the ledger
must equal the allocator and the device's own count, within the budget; every refusal must be
a typed error; after unloading everything, 0 bytes remain.

    python bench/soak.py [--ops 1000] [--seed 0] [--over 1.7] [--json F]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import MatmulPath, cpu_traits
from minferd.errors import MinferdError
from minferd.host import Host, LoadOptions
from minferd.model.loader import open_model_file
from minferd.model.sampler import SamplingParams
from minferd.model.synth import write_model
from minferd.pool.estimator import estimate

MODELS = [("llama", "q4_k"), ("qwen2", "q8_0"), ("qwen3", "q4_0"), ("gemma3", "q6_k"), ("qwen2", "q5_1")]
CTXS = (64, 128, 256, 512)
KEEP_ALIVE = (0.0, -1.0, 0.05, 300.0)
PATHS = (None, MatmulPath.W16, MatmulPath.MMQ, MatmulPath.FUSED_B)


def write_models(folder: Path) -> list[str]:
    paths = []
    for arch, quant in MODELS:
        p = folder / f"{arch}-{quant}.gguf"
        write_model(p, arch, "tiny", quant, seed=len(paths))
        paths.append(str(p))
    bad = folder / "bad.gguf"
    bad.write_bytes(Path(paths[0]).read_bytes()[:5000])  # truncated
    return paths + [str(bad)]


def check(h: Host) -> None:
    held = h.ledger.held()
    assert held == h.allocator.held_bytes() == h.allocator.device.used_bytes(), \
        (held, h.allocator.held_bytes(), h.allocator.device.used_bytes())
    assert held <= h.ledger.committed() <= h.ledger.capacity


def run(n_ops: int = 1000, seed: int = 0, over: float = 1.7, folder: Path | None = None) -> dict:
    rng = np.random.default_rng(seed)
    tmp = None
    if folder is None:
        tmp = tempfile.TemporaryDirectory()
        folder = Path(tmp.name)
    paths = write_models(folder)
    traits = cpu_traits(1)
    total = sum(estimate(open_model_file(p), traits, max(CTXS)).total(False) for p in paths[:-1])
    mem = HostMemory()
    h = Host(lambda **kw: CpuBackend(1, mem, **kw), mem, traits, int(total / over), w16_min_bytes=0, default_parallel=1)
    counts, refusals = collections.Counter(), collections.Counter()
    names = [f"m{i}" for i in range(6)]
    t0 = time.perf_counter()
    for _ in range(n_ops):
        op = rng.choice(["load", "load", "load", "unload", "generate", "generate", "pin", "expire", "demote",
                         "promote"])
        # Mostly sensible names (a free one to load, a loaded one otherwise), sometimes any name.
        loaded = sorted(h.models)
        pool = [n for n in names if n not in loaded] if op == "load" else loaded
        name = str(rng.choice(pool if pool and rng.random() < 0.85 else names))
        counts[op] += 1
        try:
            if op == "load":
                path = paths[int(rng.integers(len(paths)))]
                requested = PATHS[int(rng.integers(len(PATHS)))]
                h.load(name, path, LoadOptions(requested, int(rng.choice(CTXS)), bool(rng.random() < 0.2),
                                               float(rng.choice(KEEP_ALIVE))))
            elif op == "unload":
                h.unload(name)
            elif op == "generate":
                # Some clients walk away mid-stream: closing the stream cancels the request.
                walk_away = int(rng.integers(1, 6)) if rng.random() < 0.3 else None
                events = h.stream(name, rng.integers(300, 900, int(rng.integers(1, 16))).tolist(),
                                  SamplingParams(temperature=0.8, seed=int(rng.integers(1 << 30)), max_tokens=8))
                for i, _ in enumerate(events):
                    if walk_away is not None and i + 1 >= walk_away:
                        counts["cancelled"] += 1
                        break
                events.close()
            elif op == "pin":
                h.set_pinned(name, bool(rng.random() < 0.5))
            elif op == "expire":
                for lm in list(h.models.values()):
                    lm.last_used -= float(rng.choice([0.0, 1.0, 1000.0]))
                h.reap()
            elif op == "demote":
                h.demote(name)
            elif op == "promote":
                h.promote(name)
        except MinferdError as e:
            refusals[type(e).__name__] += 1
        check(h)
    loaded_at_end = len(h.models)
    h.unload_all()
    check(h)
    report = {"ops": n_ops, "seed": seed, "capacity_bytes": h.ledger.capacity, "models_total_bytes": total,
              "over": over, "ops_by_kind": dict(counts), "typed_refusals": dict(refusals),
              "events": dict(collections.Counter(e.split()[0] for e in h.events)),
              "loaded_at_end": loaded_at_end, "bytes_after_unload_all": h.ledger.held(),
              "seconds": round(time.perf_counter() - t0, 2)}
    if tmp:
        tmp.cleanup()
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--over", type=float, default=1.7, help="models' total / budget")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    report = run(args.ops, args.seed, args.over)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
