"""The model files a daemon may load (`ListAvailable`, `minferctl ls`, the HTTP front's
/v1/models): each .gguf of --models-dir by stem, read from its header alone, with what a load
with the defaults would take and whether it fits now. A file that is refused says why and
stops nothing else."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from minferd.config import DEFAULT_CTX, MAX_LISTED_FILES
from minferd.errors import MinferdError, NotFound, excerpt
from minferd.model.loader import check_backend, open_model_file
from minferd.paths import open_model_source
from minferd.pool.estimator import estimate
from minferd.pool.planner import plan


def model_files(models_dirs) -> dict[str, Path]:
    """Stem -> file, the first directory winning a stem, at most MAX_LISTED_FILES."""
    found: dict[str, Path] = {}
    for d in models_dirs:
        for p in sorted(Path(d).glob("*.gguf")):
            if len(found) >= MAX_LISTED_FILES:
                return found
            found.setdefault(p.stem, p)
    return found


def describe(host, models_dirs, name: str, path: Path) -> dict:
    out = {"name": name, "path": str(path), "loaded": host.has_model(name)}
    try:
        out["file_bytes"] = path.stat().st_size
        mf = open_model_file(open_model_source(path.name, models_dirs))
    except (MinferdError, OSError) as e:
        return {**out, "error": str(e)[:300]}
    from minferd.fleet import Fleet
    if isinstance(host, Fleet):  # the plan where placement would look first: the most free device
        host = host.roomiest()
    try:
        check_backend(mf, host.traits.kind)  # a load would be refused here (an arch or tensor type): say so
        ctx = min(mf.spec.ctx_train, DEFAULT_CTX)
        p = plan(estimate(mf, host.traits, ctx, host.default_parallel * ctx), host.traits, host.ledger.free(),
                 None, host.w16_min_bytes)
        return {**out, "architecture": mf.spec.arch, "plan": p.matmul_path.value, "plan_reason": p.reason,
                "type_mix": dict(Counter(t.qtype.name for t, _ in mf.tensors.values())), "bytes": p.bytes,
                "fits": p.total <= host.ledger.free()}
    except MinferdError as e:
        return {**out, "error": str(e)[:300]}
    finally:
        mf.close()


def ensure_loaded(host, models_dirs, name: str, keep_alive: float) -> None:
    """Load on demand, as Ollama does: a model that is not loaded but is a file of models_dirs
    (by stem, or file name) is loaded with the defaults; a name that is neither is NotFound. Two
    requests for one such name share the load (the host waits on a twin load)."""
    if host.has_model(name):
        return
    path = model_files(models_dirs).get(name.removesuffix(".gguf"))
    if path is None:
        raise NotFound(f"no model named {excerpt(name)} is loaded or in the models directories")
    from minferd.host_load import LoadOptions
    host.load(name, open_model_source(path.name, models_dirs), LoadOptions(keep_alive=keep_alive))


def available(host, models_dirs) -> list[dict]:
    return [describe(host, models_dirs, n, p) for n, p in sorted(model_files(models_dirs).items())]
