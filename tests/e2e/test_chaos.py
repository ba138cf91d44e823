"""Issue 13's chaos test: 16 clients doing random load / unload / generate / chat / demote /
promote / pin / unpin / keep-alive / status against one real `minferd serve --device cpu`, with
keep-alives of 0-2 s and clients that cancel or give up after a few milliseconds.

Throughout: every error is a typed status (ABORTED included: a request whose model was unloaded
under it), and GetStatus, timed every ~20 ms from a process of its own, answers at p99 <= 50 ms (400 ms beside another pytest worker). Every ~5 s the clients stop at a barrier (a quiet point) and, once no
model is busy and nothing is reserved, the pool must add up: used_bytes == allocated_bytes ==
the per-model bytes with each weight set counted once. At the end the daemon still serves,
unload-all leaves 0 bytes, SIGTERM exits 0 and the log holds no traceback.

MINFERD_CHAOS_SECONDS sets the length (default 60); MINFERD_CHAOS_SEED the random seed.
"""
from __future__ import annotations

import os
import signal
import subprocess

import grpc
import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.chaos_driver import FILES, OP_TIMEOUT, C, Chaos
from tests.e2e.daemon import ALONE, Daemon

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("MINFERD_CHAOS_SECONDS", "60"))
# The bar, 50 ms, is the daemon's alone on 2 cores (35-48 ms measured). Beside another
# pytest worker (pytest -n 2: half the machine is running other tests) the bar is "never stalls":
# before the control plane was redesigned GetStatus p99 was 590-670 ms here, max 1.7 s; after it,
# beside the rest of the suite, 264 and 295 ms were seen (sessions 12-13), so 250 failed CI by chance.
STATUS_P99 = 0.050 if ALONE else 0.400


@pytest.fixture(scope="module")
def chaos_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("chaos-models")
    for i, (arch, quant) in enumerate((("qwen2", "q8_0"), ("llama", "q4_k"), ("gemma3", "q5_0"))):
        write_model(d / f"{arch}.gguf", arch, "tiny", quant, seed=i + 1)
    return d



def _the_end(chaos: Chaos, problems: list) -> None:
    """After the chaos: the books balance, unload-all leaves 0 bytes, and a fresh load serves."""
    s = chaos.s
    st = chaos.settle()
    if st is not None:
        chaos.check_books(st, "the end")
    # unload-all (pinned or not), then a fresh load serves
    for m in s.ListModels(pb2.ListModelsRequest(), timeout=OP_TIMEOUT).models:
        try:
            s.UnloadModel(pb2.UnloadModelRequest(name=m.name), timeout=OP_TIMEOUT)
        except grpc.RpcError as e:
            if e.code() != C.NOT_FOUND:  # the reaper may have taken it meanwhile
                problems.append(f"unload-all: {m.name}: {e.code().name}: {e.details()}")
    st = chaos.settle()
    if st is not None and (st.models or st.pool.used_bytes or st.pool.allocated_bytes):
        problems.append(f"after unload-all: {[m.name for m in st.models]}, used {st.pool.used_bytes}, "
                        f"allocated {st.pool.allocated_bytes}")
    list(s.LoadModel(pb2.LoadModelRequest(name="final", path=FILES[0], ctx=128, keep_alive_seconds=-1),
                     timeout=OP_TIMEOUT))
    last = list(s.Generate(pb2.GenerateRequest(model="final", ids=pb2.TokenIds(ids=[300, 301]),
                                               sampling=pb2.SamplingParams(max_tokens=4)),
                           timeout=OP_TIMEOUT))[-1]
    if last.finish_reason not in ("length", "stop"):
        problems.append(f"the final generate ended {last.finish_reason!r}")
    s.UnloadModel(pb2.UnloadModelRequest(name="final"), timeout=OP_TIMEOUT)
    st = chaos.settle()
    if st is not None and (st.pool.used_bytes or st.pool.allocated_bytes or st.pool.reserved_bytes):
        problems.append(f"after the last unload: used {st.pool.used_bytes}, "
                        f"allocated {st.pool.allocated_bytes}, reserved {st.pool.reserved_bytes}")


def test_chaos(tmp_path, chaos_models):
    d = Daemon(tmp_path, "--device", "cpu", "--models-dir", chaos_models, "--threads", "1", "--budget", "16MiB",
               "--w16-min-bytes", "0", "--keep-alive", "2")
    try:
        chaos = Chaos(d, SECONDS)
        chaos.run()
        print("\n" + chaos.summary())
        problems = list(chaos.violations)
        lat = sorted(chaos.status_lat)
        p99 = lat[min(len(lat) - 1, int(0.99 * (len(lat) - 1) + 0.5))] if lat else float("inf")
        if p99 > STATUS_P99:
            problems.append(f"GetStatus p99 {p99 * 1e3:.1f} ms > {STATUS_P99 * 1e3:.0f} ms")
        if chaos.dead():
            problems.append(f"the daemon died (exit status {d.proc.returncode})")
        else:
            try:
                _the_end(chaos, problems)
            except grpc.RpcError as e:
                problems.append(f"at the end: {e.code().name}: {(e.details() or '')[:300]}")
        try:
            rc = d.stop(signal.SIGTERM, timeout=90)
            if rc != 0:
                problems.append(f"SIGTERM: exit status {rc}")
        except subprocess.TimeoutExpired:
            problems.append("SIGTERM: still running 90 s later")
        log = d.log.read_text()
        if "Traceback" in log:
            i = log.index("Traceback")
            problems.append("the daemon's log has a traceback:\n" + log[max(0, i - 300):i + 2500])
        stalls = [p for p in problems if "(a stall)" in p]
        tail = f"\nthe daemon's log, last 4000 characters:\n{log[-4000:]}" if stalls else ""
        assert not problems, f"{len(problems)} problems; the first 30:\n" + "\n".join(problems[:30]) + tail
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
