"""tests/cuda run only where CuPy and a CUDA device are there; elsewhere every test here skips.

A skip raised while importing a conftest is a collection error in pytest, so the check lives
in a hook: each test module starts with `pytest.importorskip("cupy")` (never importing CuPy
where it is missing), and where CuPy imports but no device answers, every item of this folder
gets a skip mark. Helpers shared by the kernel tests live here too."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


def _no_gpu_reason() -> str | None:
    try:
        import cupy
    except ImportError as e:
        return f"CuPy missing: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device, a broken install
        return f"no CUDA device: {e}"
    return None if n > 0 else "no CUDA device"


def pytest_collection_modifyitems(config, items):
    reason = _no_gpu_reason()
    if reason is None:
        return
    mark = pytest.mark.skip(reason=reason)
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(mark)


@pytest.fixture(autouse=True)
def _give_back_device_memory():
    """bench/device.sh runs this folder in eight pytest-xdist workers on one GPU, and CuPy's pool
    keeps each worker's peak after its test ends: in session 18's full run a 4.5 GB scratch was
    refused while other workers' pools held the freed blocks of full-size 7B and 8B loads (the
    test passed alone). Past 1 GiB held, what a test freed goes back to the device. A backend's
    DeviceMemory is a pool of its own, and each one not closed kept the ones before it alive with
    their cached blocks (s27 call 1: four workers filled the 141 GB device with a few MB each in
    use), so every DeviceMemory still alive is emptied too, after the collector runs, past 1 GiB
    or with a quarter of the device left."""
    yield
    import sys
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    from minferd.backend.cuda_memory import DeviceMemory

    def pools():
        return [cupy.get_default_memory_pool()] + [m.pool for m in DeviceMemory.live()]
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
    except cupy.cuda.runtime.CUDARuntimeError:  # no device: nothing was allocated
        return
    if sum(p.total_bytes() for p in pools()) > 1 << 30 or free < total // 4:
        import gc
        gc.collect()  # before the second look: pools the collector frees need no emptying
        for p in pools():
            p.free_all_blocks()


@pytest.fixture
def device_memory():
    """device_memory(limit) -> a DeviceMemory with that hard limit, closed after the test."""
    from minferd.backend.cuda import DeviceMemory
    made = []

    def make(limit: int):
        made.append(DeviceMemory(limit=limit))
        return made[-1]
    yield make
    for m in reversed(made):
        m.close()


@pytest.fixture
def to_device():
    """to_device(host uint8 rows, offset=0) -> device copy `offset` bytes into a 256-aligned buffer."""
    return aligned_copy


def aligned_copy(host: np.ndarray, offset: int = 0):
    """A device copy of uint8 host rows placed `offset` bytes into a 256-aligned allocation,
    so a test chooses the alignment the kernel sees (a tensor that starts on an odd block)."""
    import cupy
    raw = np.ascontiguousarray(host, dtype=np.uint8)
    buf = cupy.empty(raw.nbytes + offset, cupy.uint8)
    dev = buf[offset:].reshape(raw.shape)
    dev.set(raw)
    return dev


def poisoned(shape, dtype):
    """An output filled with NaN: an element the kernel forgets to write fails the comparison."""
    import cupy
    return cupy.full(shape, np.nan, dtype)


def rel_err(out, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| of a device output against an f64 host reference; non-finite fails."""
    import cupy
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite output (an element not written?)"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def matmul_reference(qt, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ dequant(raw).T in f64: dequant_ref.py is bit-equal to gguf (test_dequant_kernels.py)."""
    from minferd.kernels.dequant_ref import dequantize
    W = dequantize(qt, raw, raw.shape[0], x.shape[1]).astype(np.float64)
    return x.astype(np.float64) @ W.T
