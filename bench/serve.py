"""Serving throughput of the batching engine, through a real daemon and gRPC.

    python bench/serve.py MODEL.gguf [--device auto|cpu|cuda] [--clients 1,4,16,64] [--prompt-tokens 512]
        [--gen-tokens 128] [--ctx N] [--kv-tokens N] [--shared-prefix P] [--json OUT] [--address ADDR]

Without --address it starts `minferd serve` on a private unix socket (minferd.spawn, as
bench/load.py does) with --models-dir the model's folder, and stops it (SIGTERM, then wait) on any
exit. The model is loaded once: ctx = the longest prompt + gen rounded up to a KV block, kv_tokens =
max(clients) * ctx, so no round needs to preempt unless --kv-tokens says less.

A round of N clients: N threads, one channel (its own connection) each, released together by a
barrier; each sends one streaming Generate of prompt-tokens random token ids (one seeded RNG, new
ids for every request: nothing is shared through the prefix cache), greedy, max_tokens =
gen-tokens. The proto has no ignore-EOS switch: a request may stop early at an end-of-generation
token, so the tokens received are counted and shown beside those asked for. A sampler thread
polls GetStatus every 50 ms for the model's engine (running, blocks_used).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from minferd._proto import pb2, pb2_grpc  # noqa: E402
from minferd.client import channel_options  # noqa: E402
from minferd.config import KV_BLOCK_TOKENS  # noqa: E402

MODEL_NAME = "serve-bench"
SUFFIX_TOKENS = 16  # the shared-prefix scenario's distinct tail per request
SHARED_GEN_TOKENS = 8  # that scenario measures TTFT: a few tokens are enough
OPEN_CHANNELS: set[grpc.Channel] = set()  # closed on any exit: that cancels their calls, so the daemon drains at once


CHANNEL_OPTIONS = channel_options()  # --grpc-channel: () (grpc's own reader thread)


def channel(address: str) -> grpc.Channel:
    # A local subchannel pool gives each client its own connection, as separate processes would have;
    # streams read on the calling thread, as minferd's Client reads them (client.channel_options).
    ch = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1), *CHANNEL_OPTIONS])
    OPEN_CHANNELS.add(ch)
    return ch


def close(ch: grpc.Channel) -> None:
    OPEN_CHANNELS.discard(ch)
    ch.close()


def generate(stub, ids: list[int], max_tokens: int, timeout: float) -> dict:
    """One streaming Generate: when it was sent, when each token arrived, and the final Timings."""
    req = pb2.GenerateRequest(model=MODEL_NAME, ids=pb2.TokenIds(ids=ids),
                              sampling=pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens))
    t_send, times, last = time.perf_counter(), [], None
    for ev in stub.Generate(req, timeout=timeout):
        if ev.token_id >= 0 and not ev.finish_reason:  # -1: a text-only flush or the closing event
            times.append(time.perf_counter())
        last = ev
    t = last.timings
    return {"t_send": t_send, "times": times, "finish_reason": last.finish_reason,
            "generated_tokens": t.generated_tokens, "cached_tokens": t.cached_tokens, "preemptions": t.preemptions}


def engine_now(stub) -> dict:
    m = next(m for m in stub.GetStatus(pb2.GetStatusRequest(), timeout=30).models if m.name == MODEL_NAME)
    return {f.name: getattr(m.engine, f.name) for f in m.engine.DESCRIPTOR.fields}


def sample_engine(stub, stop: threading.Event, seen: dict) -> None:
    """GetStatus every 50 ms until stop: the maxima of the engine's figures while a round runs."""
    while True:
        try:
            e = engine_now(stub)
        except (grpc.RpcError, ValueError, StopIteration):  # ValueError: the channel closed under it (an abort)
            seen["status_errors"] += 1
        else:
            for k in ("running", "waiting", "blocks_used"):
                seen[f"max_{k}"] = max(seen[f"max_{k}"], e[k])
            seen["blocks_total"], seen["status_samples"] = e["blocks_total"], seen["status_samples"] + 1
        if stop.wait(0.05):  # asked first, then waited: a round shorter than 50 ms still gets a look
            return


def pct(xs, p) -> float:
    return float(np.percentile(xs, p)) if xs else float("nan")


