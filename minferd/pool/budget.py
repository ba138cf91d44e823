"""How many bytes the pool may hold on a device: measured capacity times a fraction, minus headroom."""
from __future__ import annotations

import re
from dataclasses import dataclass

from minferd.errors import InvalidRequest

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# The CUDA context, cuBLAS workspaces and NVRTC: memory the pool cannot see but must leave free.
DEFAULT_CUDA_HEADROOM = 1 << 30
DEFAULT_CPU_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """What the user asked: a byte count or a fraction of the device's memory."""

    nbytes: int | None = None
    fraction: float | None = None

    def describe(self) -> str:
        return f"{self.nbytes} bytes" if self.nbytes is not None else f"{self.fraction:g} of the device"


def parse_budget(text: str | int | float) -> BudgetSpec:
    """'40GiB', '512MB', '1073741824' -> bytes; '0.9' (at most 1) -> a fraction."""
    s = str(text).strip().lower().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise InvalidRequest(f"budget {text!r}: expected bytes like 40GiB / 512MB, or a fraction like 0.9")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "" and value <= 1.0:
        if value <= 0:
            raise InvalidRequest(f"budget {text!r}: a fraction must be above 0")
        return BudgetSpec(fraction=value)
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise InvalidRequest(f"budget {text!r}: must be positive")
    return BudgetSpec(nbytes=n)


@dataclass(frozen=True, slots=True)
class Budget:
    device: str  # "cpu" or "cuda:N"
    total: int  # the device's memory
    capacity: int  # what the pool may hold
    headroom: int
    asked: int | None = None  # the bytes asked for where more than the device leaves (then clamped)

    def describe(self) -> str:
        return f"{self.device}: capacity {self.capacity / 2**30:.2f} GiB of {self.total / 2**30:.2f} GiB"


def resolve_budget(device: str, spec: BudgetSpec | None, total: int, others: int = 0,
                   headroom: int | None = None) -> Budget:
    """capacity = (explicit bytes, or fraction x total) - headroom, and never more than what
    other processes leave (total - others - headroom)."""
    if headroom is None:
        headroom = 0 if device == "cpu" else DEFAULT_CUDA_HEADROOM
    if spec is None:
        spec = BudgetSpec(fraction=DEFAULT_CPU_FRACTION if device == "cpu" else 0.9)
    asked = spec.nbytes if spec.nbytes is not None else int(spec.fraction * total) - headroom
    capacity = min(asked, total - others - headroom)
    if capacity <= 0:
        raise InvalidRequest(f"budget {spec.describe()} leaves nothing on {device} "
                             f"({total} bytes, {others} used by others, {headroom} headroom)")
    return Budget(device, total, capacity, headroom, asked if asked > capacity else None)


def measure_device(device: str) -> tuple[int, int]:
    """(total bytes, bytes used by other processes) of a device."""
    if device == "cpu":
        import psutil
        vm = psutil.virtual_memory()
        return vm.total, vm.total - vm.available
    index = int(device.partition(":")[2] or 0)
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        info = pynvml.nvmlDeviceGetMemoryInfo(h)
        return int(info.total), int(info.used)
    except Exception:  # no NVML (a container without it): ask the CUDA runtime
        import cupy
        with cupy.cuda.Device(index):
            free, total = cupy.cuda.runtime.memGetInfo()
        return int(total), int(total - free)
