"""`minferd warmup`: compile the CUDA kernels into CuPy's disk cache before anyone waits for them.

A fresh machine (a new container, CI runner or DaemonSet node) compiled ~26 s of NVRTC inside
its first prefill. First every part of every kernel module (kernels/__init__.py: a module's
instances of one quant type or head dim) compiles, side by side in threads
(kernels/precompile.py); then a tiny synthetic model is served the daemon's way (a host, its
engine, batched sequences, sampling on the device) under each plan and each kernel past 8 rows,
in steps of more than 64 rows (eager), 9-64 (a decode graph) and at most 8 (the mat-vec
kernels), from the cache just filled: the serving path is checked end to end before SERVING.
Where the cache lives: CUPY_CACHE_DIR (default ~/.cupy/kernel_cache); an image bakes it
by running this at build time on its target GPU.
On the CPU there is nothing to compile; the same run checks the serving path end to end.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from minferd.config import ServeConfig
from minferd.devices import CUDA_GRAPH_ROWS, MatmulPath
from minferd.host import Host, LoadOptions
from minferd.model.sampler import SamplingParams
from minferd.model.synth import write_model

# (architecture, plan, kernel forced past 8 rows): every kernel module runs at least once.
RUNS = [("qwen2", MatmulPath.W16, None), ("qwen2", MatmulPath.MMQ, "mmq"), ("qwen2", MatmulPath.MMQ, "tiles"),
        ("qwen2", MatmulPath.FUSED_B, "fused_b"), ("qwen2", MatmulPath.MMQ, "small"), ("qwen2", MatmulPath.W16, "tc"),
        ("gemma3", MatmulPath.W16, None)]
# Together past the rows a decode graph takes (the eager prefill kernels), then decode steps of
# three sequences (the mat-vec kernels); then one prompt of 9-64 tokens alone (a graph replay of
# 32 rows: the small-batch kernels).
PROMPTS = (CUDA_GRAPH_ROWS + 20, 5, 17)
CTX = 512
SHORT_PROMPT = 30
SAMPLING = (SamplingParams(temperature=0, max_tokens=6),
            SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, max_tokens=6, seed=1),
            SamplingParams(temperature=1.0, top_k=0, max_tokens=6, seed=2))  # top_k 0: the host sampler


class _NotTheirs(logging.Filter):
    def filter(self, record) -> bool:
        return "carries no chat template" not in record.getMessage()


@contextlib.contextmanager
def _quiet():
    """The synthetic models' own notes (gguf's writer, "no chat template") are nothing to act on."""
    gguf, minferd, keep = logging.getLogger("gguf"), logging.getLogger("minferd"), _NotTheirs()
    level = gguf.level
    gguf.setLevel(logging.WARNING)
    minferd.addFilter(keep)
    try:
        yield
    finally:
        gguf.setLevel(level)
        minferd.removeFilter(keep)


def warm_host(host: Host, workdir: Path, say=print) -> None:
    """Every kernel part the host's device may run, compiled side by side; then the serving path
    run under each plan (on a GPU from the cache just filled; a CPU host has nothing to compile)."""
    if not host.device.startswith("cpu"):
        from minferd.kernels.precompile import compile_every_part
        compile_every_part(_device_id(host.device), say=say)
    with _quiet():
        _warm(host, workdir, say)


def _device_id(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index or 0)


def _warm(host: Host, workdir: Path, say) -> None:
    files = {}
    for arch, plan, kernel in RUNS:
        if arch not in files:
            files[arch] = workdir / f"{arch}.gguf"
            write_model(files[arch], arch, "tiny", "q4_k_m", seed=1)
        t0 = time.perf_counter()
        before = os.environ.get("MINFERD_PREFILL_KERNEL")
        if kernel:  # read when a backend is made, i.e. by the load below
            os.environ["MINFERD_PREFILL_KERNEL"] = kernel
        try:
            name = f"warmup-{arch}-{plan.value}-{kernel or 'gate'}"
            host.load(name, str(files[arch]), LoadOptions(matmul_path=plan, ctx=CTX, kv_tokens=2 * CTX, keep_alive=-1))
        finally:
            if before is None:
                os.environ.pop("MINFERD_PREFILL_KERNEL", None)
            else:
                os.environ["MINFERD_PREFILL_KERNEL"] = before
        try:
            _serve_once(host, name)
        finally:
            host.unload(name)
        say(f"warmup: {arch} {plan.value} {kernel or ''} {time.perf_counter() - t0:.1f} s".replace("  ", " "))


def _serve_once(host: Host, name: str) -> None:
    """Three requests at once (the engine batches them), one per sampling mode."""
    rng, errors = np.random.default_rng(0), []
    vocab = host.get(name).model.spec.n_vocab

    def one(n: int, params: SamplingParams):
        try:
            host.generate(name, rng.integers(0, vocab, n).tolist(), params)
        except Exception as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=a) for a in zip(PROMPTS, SAMPLING)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    one(SHORT_PROMPT, SAMPLING[0])
    if errors:
        raise errors[0]


def warmup(device: str, say=print) -> float:
    """Warm every device of `device` (as `minferd serve --device` reads it). Returns seconds."""
    from minferd.serve import build_fleet
    t0 = time.perf_counter()
    fleet = build_fleet(ServeConfig(device=device, budget="2GiB", parallel=1))
    cache = os.environ.get("CUPY_CACHE_DIR") or str(Path.home() / ".cupy" / "kernel_cache")
    with tempfile.TemporaryDirectory(prefix="minferd-warmup-") as d:
        for dev, host in fleet.hosts.items():
            say(f"warmup: {dev}" + ("" if dev.startswith("cpu") else f" (kernels into {cache})"))
            warm_host(host, Path(d), say)
    return time.perf_counter() - t0