def run_round(address: str, stub, prompts: list[list[int]], args) -> dict:
    n = len(prompts)
    start, results = threading.Barrier(n + 1), [None] * n

    def client(i: int):
        ch = channel(address)
        try:
            grpc.channel_ready_future(ch).result(timeout=30)  # connect before the barrier, not on the clock
            start.wait()
            results[i] = generate(pb2_grpc.MinferdStub(ch), prompts[i], args.gen_tokens, args.timeout)
        except grpc.RpcError as e:
            results[i] = {"error": f"{e.code().name}: {e.details()}"}
        except Exception as e:  # noqa: BLE001 - no connection, or a stream with no closing event
            results[i] = {"error": repr(e)}
            start.abort()  # a thread short of the barrier would leave the others waiting for ever
        finally:
            close(ch)

    seen = dict.fromkeys(("max_running", "max_waiting", "max_blocks_used", "blocks_total", "status_samples",
                          "status_errors"), 0)
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    threads.append(threading.Thread(target=sample_engine, args=(stub, stop, seen), daemon=True))
    for t in threads:
        t.start()
    start.wait()
    for t in threads[:-1]:
        t.join()
    stop.set()
    threads[-1].join()

    ok = [r for r in results if r and "error" not in r and r["times"]]
    ttft = [(r["times"][0] - r["t_send"]) * 1e3 for r in ok]
    per_req = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in ok if r["times"][-1] > r["times"][0]]
    out = {"clients": n, "requests_ok": len(ok), "errors": [r["error"] for r in results if r and "error" in r],
           "generated_tokens": sum(len(r["times"]) for r in ok), "asked_tokens": n * args.gen_tokens,
           "ttft_ms": ttft, "per_request_decode_tok_s": per_req,
           "finish_reasons": sorted({r["finish_reason"] for r in ok}),
           "preemptions": sum(r["preemptions"] for r in ok),
           # Timings' count against the token events received: a difference is a daemon bug.
           "count_mismatches": sum(r["generated_tokens"] != len(r["times"]) for r in ok),
           **seen, "engine_after": engine_now(stub)}  # nothing may stay running or hold blocks after
    if ok:
        first, last = min(r["times"][0] for r in ok), max(r["times"][-1] for r in ok)
        sent = min(r["t_send"] for r in ok)
        decode_tokens = sum(len(r["times"]) - 1 for r in ok)  # those after each request's first
        out.update(wall_s=last - sent, agg_decode_tok_s=decode_tokens / (last - first) if last > first else float("nan"),
                   total_tok_s=out["generated_tokens"] / (last - sent), ttft_p50_ms=pct(ttft, 50),
                   ttft_p99_ms=pct(ttft, 99), per_request_decode_tok_s_p50=pct(per_req, 50))
        # All of them decoding, none prefilling: from the last first token to the first last one
        # (what llama-batched-bench's S_TG times, its prompts all processed before).
        lo, hi = max(r["times"][0] for r in ok), min(r["times"][-1] for r in ok)
        inside = sum(sum(1 for t in r["times"] if lo < t <= hi) for r in ok)
        out["steady_decode_tok_s"] = inside / (hi - lo) if hi > lo else float("nan")
    return out


