"""The `minferd` command line as a user runs it: a real process, real files, exit codes and JSON."""
import json
import subprocess
import sys

import pytest

from minferd.model.gguf_file import GGUFFile


def minferd(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "minferd.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {p.stderr}")
    return p


def test_synth_writes_llama_cpp_type_mix(tmp_path):
    out = tmp_path / "m.gguf"
    res = json.loads(minferd("synth", "--arch", "qwen2", "--preset", "tiny", "--quant", "q4_k_m", out, "--json").stdout)
    types = res["tensors"]
    assert types["token_embd.weight"] == "Q6_K" and types["blk.0.attn_q.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q4_K" and types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_norm.weight"] == "F32"  # tied output: the embedding gets Q6_K
    assert GGUFFile(out).tensors["blk.1.attn_v.weight"].qtype.name == "Q6_K"


def test_q4_k_m_layers_match_llama_cpp():
    """Qwen2.5-7B's 28 layers: Q6_K attn_v/ffn_down in layers 0-2, 5, 8, ..., 23, 24-27 (ANCHORS.md)."""
    from minferd.model.synth import tensor_type
    six = [i for i in range(28) if tensor_type(f"blk.{i}.attn_v.weight", "matmul", "q4_k_m", 28, 3584, False).name == "Q6_K"]
    assert six == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert tensor_type("token_embd.weight", "embed", "q4_k_m", 28, 3584, False).name == "Q4_K"
    assert tensor_type("output.weight", "matmul", "q4_k_m", 28, 3584, False).name == "Q6_K"
    assert tensor_type("blk.0.attn_q.weight", "matmul", "q4_k_m", 18, 640, True).name == "Q5_0"  # 640 % 256


def test_synth_random_blocks(tmp_path):
    out = tmp_path / "r.gguf"
    minferd("synth", "--arch", "llama", "--quant", "q5_0", "--random-blocks", out)
    assert GGUFFile(out).tensors["blk.1.ffn_up.weight"].qtype.name == "Q5_0"


def test_run_json_prompt_ids(synth_model):
    path = synth_model("qwen3", "q8_0")
    res = json.loads(minferd("run", path, "--prompt-ids", "300,301,302", "--max-tokens", "5",
                             "--temperature", "0", "--json").stdout)
    assert res["prompt_tokens"] == 3 and 1 <= len(res["token_ids"]) <= 5
    assert set(res["timings"]) >= {"prefill_ms", "decode_ms", "prefill_tok_s", "decode_tok_s", "load_ms"}
    again = json.loads(minferd("run", path, "--prompt-ids", "300,301,302", "--max-tokens", "5",
                               "--temperature", "0", "--json").stdout)
    assert again["token_ids"] == res["token_ids"]


def test_score_json(synth_model):
    path = synth_model("gemma3", "q4_0")
    res = json.loads(minferd("score", path, "--prompt-ids", "300,301,302,303", "--top-k", "3", "--json").stdout)
    assert len(res["positions"]) == 4
    for pos in res["positions"]:
        assert len(pos["top"]) == 3
        logprobs = [lp for _, _, lp in pos["top"]]
        assert logprobs == sorted(logprobs, reverse=True) and all(lp <= 0 for lp in logprobs)
    assert res["perplexity"] > 1


def test_real_model_writes_text(gemma_path):
    p = minferd("run", "gemma3-270m", "--prompt", "The capital of France is", "--max-tokens", "8",
                "--temperature", "0", "--json")
    res = json.loads(p.stdout)
    assert res["prompt_tokens"] == 6
    assert res["text"].startswith(" the capital of")  # llama.cpp's greedy continuation on this file


@pytest.mark.parametrize("args, words", [
    (["run", "/nonexistent.gguf", "--prompt", "x"], ["/nonexistent.gguf", "cannot read"]),
    (["run", "{bad}", "--prompt", "x"], ["{bad}", "bad magic"]),
    (["run", "{good}", "--prompt-ids", "1,x"], ["--prompt-ids"]),
    (["run", "{good}", "--prompt-ids", "99999"], ["99999", "vocabulary"]),
    (["run", "{good}", "--prompt-ids", "5", "--temperature", "-1"], ["temperature"]),
    (["synth", "{tmp}/x.gguf", "--arch", "qwen2", "--preset", "70b"], ["no preset qwen2/70b"]),
])
def test_errors_are_one_line(synth_model, tmp_path, args, words):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTAGGUF" * 8)
    subs = {"{bad}": str(bad), "{good}": str(synth_model("llama", "q8_0")), "{tmp}": str(tmp_path)}
    args = [subs.get(a, a.replace("{tmp}", str(tmp_path))) for a in args]
    p = minferd(*args, check=False)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert subs.get(w, w) in lines[0]


def test_plan_real_gemma(gemma_path):
    out = minferd("plan", "gemma3-270m", "--ctx", "2048").stdout
    assert "plan: mmq" in out and "under the w16 gate" in out
    for kind in ("weights", "w16", "kv", "scratch", "total"):
        assert kind in out
    res = json.loads(minferd("plan", gemma_path, "--device", "cuda", "--budget", "80GiB", "--json").stdout)
    assert res["fits"] and res["plan"]["matmul_path"] == "mmq" and res["budget_bytes"] == 80 << 30
    assert set(res["bytes"]) == {"weights", "w16", "kv", "scratch"} and res["bytes"]["w16"] == 0
    forced = json.loads(minferd("plan", gemma_path, "--device", "cuda", "--budget", "80GiB", "--matmul-path", "w16",
                                "--json").stdout)
    assert forced["plan"]["matmul_path"] == "w16" and forced["bytes"]["w16"] == 2 * 100270080


def test_plan_that_does_not_fit_exits_nonzero(synth_model):
    p = minferd("plan", synth_model("qwen2", "q4_k"), "--budget", "1MiB", "--json", check=False)
    assert p.returncode == 1
    res = json.loads(p.stdout)
    assert not res["fits"] and res["total_bytes"] > res["budget_bytes"] == 1 << 20
    assert "does not fit" in p.stderr and "short" in p.stderr


def test_serve_parallel_sizes_every_load_s_kv(tmp_path, synth_model):
    """`minferd serve --parallel 3`: a load that asks for no KV size gets 3 contexts of it."""
    from tests.e2e.daemon import Daemon
    d = Daemon(tmp_path, "--device", "cpu", "--parallel", "3", "--models-dir", synth_model("qwen2").parent)
    try:
        d.load(synth_model("qwen2").name, "q", ctx=128)
        (m,) = d.status().models
        assert m.engine.kv_tokens == 3 * 128 and m.engine.block_size == 32
    finally:
        d.stop()


def test_warmup_serves_a_tiny_model_through_every_plan_and_kernel():
    """On the CPU it compiles nothing, but runs what it runs on a GPU: a host, its engine, three
    batched requests (greedy, sampled on the device, sampled on the host) per plan and kernel."""
    from minferd.warmup import RUNS
    p = minferd("warmup", "--device", "cpu")
    runs = [line for line in p.stderr.splitlines() if line.startswith("warmup: ") and line.endswith(" s")]
    assert len(runs) == len(RUNS) + 1 and "done" in runs[-1], p.stderr
    assert "chat template" not in p.stderr


def test_serve_warmup_runs_before_it_listens_and_leaves_nothing_loaded(tmp_path):
    from tests.e2e.daemon import Daemon
    d = Daemon(tmp_path, "--device", "cpu", "--budget", "256MiB", "--warmup", wait=False)
    try:
        d.wait_ready(timeout=300)  # seven tiny models served one after another: ~1 min on 2 idle cores
        log = d.log.read_text()
        assert log.index("warmup: gemma3") < log.index("listening on"), log
        st = d.status()
        assert not st.models and st.pool.used_bytes == 0
    finally:
        assert d.stop() == 0
