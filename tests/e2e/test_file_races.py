"""Model files that change under a real `minferd serve`: truncated while it loads them, swapped for
a link to a file outside --models-dir while it opens them, and paths built to make it work hard.
Each is a typed refusal (or the checked file, loaded whole); the daemon serves on, holding nothing."""
import os
import shutil
import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

C = grpc.StatusCode
# Big enough that uploading it takes a while on the CPU (214 MiB, ~0.3 s): a truncation lands mid-load.
BIG = {"hidden": 1024, "heads": 16, "ffn": 16384, "layers": 4}


@pytest.fixture(scope="module")
def files(tmp_path_factory, synth_model):
    top = tmp_path_factory.mktemp("races")
    models, outside = top / "models", top / "outside"
    models.mkdir()
    outside.mkdir()
    pristine = top / "big-pristine.gguf"
    write_model(pristine, "qwen2", "tiny", "q8_0", seed=1, random_blocks_=True, overrides=BIG)
    shutil.copy(synth_model("qwen2", "q8_0"), models / "inside.gguf")
    shutil.copy(synth_model("llama", "q8_0"), outside / "secret.gguf")
    return SimpleNamespace(models=models, outside=outside, pristine=pristine)


def start(tmp_path_factory, files, **env):
    return Daemon(tmp_path_factory.mktemp("races-daemon"), "--models-dir", files.models, "--budget", "1GiB",
                  "--threads", "1", env=env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, files):
    d = start(tmp_path_factory, files)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def slow_daemon(tmp_path_factory, files):
    """One that waits 20 ms after each tensor it uploads (~1 s a load of big.gguf): the client's
    truncation lands mid-load however busy the machine. Without it a loaded CI runner's client saw
    the progress event after the daemon had read everything, and the load succeeded."""
    d = start(tmp_path_factory, files, MINFERD_LOAD_PAUSE_S="0.02")
    yield d
    assert d.stop() == 0


@pytest.fixture(autouse=True)
def unload_after(request):
    """A test that fails leaves nothing loaded for the next (one flake failed nine tests)."""
    yield
    for name in ("daemon", "slow_daemon"):
        if name in request.fixturenames:
            d = request.getfixturevalue(name)
            if d.proc.poll() is None:
                for m in d.status().models:
                    d.stub().UnloadModel(pb2.UnloadModelRequest(name=m.name))


def assert_serving_and_empty(daemon):
    assert daemon.proc.poll() is None, f"the daemon died ({daemon.proc.returncode}): {daemon.log.read_text()[-2000:]}"
    st = daemon.status()
    assert not st.models and st.pool.used_bytes == 0 and st.pool.reserved_bytes == 0, st.pool


def load_truncating(stub, big, when, new_size):
    """Load big.gguf, truncating it to new_size at the first progress event `when` accepts.
    Returns the status code of the refusal (None where it loaded) and its message."""
    call = stub.LoadModel(pb2.LoadModelRequest(name="big", path=big.name, ctx=64), timeout=120)
    done = False
    try:
        for ev in call:
            if not done and when(ev):
                os.truncate(big, new_size)
                done = True
    except grpc.RpcError as e:
        return e.code(), e.details()
    return None, ""