def shared_prefix(stub, rand, args) -> dict:
    """A, then B with A's first P tokens: B's TTFT should shrink by the prefix cache's hit."""
    prefix = rand(args.shared_prefix)
    a = generate(stub, prefix + rand(SUFFIX_TOKENS), SHARED_GEN_TOKENS, args.timeout)
    b = generate(stub, prefix + rand(SUFFIX_TOKENS), SHARED_GEN_TOKENS, args.timeout)
    ttft_a, ttft_b = ((r["times"][0] - r["t_send"]) * 1e3 for r in (a, b))
    return {"prefix_tokens": args.shared_prefix, "ttft_a_ms": ttft_a, "ttft_b_ms": ttft_b,
            "ttft_ratio_b_over_a": ttft_b / ttft_a, "cached_tokens_a": a["cached_tokens"],
            "cached_tokens_b": b["cached_tokens"],
            "cacheable_tokens": args.shared_prefix // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS}  # full blocks only


COLUMNS = (("clients", "clients"), ("agg dec tok/s", "agg_decode_tok_s"), ("steady tok/s", "steady_decode_tok_s"),
           ("total tok/s", "total_tok_s"),
           ("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"), ("req dec p50", "per_request_decode_tok_s_p50"),
           ("max run", "max_running"), ("max blocks", ("max_blocks_used", "blocks_total")),
           ("preempt", "preemptions"), ("tokens", ("generated_tokens", "asked_tokens")), ("errors", "errors"))


def cell(r: dict, key) -> str:
    if isinstance(key, tuple):
        return "/".join(str(r[k]) for k in key)
    v = r.get(key, float("nan"))
    return str(len(v)) if isinstance(v, list) else f"{v:.1f}" if isinstance(v, float) else str(v)


def table(res: dict) -> str:
    widths = [max(len(h), 9) for h, _ in COLUMNS]
    a = res["args"]
    lines = [(f"minferd serve bench: {res['model']} on {res['device']}, ctx {res['ctx']}, kv_tokens "
              f"{res['kv_tokens']}, prompt {a['prompt_tokens']}, gen {a['gen_tokens']} (TTFT in ms)"),
             " ".join(f"{h:>{w}}" for (h, _), w in zip(COLUMNS, widths))]
    for r in res["rounds"]:
        lines.append(" ".join(f"{cell(r, k):>{w}}" for (_, k), w in zip(COLUMNS, widths)))
        lines += [f"        error: {e}" for e in r["errors"][:3]]
        if r["count_mismatches"] or r["engine_after"]["running"] or r["engine_after"]["blocks_used"]:
            lines.append(f"        ANOMALY: {r['count_mismatches']} Timings/event count mismatches, "
                         f"engine after the round: {r['engine_after']}")
    if sp := res.get("shared_prefix"):
        lines.append(f"shared prefix {sp['prefix_tokens']}+{SUFFIX_TOKENS}: TTFT A {sp['ttft_a_ms']:.1f} ms, "
                     f"B {sp['ttft_b_ms']:.1f} ms (B/A {sp['ttft_ratio_b_over_a']:.2f}), B cached_tokens "
                     f"{sp['cached_tokens_b']} of {sp['cacheable_tokens']} cacheable (A {sp['cached_tokens_a']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--device", default="auto", help="the daemon this starts: auto, cpu or cuda[:N]")
    ap.add_argument("--clients", default="1,4,16,64", help="comma-separated concurrency levels")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=0, help="default: longest prompt + gen, rounded up to a KV block")
    ap.add_argument("--kv-tokens", type=int, default=0, help="default: max(clients) * ctx")
    ap.add_argument("--shared-prefix", type=int, default=0, help="P: also time the prefix-cache scenario")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--address", default=None, help="use this running daemon instead of starting one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="deadline of each call, seconds")
    ap.add_argument("--grpc-channel", action="store_true",
                    help="clients read their streams through grpc's default channel, not minferd's channel_options()")
    args = ap.parse_args(argv)
    if args.grpc_channel:
        global CHANNEL_OPTIONS
        CHANNEL_OPTIONS = ()
    clients = [int(c) for c in args.clients.split(",")]
    longest = max(args.prompt_tokens, args.shared_prefix + SUFFIX_TOKENS if args.shared_prefix else 0)
    ctx = args.ctx or -(-(longest + args.gen_tokens) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    kv_tokens = args.kv_tokens or max(clients) * ctx

    from minferd.model.gguf_file import GGUFFile
    from minferd.spawn import log_tail, start_daemon, stop_daemon
    gguf = GGUFFile(args.model)
    n_vocab = gguf.array_len("tokenizer.ggml.tokens")  # random ids must stay inside the vocabulary
    gguf.close()
    rng = np.random.default_rng(args.seed)

    def rand(n: int) -> list[int]:  # one stream for the whole run: no two prompts share a block
        return rng.integers(0, n_vocab, n).tolist()

    # SIGTERM to this script unwinds through the finally below, like Ctrl-C, so the daemon stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.TemporaryDirectory(prefix="minferd-serve-", dir="/tmp")  # short: a socket path has 108 bytes
    daemon, stub, ch, loaded = None, None, None, False
    try:
        if args.address:
            address, load_path = args.address, str(args.model.resolve())
        else:  # a short drain: on an abort the calls are cancelled first, nothing is left to finish
            daemon = start_daemon(Path(tmp.name), ["--models-dir", str(args.model.resolve().parent), "--device",
                                                   args.device, "--drain-seconds", "5"])
            address, load_path = daemon["address"], args.model.name
        ch = channel(address)
        stub = pb2_grpc.MinferdStub(ch)
        list(stub.LoadModel(pb2.LoadModelRequest(name=MODEL_NAME, path=load_path, ctx=ctx, kv_tokens=kv_tokens,
                                                 pinned=True, keep_alive_seconds=-1.0), timeout=600))
        loaded = True
        generate(stub, rand(args.prompt_tokens), args.gen_tokens, args.timeout)  # warm-up, not counted
        res = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "model": str(args.model.resolve()), "ctx": ctx, "kv_tokens": kv_tokens,
               "device": stub.GetStatus(pb2.GetStatusRequest(), timeout=30).pool.device,
               "engine_at_load": engine_now(stub), "rounds": [],
               "channels": "one per client (own connection), "
                           + ("grpc's default" if args.grpc_channel else "channel_options()")}
        for n in clients:
            res["rounds"].append(run_round(address, stub, [rand(args.prompt_tokens) for _ in range(n)], args))
        if args.shared_prefix:
            res["shared_prefix"] = shared_prefix(stub, rand, args)
    except BaseException:
        if daemon is not None:  # its log lives in the temporary folder that goes below: show it now
            print(f"serve: daemon log, last lines:\n{log_tail(Path(daemon['log']))}", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        for c in OPEN_CHANNELS - {ch}:  # clients of a round cut short: closing cancels their calls
            close(c)
        if loaded and daemon is None:  # someone else's daemon: leave it as it was
            try:
                stub.UnloadModel(pb2.UnloadModelRequest(name=MODEL_NAME), timeout=60)
            except grpc.RpcError as e:
                print(f"serve: unload failed: {e.details()}", file=sys.stderr)
        if ch is not None:
            close(ch)
        if daemon is not None:
            stop_daemon(daemon["pid"])
        tmp.cleanup()
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    bad = any(r["errors"] or r["count_mismatches"] or r["engine_after"]["blocks_used"] for r in res["rounds"])
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the daemon is already stopped: no traceback for a Ctrl-C
        sys.exit(130)
    except grpc.RpcError as e:  # a refused load (ctx past the model's, no room): one line, as minferctl says it
        print(f"serve: {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(2)
