"""What a CUDA model holds of the host beside its kernels: its engine thread's priority (it only
launches and waits, so it is not niced: base.Backend.computes_on_host) and, loaded outside the
pool, the scratch arena it gives back on close (model/loader.LocalModel.close)."""
from __future__ import annotations

import gc
import os
import threading

import pytest

pytest.importorskip("cupy")  # and without a device, conftest marks every test here skipped

from minferd.backend.batch import Batch  # noqa: E402
from minferd.backend.cuda import CudaBackend  # noqa: E402
from minferd.backend.cuda_memory import DeviceMemory  # noqa: E402
from minferd.devices import cuda_traits  # noqa: E402
from minferd.host import Host, LoadOptions  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402


def _may_raise_a_thread() -> bool:
    """Whether this process may lower a thread's nice value (CAP_SYS_NICE), tried on a scratch thread."""
    got = []

    def attempt():
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) - 1)
            got.append(True)
        except OSError:
            got.append(False)
    t = threading.Thread(target=attempt)
    t.start()
    t.join()
    return got[0]


@pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) >= 19, reason="the process is at the lowest priority already")
@pytest.mark.parametrize("nice", [None, "5", "-1"])
def test_the_engine_thread_keeps_the_daemons_priority(synth_model, device_memory, nice, monkeypatch):
    """A CUDA engine's thread only launches and waits: it keeps the daemon's priority, where a
    niced one waits behind any host load while the GPU idles (base.Backend.computes_on_host);
    MINFERD_ENGINE_NICE=N adds N (the A/B of bench/latency.py under HOST_LOAD; a raise only
    where the process may)."""
    if nice:
        monkeypatch.setenv("MINFERD_ENGINE_NICE", nice)
    mem = device_memory(limit=4 << 30)
    h = Host(lambda **kw: CudaBackend(mem, **kw), mem, cuda_traits(), 4 << 30, w16_min_bytes=0, device="cuda:0")
    lm = h.load("m", str(synth_model("qwen2", "q4_k")), LoadOptions(ctx=128))
    h.generate("m", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2))  # its thread has started
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    want = mine + int(nice or 0)
    if want < mine and not _may_raise_a_thread():
        want = mine  # not allowed to raise it: left as it was
    assert os.getpriority(os.PRIO_PROCESS, lm.worker._thread.native_id) == want
    h.unload("m")


def load_and_run(path: str, graph: bool, matmul_path: str = "mmq"):
    """A local model that ran a prefill of two sequences (and, with graph, a decode graph), and its
    KV cache (bench/leak_probe.py runs it too)."""
    lm = load_local(path, matmul_path, device="cuda", ctx=256)
    m, be = lm.model, lm.model.be
    cache = m.new_cache(be.untracked(), 5 * 32)
    tables = [[0, 1], [2, 3]]
    m.forward_batch(Batch.build([(list(range(1, 20)), 0, tables[0]), (list(range(3, 30)), 0, tables[1])], 32), cache)
    if graph:
        be.to_host(be.decode(m, Batch.build([([5], 19, tables[0]), ([6], 27, tables[1])], 32, width=8), cache))
        assert be.graphs
    return lm, cache


@pytest.mark.parametrize("close", [True, False], ids=["closed", "dropped"])
def test_a_local_model_gives_its_memory_back(synth_model, close):
    """A model loaded outside the pool (tests, bench, `minferd run`) gives its scratch arena back,
    decode graphs captured or not: closed at once, as an unload does in the daemon; dropped, once
    the collector has run. (s30's H100 saw each dropped load keep its 679 MiB arena for good:
    CuPy's pools, collected in the backend's cycle, left split blocks in cycles the collector
    cannot see, and they owned the buffer; cuda_memory._Owner.)"""
    pool = DeviceMemory.local().pool
    gc.collect()
    before = pool.used_bytes()
    for graph in (False, True):
        lm, cache = load_and_run(str(synth_model("qwen2", "q4_k")), graph)
        if close:
            lm.close()
            lm.model.be.free(cache)
        del lm, cache
        gc.collect()
        # weights and the cache are the model's until it goes; the arena (~0.7 GB) is not there
        assert pool.used_bytes() - before < 64 << 20, (graph, pool.used_bytes() - before)
