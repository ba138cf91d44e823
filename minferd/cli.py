"""`minferd`: the daemon (serve) and its offline tools (plan, run, score, synth, warmup).

Every known failure prints one line naming the file and the problem on stderr and exits 2;
a traceback means a bug.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from minferd.argtypes import UINT64, TokenFlagGone, int_in, real_in
from minferd.config import GRPC_MAX_STREAMS, MAX_RUNNING_SEQS, SESSION_IDLE_SECONDS
from minferd.errors import InvalidRequest, MinferdError


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InvalidRequest(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a GGUF path, or gemma3-270m for the model that installs from PyPI")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="text, tokenized as the model's metadata says (BOS where add_bos_token)")
    g.add_argument("--prompt-ids", help="comma-separated token ids, fed exactly (no BOS added)")
    p.add_argument("--matmul-path", default="mmq", choices=["w16", "mmq", "fused_b"],
                   help="w16 keeps a dequantized copy; the others dequantize at use (default mmq)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _prompt(args, loaded) -> list[int]:
    if args.prompt_ids is not None:
        return _ids(args.prompt_ids)
    text = args.prompt
    if getattr(args, "chat", False):
        text = loaded.tokenizer.render_chat([{"role": "user", "content": text}])
    return loaded.tokenizer.encode(text, add_special=True, parse_special=True)


def cmd_synth(args) -> int:
    if args.source:
        from minferd.model.cut import cut_model
        from minferd.model.loader import resolve_path
        types = cut_model(resolve_path(args.source), args.out, args.layers, args.vocab)
        args.arch, args.preset, args.quant = "cut", f"{args.layers} layers", "as the source"
    else:
        from minferd.model.synth import write_model
        if not args.arch:
            raise InvalidRequest("--arch is required (or --from a real model)")
        types = write_model(args.out, args.arch, args.preset, args.quant, args.seed, args.random_blocks)
    if args.json:
        print(json.dumps({"path": args.out, "tensors": types}))
    else:
        mix = {}
        for t in types.values():
            mix[t] = mix.get(t, 0) + 1
        print(f"wrote {args.out}: {args.arch} {args.preset} {args.quant}, "
              + ", ".join(f"{n} {t}" for t, n in sorted(mix.items())))
    return 0


def cmd_run(args) -> int:
    from minferd.model.generate import generate
    from minferd.model.loader import load_local
    from minferd.model.sampler import SamplingParams
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed,
                            max_tokens=args.max_tokens, stop=tuple(args.stop or ()))
    loaded = load_local(args.model, args.matmul_path, args.threads, args.device, args.ctx)
    ids = _prompt(args, loaded)
    ctx = args.ctx or min(loaded.spec.ctx_train, len(ids) + args.max_tokens)
    stream = None if args.json else (lambda tok, piece: print(piece, end="", flush=True))
    res = generate(loaded.model, loaded.tokenizer, ids, params, ctx, on_piece=stream)
    res.timings["load_ms"] = loaded.load_ms
    if args.json:
        print(json.dumps({"token_ids": res.token_ids, "text": res.text, "prompt_tokens": res.prompt_tokens,
                          "finish_reason": res.finish_reason, "timings": res.timings}))
    else:
        t = res.timings
        print(f"\n[{res.prompt_tokens} prompt tokens, {len(res.token_ids)} generated ({res.finish_reason}); "
              f"prefill {t['prefill_tok_s']:.1f} tok/s, decode {t['decode_tok_s']:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_warmup(args) -> int:
    from minferd.warmup import warmup
    seconds = warmup(args.device, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"warmup: done in {seconds:.1f} s", file=sys.stderr)
    return 0


def cmd_score(args) -> int:
    from minferd.model.generate import score
    from minferd.model.loader import load_local
    loaded = load_local(args.model, args.matmul_path, args.threads, args.device)
    ids = _prompt(args, loaded)
    res = score(loaded.model, ids, args.top_k)
    if args.json:
        print(json.dumps(res))
        return 0
    tok = loaded.tokenizer
    for i, pos in enumerate(res["positions"]):
        here = tok.decode([ids[i]])
        tops = "  ".join(f"{tok.decode([t])!r} {lp:.2f}" for t, _, lp in pos["top"])
        print(f"{i:4d} {here!r:>16} -> {tops}")
    print(f"perplexity {res['perplexity']:.4f} over {len(ids) - 1} predicted tokens")
    return 0


def cmd_plan(args) -> int:
    from minferd.plan_cmd import cmd_plan as run
    return run(args)


def cmd_serve(args) -> int:
    import logging
    from minferd.config import load_config
    from minferd.serve import serve
    logging.basicConfig(level=logging.INFO, format="minferd: %(message)s")
    keys = ("listen", "models_dirs", "device", "budget", "preload", "metrics_port", "metrics_listen", "tls_cert",
            "tls_key", "tls_client_ca", "token_file", "insecure", "keep_alive", "w16_min_bytes", "threads",
            "drain_seconds", "parent_pid", "parallel", "http", "http_max_requests", "max_streams", "session_idle",
            "warmup")
    return serve(load_config({k: getattr(args, k) for k in keys}, toml_path=args.config))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="minferd", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("synth", help="write a synthetic GGUF model")
    p.add_argument("out")
    p.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "gpt-oss"])
    p.add_argument("--from", dest="source", default=None, help="cut a real model down instead (with --layers, --vocab)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--preset", default="tiny")
    from minferd.kernels.quant import CUDA_TYPES, SUPPORTED_NAMES  # the type table: no NumPy, cheap for --help
    cpu_only = ", ".join(n.lower() for n in SUPPORTED_NAMES if n not in CUDA_TYPES)
    p.add_argument("--quant", default="q8_0",
                   help=f"{', '.join(n.lower() for n in SUPPORTED_NAMES)}, or llama.cpp's q4_k_m mix (default q8_0"
                        + (f"; {cpu_only} run on the CPU backend only so far)" if cpu_only else ")"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random-blocks", action="store_true", help="random quantized blocks (fast, for perf files)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_synth)

    p = sub.add_parser("serve", help="run the daemon (gRPC)")
    p.add_argument("--config", default=None, help="a TOML file of settings (flags and MINFERD_* win)")
    p.add_argument("--listen", default=None,
                   help="unix:///abs.sock, unix:relative.sock (default in $XDG_RUNTIME_DIR, mode 0600) or host:port")
    p.add_argument("--models-dir", dest="models_dirs", action="append", default=None,
                   help="LoadModel reads files only under these (repeatable)")
    p.add_argument("--device", default=None, help="auto (every GPU, else the CPU), cpu, cuda (every GPU), or a list: cuda:0,cuda:2")
    p.add_argument("--budget", default=None, help="bytes (40GiB) or a fraction of the device (0.9)")
    p.add_argument("--preload", action="append", default=None, help="PATH[=NAME], loaded pinned at start")
    p.add_argument("--metrics-port", type=int_in(1, 65535), default=None,
                   help="serve Prometheus metrics on 127.0.0.1:PORT (/metrics; the bearer token where one is set)")
    p.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                   help="metrics on another address; one that is not loopback needs a token")
    p.add_argument("--tls-cert", default=None, help="TLS certificate (PEM) for TCP; needs a token or --tls-client-ca")
    p.add_argument("--tls-key", default=None, help="its private key (PEM)")
    p.add_argument("--tls-client-ca", default=None, metavar="FILE",
                   help="require TLS client certificates signed by this CA (PEM)")
    p.add_argument("--token", nargs="?", action=TokenFlagGone, help=argparse.SUPPRESS)
    p.add_argument("--token-file", default=None,
                   help="read the bearer token clients must send from FILE (or set MINFERD_TOKEN); "
                        "at least 16 characters: openssl rand -hex 16")
    p.add_argument("--insecure", action="store_true", default=None, help="allow plain TCP on loopback")
    p.add_argument("--keep-alive", type=real_in(-math.inf), default=None,
                   help="default seconds an idle model stays (300; 0 unloads when idle, negative keeps forever)")
    p.add_argument("--http", default=None, metavar="HOST:PORT",
                   help="also serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions)")
    p.add_argument("--warmup", action="store_true", default=None,
                   help="compile every CUDA kernel (minferd warmup) before reporting SERVING")
    p.add_argument("--http-max-requests", type=int_in(1, 1 << 16), default=None, metavar="N",
                   help="generations in progress on the HTTP front; past it 429 (default 512)")
    p.add_argument("--max-streams", type=int_in(1, GRPC_MAX_STREAMS), default=None, metavar="N",
                   help=f"Generate/Chat/Session streams open over gRPC; past it RESOURCE_EXHAUSTED (default "
                        f"{GRPC_MAX_STREAMS}: gRPC's other threads stay free for status, health and loads)")
    p.add_argument("--session-idle", type=real_in(0.1, 86400), default=None, metavar="SECONDS",
                   help=f"a Session stream waiting this long for its next request is ended (default "
                        f"{SESSION_IDLE_SECONDS:g}; it holds a stream place while it waits)")
    p.add_argument("--parallel", type=int_in(1, MAX_RUNNING_SEQS), default=None,
                   help="a load's KV holds this many full contexts unless it asks for a size (default 1)")
    p.add_argument("--w16-min-bytes", type=int_in(0, UINT64), default=None,
                   help="models with fewer quantized matmul bytes never get an f16 copy (default 2 GiB)")
    p.add_argument("--threads", type=int_in(1, 4096), default=None,
                   help="CPU threads of the cpu device (default: all cores)")
    p.add_argument("--drain-seconds", type=real_in(0), default=None,
                   help="on SIGTERM, how long in-flight requests may run on (default 30; keep it under the "
                        "supervisor's grace period)")
    p.add_argument("--parent-pid", type=int_in(1, 1 << 22), default=None, metavar="PID",
                   help="drain and exit when process PID is gone (the pytest plugin passes its own)")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("plan", help="dry run: the estimate by kind, the plan and whether it fits")
    p.add_argument("model")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--budget", default=None, help="bytes (80GiB) or a fraction of the device (0.9)")
    p.add_argument("--matmul-path", default="auto", choices=["auto", "w16", "mmq", "fused_b"])
    p.add_argument("--w16-min-bytes", type=int, default=2 << 30, help="the W16 size gate (default 2 GiB)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-streams", type=int_in(1, GRPC_MAX_STREAMS), default=None, metavar="N",
                   help=f"Generate/Chat/Session streams open over gRPC; past it RESOURCE_EXHAUSTED (default "
                        f"{GRPC_MAX_STREAMS}: gRPC's other threads stay free for status, health and loads)")
    p.add_argument("--parallel", type=int_in(1, MAX_RUNNING_SEQS), default=None,
                   help="KV for this many full contexts (default 1)")
    p.add_argument("--kv-tokens", type=int_in(1, UINT64), default=None, help="KV positions for all sequences together")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("run", help="load a model in-process on the CPU and generate")
    _add_prompt_args(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", help="a stop string (repeatable)")
    p.add_argument("--ctx", type=int, default=None, help="KV cache length (default: prompt + max tokens)")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("score", help="teacher-forced top-k next tokens at every position, and perplexity")
    _add_prompt_args(p)
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(fn=cmd_score)

    p = sub.add_parser("warmup", help="compile the CUDA kernels into CuPy's cache (CUPY_CACHE_DIR) ahead of the first request")
    p.add_argument("--device", default="auto", help="as serve's: auto, cpu, cuda, or a list cuda:0,cuda:2")
    p.set_defaults(fn=cmd_warmup)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except MinferdError as e:
        print(f"minferd {args.cmd}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. an unwritable synth output
        print(f"minferd {args.cmd}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
