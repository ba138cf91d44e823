"""Time GetStatus from a process of its own until a line arrives on stdin, then print the
latencies as JSON: the daemon's latency, not that of a load generator's threads contending for
their own GIL. bench/load.py and tests/e2e/test_chaos.py run it.

    python bench/status_probe.py ADDRESS EVERY_SECONDS TIMEOUT_SECONDS < stop-line
"""
import json
import sys
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from minferd._proto import pb2, pb2_grpc  # noqa: E402


def main(address: str, every: float, timeout: float) -> None:
    stub = pb2_grpc.MinferdStub(grpc.insecure_channel(address))
    stop, lat, busy, errors = threading.Event(), [], [], []
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            st = stub.GetStatus(pb2.GetStatusRequest(), timeout=timeout)
            busy.append(any(m.busy for m in st.models))
        except grpc.RpcError as e:
            errors.append(f"{e.code().name}: {(e.details() or '')[:200]}")
            busy.append(False)
        lat.append(time.monotonic() - t0)
        time.sleep(max(0.0, every - (time.monotonic() - t0)))
    print(json.dumps({"lat": lat, "busy": busy, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
