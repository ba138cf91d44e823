"""`minferd plan`: the dry run before a load. The estimate by kind, the plan and its reason, and
whether it fits, from the GGUF header alone; nothing is allocated and no GPU is needed when the
budget is given in bytes."""
from __future__ import annotations

import json
import sys

from minferd.devices import MatmulPath, cpu_traits, cuda_traits
from minferd.errors import InvalidRequest
from minferd.model.loader import check_backend, open_model_file, resolve_path
from minferd.pool.budget import measure_device, parse_budget, resolve_budget
from minferd.pool.estimator import estimate
from minferd.config import DEFAULT_PARALLEL, W16_MIN_BYTES
from minferd.host_load import LoadOptions
from minferd.report import tensor_classes
from minferd.pool.planner import plan
from minferd.units import fmt_bytes


def dry_run(model: str, device: str = "cpu", ctx: int | None = None, budget: str | None = None,
            matmul_path: str = "auto", w16_min_bytes: int = W16_MIN_BYTES, threads: int | None = None,
            parallel: int | None = None, kv_tokens: int | None = None) -> dict:
    mf = open_model_file(resolve_path(model))
    check_backend(mf, device)  # a load there would be refused: so is its plan
    ctx = ctx or min(mf.spec.ctx_train, 4096)
    if not 1 <= ctx <= mf.spec.ctx_train:
        raise InvalidRequest(f"ctx {ctx} is outside [1, {mf.spec.ctx_train}] (the model's training context)")
    kind = "cpu" if device == "cpu" else "cuda"
    traits = cpu_traits(threads or 1) if kind == "cpu" else cuda_traits()
    spec = parse_budget(budget) if budget is not None else None
    if spec is not None and spec.nbytes is not None:
        # A byte budget is the pool's capacity as asked: no device needs to be present.
        capacity, total = spec.nbytes, None
    else:
        try:
            total, others = measure_device(device)
        except Exception as e:  # no GPU here: say how to plan without one
            raise InvalidRequest(f"cannot measure {device} ({type(e).__name__}); give --budget in bytes, e.g. 80GiB") from None
        b = resolve_budget(device, spec, total, others)
        capacity = b.capacity
    requested = None if matmul_path == "auto" else MatmulPath(matmul_path)
    kv_tokens = LoadOptions(parallel=parallel, kv_tokens=kv_tokens).kv_size(ctx, DEFAULT_PARALLEL)
    est = estimate(mf, traits, ctx, kv_tokens)
    p = plan(est, traits, capacity, requested, w16_min_bytes)
    return {"model": str(mf.path), "architecture": mf.spec.arch, "device": device, "ctx": ctx, "kv_tokens": kv_tokens,
            "fits": p.total <= capacity, "plan": {"matmul_path": p.matmul_path.value, "reason": p.reason},
            "bytes": p.bytes, "total_bytes": p.total, "budget_bytes": capacity, "device_total_bytes": total,
            "w16_option_bytes": est.w16, "quantized_matmul_bytes": est.matmul_bytes, "classes": _classes(mf, p)}


def _classes(mf, p) -> dict | None:
    """report.tensor_classes by name (the experts never hold a copy so far)."""
    got = tensor_classes(mf, p.bytes["w16"])
    if not got:
        return None
    d, e = got
    return {"dense": {k: d[k] for k in ("quantized_bytes", "f16_copy_bytes")},
            "experts": {"quantized_bytes": e["quantized_bytes"], "f16_copy_bytes": 0,
                        "used_per_token": f"{mf.spec.n_expert_used} of {mf.spec.n_expert}"}}


def cmd_plan(args) -> int:
    res = dry_run(args.model, args.device, args.ctx, args.budget, args.matmul_path, args.w16_min_bytes, args.threads,
                  args.parallel, args.kv_tokens)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{res['model']} ({res['architecture']}, ctx {res['ctx']}, KV for {res['kv_tokens']} tokens) "
              f"on {res['device']}")
        print(f"  plan: {res['plan']['matmul_path']} - {res['plan']['reason']}")
        for kind, n in res["bytes"].items():
            print(f"  {kind:8s} {fmt_bytes(n):>12s}")
        print(f"  {'total':8s} {fmt_bytes(res['total_bytes']):>12s} of a {fmt_bytes(res['budget_bytes'])} budget")
        if c := res["classes"]:
            d, e = c["dense"], c["experts"]
            copy = f"the dense {fmt_bytes(d['quantized_bytes'])} only" if d["f16_copy_bytes"] else "none"
            print(f"  f16 copy: {copy}; the experts' {fmt_bytes(e['quantized_bytes'])} stay quantized "
                  f"({e['used_per_token']} run per token)")
    if not res["fits"]:
        short = res["total_bytes"] - res["budget_bytes"]
        print(f"minferd plan: does not fit: needs {fmt_bytes(res['total_bytes'])}, the budget is "
              f"{fmt_bytes(res['budget_bytes'])} ({fmt_bytes(short)} short)", file=sys.stderr)
        return 1
    return 0
