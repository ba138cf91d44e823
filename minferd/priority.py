"""Threads that compute (a model's worker, the CPU backend's pool) run at a lower scheduling
priority than the ones that answer (gRPC, the serve loop): on a machine whose cores the models
keep busy, status and health still answer within milliseconds. On 2 cores under 64 clients
(bench/load.py) GetStatus p99 went from 30 ms to 14-21 ms, generation throughput unchanged.

Nice +5, not +19: a nice value counts against every process in the same scheduling group (one
autogroup: a shell session, a CI job; one cgroup), not only the daemon's own threads. A daemon
started beside a test suite's workers, at +19, got ~1% of a core against three busy processes:
40 tokens of gemma3-270m took past the 30 s drain (s31, tests/e2e/test_server.py's SIGTERM test
failed 3 runs of 6 this way; +10 took 32 s, +5 4.9 s). And a thread preempted while it holds the
GIL stalls every other one until it runs again, sooner at +5: tests/e2e/test_chaos.py beside one
busy process, GetStatus p99 171-201 ms at +19, 74-78 at +5. Inside the daemon +5 still puts answers
first: bench/load.py, 64 clients, prober GetStatus p50 / p90 1.5-1.7 / 6.8-8.6 ms at +19,
1.7-1.8 / 6.9-8.4 at +5, 5.0 / 13.4 at 0."""
from __future__ import annotations

import os
import threading

from minferd.config import COMPUTE_NICE


def renice_this_thread(delta: int) -> None:
    """Add delta to the calling thread's nice value, within -20..19 (Linux: per thread; elsewhere,
    or a raise without CAP_SYS_NICE, a no-op)."""
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, now + delta)))
    except (AttributeError, OSError):  # no per-thread priorities here, or not allowed
        pass


def lower_this_thread() -> None:
    renice_this_thread(COMPUTE_NICE)


def engine_nice(value: str | None) -> int:
    """MINFERD_ENGINE_NICE: what a device backend's engine thread adds to its nice value (unset: 0;
    it launches and waits, so it is not lowered: base.Backend.computes_on_host). Positive lowers it
    (s31, H100 host under 16 busy loops: +5 took the 7B's 1-token TTFT 8.7 -> 26.8 ms); negative
    raises it where the daemon may (CAP_SYS_NICE): the A/B of whether a woken engine thread that
    jumps the host's queue keeps decode's speed under a host load."""
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"MINFERD_ENGINE_NICE={value[:20]!r}: expected an integer (added to the nice value)") from None