MOMENTS = {  # progress event -> the truncation happens as soon as the client sees it
    "planning": lambda ev: ev.phase == "planning",
    "first-weights": lambda ev: ev.phase == "weights",
    "half-weights": lambda ev: ev.phase == "weights" and ev.bytes_done * 2 >= ev.bytes_total,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("keep", [0, 0.5, 0.999])
def test_truncated_while_loading_is_refused(slow_daemon, files, moment, keep):
    """The daemon read tensor bytes through np.memmap: touching a page past the new end was SIGBUS
    (exit -7). Now a short pread, or the size differing from the one opened, is INVALID_ARGUMENT."""
    big = files.models / "big.gguf"
    shutil.copyfile(files.pristine, big)
    size = big.stat().st_size
    code, msg = load_truncating(slow_daemon.stub(), big, MOMENTS[moment], int(size * keep))
    assert code == C.INVALID_ARGUMENT, (code, msg)
    assert "big.gguf" in msg and "changed while loading" in msg, msg
    assert_serving_and_empty(slow_daemon)


def test_truncated_from_a_thread_at_random_moments(daemon, files):
    """The same from a timer thread at moments the client does not see: each load is refused or,
    where the truncation came after it, loaded whole; never a crash, never bytes left behind."""
    big = files.models / "big.gguf"
    stub = daemon.stub()
    outcomes = []
    for delay in (0.0, 0.02, 0.05, 0.1, 0.15, 0.25, 0.4):
        shutil.copyfile(files.pristine, big)
        timer = threading.Timer(delay, os.truncate, (big, big.stat().st_size // 3))
        call = stub.LoadModel(pb2.LoadModelRequest(name="big", path=big.name, ctx=64), timeout=120)
        timer.start()
        try:
            list(call)
            outcomes.append("loaded")
            stub.UnloadModel(pb2.UnloadModelRequest(name="big"))
        except grpc.RpcError as e:
            assert e.code() == C.INVALID_ARGUMENT and "big.gguf" in e.details(), (delay, e.code(), e.details())
            outcomes.append("refused")
        timer.join()
        assert_serving_and_empty(daemon)
    assert "refused" in outcomes, outcomes
    # The next good load works.
    shutil.copyfile(files.pristine, big)
    assert list(stub.LoadModel(pb2.LoadModelRequest(name="big", path=big.name, ctx=64)))[-1].phase == "ready"
    stub.UnloadModel(pb2.UnloadModelRequest(name="big"))
    assert_serving_and_empty(daemon)


def test_a_link_swapped_in_never_loads_the_outside_file(daemon, files):
    """models/x.gguf flips between a regular file (qwen2) and a link to a file outside (llama).
    The path was checked with realpath and opened again by name later: the outside file loaded
    under the inside name, and some swaps surfaced INTERNAL (OSError errno 22)."""
    x, tmp = files.models / "x.gguf", files.models / ".swap"
    real_x = os.path.realpath(x)
    stop = threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            for make in (lambda: os.link(files.models / "inside.gguf", tmp),
                         lambda: os.symlink(files.outside / "secret.gguf", tmp)):
                make()
                if i % 4 == 3:  # now and then not atomically: a moment with no x.gguf at all
                    x.unlink(missing_ok=True)
                os.replace(tmp, x)
            i += 1

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    stub = daemon.stub()
    outcomes = {}
    try:
        for _ in range(300):
            try:
                info = list(stub.LoadModel(pb2.LoadModelRequest(name="x", path="x.gguf", ctx=64), timeout=60))[-1].model
            except grpc.RpcError as e:
                assert e.code() in (C.PERMISSION_DENIED, C.NOT_FOUND, C.INVALID_ARGUMENT), (e.code(), e.details())
                outcomes[e.code().name] = outcomes.get(e.code().name, 0) + 1
                continue
            assert (info.architecture, info.path) == ("qwen2", real_x), info
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
            stub.UnloadModel(pb2.UnloadModelRequest(name="x"))
    finally:
        stop.set()
        swapper.join()
    assert outcomes.get("loaded"), outcomes
    assert_serving_and_empty(daemon)


@pytest.mark.parametrize("path", ["a/" * 300_000 + "x.gguf", "b" * 100_000, "c/" * 1000 + "x.gguf"],
                         ids=["300k-components", "100KB-component", "1000-components"])
def test_amplifying_paths_are_refused_at_once(daemon, path):
    """realpath of 300,000 components pinned a CPU (its cost is quadratic) and the refusal echoed
    the whole path; now the path is bounded before any work and the message echoes an excerpt."""
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        list(daemon.stub().LoadModel(pb2.LoadModelRequest(name="p", path=path), timeout=10))
    assert time.monotonic() - t0 < 0.5
    assert e.value.code() == C.INVALID_ARGUMENT, e.value.code()
    assert len(e.value.details()) < 300, len(e.value.details())
    assert_serving_and_empty(daemon)


def open_fds(pid) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_refusals_keep_no_descriptor(daemon, files):
    """Every refusal while opening a file closes what it opened (the file is opened once, by the
    daemon, and read through that descriptor)."""
    m = files.models
    (m / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    shutil.copyfile(files.pristine, m / "cut.gguf")
    os.truncate(m / "cut.gguf", 4 << 20)
    (m / "dir.gguf").mkdir(exist_ok=True)
    if not (m / "fifo.gguf").exists():
        os.mkfifo(m / "fifo.gguf")
    if not (m / "out.gguf").exists():
        (m / "out.gguf").symlink_to(files.outside / "secret.gguf")
    stub = daemon.stub()  # one channel: its connection is one descriptor, counted in both counts
    paths = ["bad.gguf", "cut.gguf", "dir.gguf", "fifo", "out.gguf", "missing.gguf", str(files.outside / "secret.gguf"),
             f"{m}/../outside/secret.gguf", "x" * 300, "a/" * 5000]

    def refuse_all():
        for p in paths:
            with pytest.raises(grpc.RpcError) as e:
                list(stub.LoadModel(pb2.LoadModelRequest(name="r", path=p, ctx=64), timeout=30))
            assert e.value.code() != C.INTERNAL, (p, e.value.details())

    refuse_all()  # the first round may open what the server keeps (threads, channels)
    before = open_fds(daemon.proc.pid)
    for _ in range(3):
        refuse_all()
    assert open_fds(daemon.proc.pid) == before
    assert_serving_and_empty(daemon)
