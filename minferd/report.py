"""What status shows (GetStatus, ListModels, minferctl status, metrics): the pool's totals and each
loaded model's plan, footprint by kind and use, read from one ledger snapshot, never changed."""
from __future__ import annotations

import time

from minferd.devices import MatmulPath
from minferd.loaded import LoadedModel
from minferd.model.arch.llama import EXPERTS
from minferd.pool.ledger import LedgerView


def pool_info(snap: LedgerView, device: str, w16_min_bytes: int, allocated: int, loading=(), unloading=()) -> dict:
    return {"device": device, "capacity_bytes": snap.capacity, "used_bytes": snap.held(),
            "reserved_bytes": snap.committed() - snap.held(), "free_bytes": snap.free(),
            "w16_min_bytes": w16_min_bytes, "allocated_bytes": allocated,
            "loading": sorted(loading), "unloading": sorted(unloading)}


def pools_total(pools: list[dict]) -> dict:
    """Several devices' pools as one (their sums; the devices' names joined): one device's is itself."""
    if len(pools) == 1:
        return pools[0]
    total = {k: sum(p[k] for p in pools) for k in ("capacity_bytes", "used_bytes", "reserved_bytes", "free_bytes",
                                                     "allocated_bytes")}
    return {**total, "device": ",".join(p["device"] for p in pools), "w16_min_bytes": pools[0]["w16_min_bytes"],
            "loading": sorted(n for p in pools for n in p["loading"]),
            "unloading": sorted(n for p in pools for n in p["unloading"])}


def model_bytes(lm: LoadedModel, snap: LedgerView) -> dict[str, int]:
    """Weights and the f16 copy belong to the file's weight set (shared), kv and scratch to the model."""
    own, shared = snap.by_kind(lm.name), snap.by_kind(lm.ws.tag)
    return {"weights": shared["weights"], "w16": shared["w16"], "kv": own["kv"], "scratch": own["scratch"]}


def model_info(lm: LoadedModel, traits, snap: LedgerView, device: str = "") -> dict:
    ws, now = lm.ws, time.monotonic()
    nbytes = model_bytes(lm, snap)
    path = ws.current_path(traits, nbytes["w16"])
    if path == ws.plan.matmul_path:
        reason = ws.plan.reason
    elif path == MatmulPath.W16:
        reason = f"promoted to w16 once the f16 copy fit (planned {ws.plan.matmul_path.value}: {ws.plan.reason})"
    else:
        reason = f"demoted to {path.value} under memory pressure (planned w16: {ws.plan.reason})"
    left = -1.0 if lm.keep_alive < 0 else max(lm.keep_alive - (now - lm.last_used), 0.0)
    return {"name": lm.name, "path": str(ws.file.path), "architecture": ws.file.spec.arch,
            "type_mix": ws.type_mix, "matmul_path": path.value,
            "planned_matmul_path": ws.plan.matmul_path.value, "reason": reason,
            "bytes": nbytes, "ctx": lm.ctx, "pinned": lm.pinned, "keep_alive_seconds": lm.keep_alive,
            "keep_alive_left_seconds": left, "last_used_unix": time.time() - (now - lm.last_used),
            "loaded_unix": lm.loaded_at, "requests": lm.requests, "tokens_generated": lm.tokens,
            "shared_with": [u.name for u in ws.users if u is not lm], "busy": lm.busy,
            "waiting_for_w16": ws.waiting_for_w16(), "weight_set": ws.id, "engine": engine_info(lm),
            "device": device, "classes": tensor_classes(ws.file, nbytes["w16"])}


def tensor_classes(mf, w16_bytes: int) -> list[dict]:
    """A mixture of experts' weights by class, and the f16 copy each holds (w16_bytes: the model's
    copy, which covers the dense class only: a decode token reads a few experts, and nothing runs
    them from a copy yet). Empty for a dense model."""
    if not mf.spec.n_expert:  # a dense model (status asks per model per call: no walk of its tensors)
        return []
    experts = sum(t.n_bytes for t, role in mf.tensors.values() if role == EXPERTS)
    return [{"name": "dense", "quantized_bytes": mf.matmul_bytes(), "f16_copy_bytes": w16_bytes, "note": ""},
            {"name": "experts", "quantized_bytes": experts, "f16_copy_bytes": 0,
             "note": f"{mf.spec.n_expert_used} of {mf.spec.n_expert} run per token"}]


def engine_info(lm: LoadedModel) -> dict:
    c = lm.worker.counts()
    return {**c, "kv_tokens": c["blocks_total"] * c["block_size"]}

