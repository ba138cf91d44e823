"""Threads that compute (a model's worker, the CPU backend's pool) run at a lower scheduling
priority than the ones that answer (gRPC, the serve loop): on a machine whose cores the models
keep busy, status and health still answer within milliseconds. On 2 cores under 64 clients
(bench/load.py) GetStatus p99 went from 30 ms to 14-21 ms, generation throughput unchanged."""
from __future__ import annotations

import os
import threading

from minferd.config import COMPUTE_NICE


def lower_this_thread() -> None:
    """Add COMPUTE_NICE to the calling thread's nice value (Linux: per thread; elsewhere a no-op)."""
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + COMPUTE_NICE))
    except (AttributeError, OSError):  # no per-thread priorities here, or not allowed
        pass
