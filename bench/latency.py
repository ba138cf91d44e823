"""Latency of one request: time to first token by prompt length and single-stream decode, through
a real daemon and gRPC, beside llama.cpp on the same file in the same run.

    python bench/latency.py MODEL [--device auto|cpu|cuda] [--lengths 1,16,128,512,2048] [--reps 5]
        [--gen-tokens 128] [--llama-bench PATH] [--threads N] [--json OUT]

MODEL is a GGUF path or a packaged name (gemma3-270m). The daemon (minferd.spawn, a private unix
socket) loads it with ctx = the longest prompt + gen. Each TTFT sample is a streaming Generate of
fresh random token ids (nothing shared through the prefix cache), max_tokens 1, from the call to
its first event; the median of --reps after one warm-up per length. Each length is timed both ways
a client may send it, in turns: a Generate call of its own ("call") and a request on an open
Session stream ("session", what minferd.Client sends), which skips gRPC's call setup. Decode: requests of
gen-tokens after a 16-token prompt, tokens per second between the first and last token (one that
stops at an end-of-generation token before half of them is asked again).

llama.cpp's columns: with --llama-bench (the binary ../shared/device/llama_cpp.sh builds on the
device), `llama-bench -p LENGTHS -n GEN` on the same file (TTFT = length / its prefill rate, which
excludes the sampling and the transport minferd's figure includes); without it, on the CPU,
llama-cpp-python in this process: the wall time of eval() of the same prompt lengths, and of
gen-tokens single-token evals, with the same thread count as the daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

import serve  # noqa: E402  (bench/serve.py: its channel and streaming Generate)
from minferd._proto import pb2, pb2_grpc  # noqa: E402
from minferd.client_session import Session  # noqa: E402
from minferd.client_socket import SocketSession  # noqa: E402
from minferd.unix_socket import session_path, unix_path  # noqa: E402
from minferd.config import KV_BLOCK_TOKENS  # noqa: E402


def minferd_side(model: Path, args, lengths: list[int], rand) -> dict:
    from minferd.spawn import log_tail, start_daemon, stop_daemon
    ctx = -(-(max(lengths) + args.gen_tokens) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    tmp = tempfile.TemporaryDirectory(prefix="minferd-lat-", dir="/tmp")
    serve_args = ["--models-dir", str(model.parent), "--device", args.device, "--drain-seconds", "5"]
    if args.threads:
        serve_args += ["--threads", str(args.threads)]
    daemon = start_daemon(Path(tmp.name), serve_args)
    ch = serve.channel(daemon["address"])
    try:
        stub = pb2_grpc.MinferdStub(ch)
        list(stub.LoadModel(pb2.LoadModelRequest(name=serve.MODEL_NAME, path=model.name, ctx=ctx, pinned=True,
                                                 keep_alive_seconds=-1.0), timeout=600))
        # Each rep times a Generate call, a request on a gRPC Session and one on the session socket
        # (minferd.Client's way), in turns.
        ways = {"": None, "session_": Session(stub, pb2, ())}
        try:  # none where MINFERD_SESSION_SOCKET=0: its columns print nan
            ways["socket_"] = SocketSession(session_path(unix_path(daemon["address"])), pb2, None)
        except OSError:
            pass
        ttft = {}
        for n in lengths:
            got = {w: ([], []) for w in ways}
            for rep in range(args.reps + 1):  # the first warms this length's shapes up (compiles, graphs)
                for w, way in ways.items():
                    ms, engine_ms = first_token_ms(stub, rand(n), args.timeout, args.ttft_max_tokens, way)
                    if rep:
                        got[w][0].append(ms)
                        got[w][1].append(engine_ms)
            # engine_ms: the daemon's own prefill_ms (request queued -> first token sampled); the
            # rest of the TTFT is the transport and the threads' hand-offs.
            ttft[n] = {}
            for w, (ms, engine_ms) in got.items():
                ttft[n].update({f"{w}median_ms": statistics.median(ms), f"{w}samples_ms": ms,
                                f"{w}engine_median_ms": statistics.median(engine_ms)})
        for way in ways.values():
            if way is not None:
                way.close()
        serve.generate(stub, rand(16), args.gen_tokens, args.timeout)  # warm-up
        rates, tries = [], 0
        while len(rates) < args.reps and tries < 10 * args.reps:
            # No ignore-EOS switch: a request that ends early (random ids) is asked again.
            t, tries = serve.generate(stub, rand(16), args.gen_tokens, args.timeout)["times"], tries + 1
            if len(t) * 2 >= args.gen_tokens:
                rates.append((len(t) - 1) / (t[-1] - t[0]))
        if not rates:
            raise RuntimeError(f"{tries} requests all ended before {args.gen_tokens // 2} tokens")
        status = stub.GetStatus(pb2.GetStatusRequest(), timeout=30)
        path = next((m.matmul_path for m in status.models if m.name == serve.MODEL_NAME), "?")
        return {"device": status.pool.device, "ctx": ctx, "matmul_path": path, "ttft": ttft,
                "decode_tok_s": statistics.median(rates),
                "decode_samples": rates}
    except BaseException:
        print(f"latency: daemon log, last lines:\n{log_tail(Path(daemon['log']))}", file=sys.stderr)
        raise
    finally:
        serve.close(ch)
        stop_daemon(daemon["pid"])
        tmp.cleanup()


def first_token_ms(stub, ids: list[int], timeout: float, max_tokens: int = 1, session=None) -> float:
    """A streaming Generate of max_tokens (1: nothing runs after the first token; more: a chat's
    stream, whose next steps start while the first token travels), as a call of its own or on
    `session`: from the call (the request's send) to its first event, which carries the sampled
    token, or says the request ended because that token ends a generation (random ids make a model
    say "end" now and then: the prefill and the sampling were done all the same)."""
    req = pb2.GenerateRequest(model=serve.MODEL_NAME, ids=pb2.TokenIds(ids=ids),
                              sampling=pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens))
    first, engine_ms = [], float("nan")

    def take(ev):
        nonlocal engine_ms
        first.append(time.perf_counter())
        if ev.HasField("timings"):
            engine_ms = ev.timings.prefill_ms
    t0 = time.perf_counter()
    if session is not None:  # a gRPC Session or the session socket's
        session.run("generate", req, take)
    else:
        for ev in stub.Generate(req, timeout=timeout):
            take(ev)
    return (first[0] - t0) * 1e3, engine_ms


def llama_bench_side(binary: str, model: Path, args, lengths: list[int]) -> dict:
    cmd = [binary, "-m", str(model), "-ngl", "99", "-fa", "1", "-p", ",".join(map(str, lengths)),
           "-n", str(args.gen_tokens), "-r", str(args.reps), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout)
    ttft, decode = {}, None
    for r in rows:
        if r["n_prompt"] and not r["n_gen"]:
            ttft[r["n_prompt"]] = {"median_ms": 1e3 * r["n_prompt"] / r["avg_ts"]}
        elif r["n_gen"] and not r["n_prompt"]:
            decode = r["avg_ts"]
    return {"how": "llama-bench " + " ".join(cmd[3:]), "build": rows[0].get("build_commit"), "ttft": ttft,
            "decode_tok_s": decode}


def llama_cpp_python_side(model: Path, args, lengths: list[int], rand) -> dict:
    import llama_cpp
    threads = args.threads or os.cpu_count()
    ctx = max(lengths) + args.gen_tokens + 16
    m = llama_cpp.Llama(str(model), n_ctx=ctx, n_batch=max(lengths), n_threads=threads, verbose=False)
    ttft = {}
    for n in lengths:
        samples = []
        for rep in range(args.reps + 1):
            ids = rand(n)
            m.reset()
            t0 = time.perf_counter()
            m.eval(ids)
            if rep:
                samples.append((time.perf_counter() - t0) * 1e3)
        ttft[n] = {"median_ms": statistics.median(samples), "samples_ms": samples}
    rates = []
    for _ in range(args.reps):
        m.reset()
        m.eval(rand(16))
        t0 = time.perf_counter()
        for tok in rand(args.gen_tokens - 1):
            m.eval([tok])
        rates.append((args.gen_tokens - 1) / (time.perf_counter() - t0))
    return {"how": f"llama-cpp-python {llama_cpp.__version__} in-process eval(), {threads} threads",
            "ttft": ttft, "decode_tok_s": statistics.median(rates)}


def table(res: dict) -> str:
    ours, ref = res["minferd"], res.get("llama")
    lines = [f"minferd latency: {res['model']} on {ours['device']} (ctx {ours['ctx']}, the pool's plan: "
             f"{ours.get('matmul_path', '?')}), medians of {res['reps']}",
             f"llama.cpp: {ref['how'] if ref else 'not run'}",
             f"{'prompt':>8} {'llama ms':>10} " + " ".join(
                 f"{w + ' ms':>10} {'engine ms':>10} {'ratio':>7}" for w in ("call", "session", "socket"))]
    nan = float("nan")
    for n, t in ours["ttft"].items():
        r = ref["ttft"].get(n) if ref else None
        r_ms = r["median_ms"] if r else nan
        cols = []
        for w in ("", "session_", "socket_"):
            ms = t.get(f"{w}median_ms", nan)
            cols.append(f"{ms:>10.2f} {t.get(f'{w}engine_median_ms', nan):>10.2f} {ms / r_ms:>7.2f}")
        lines.append(f"{n:>8} {r_ms:>10.2f} " + " ".join(cols))
    d_ref = ref["decode_tok_s"] if ref and ref["decode_tok_s"] else float("nan")
    lines.append(f"decode tg{res['gen_tokens']}: {ours['decode_tok_s']:.1f} tok/s, llama.cpp {d_ref:.1f} "
                 f"({ours['decode_tok_s'] / d_ref:.2f}x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--lengths", default="1,16,128,512,2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="the daemon's (and llama-cpp-python's) CPU threads")
    ap.add_argument("--llama-bench", default=None, help="path of llama-bench: llama.cpp's columns from it")
    ap.add_argument("--no-llama", action="store_true", help="minferd's side only")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--ttft-max-tokens", type=int, default=1, help="max_tokens of the TTFT requests")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from minferd.model.gguf_file import GGUFFile
    from minferd.model.loader import resolve_path
    model = Path(resolve_path(args.model)).resolve()
    gguf = GGUFFile(model)
    n_vocab = gguf.array_len("tokenizer.ggml.tokens")
    gguf.close()
    rng = np.random.default_rng(args.seed)
    rand = lambda n: rng.integers(0, n_vocab, n).tolist()  # noqa: E731
    lengths = [int(x) for x in args.lengths.split(",")]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the daemon's stop
    res = {"model": str(model), "reps": args.reps, "gen_tokens": args.gen_tokens,
           "minferd": minferd_side(model, args, lengths, rand)}
    if args.llama_bench:
        res["llama"] = llama_bench_side(args.llama_bench, model, args, lengths)
    elif not args.no_llama and res["minferd"]["device"] == "cpu":
        res["llama"] = llama_cpp_python_side(model, args, lengths, rand)
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
