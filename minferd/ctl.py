"""`minferctl`: look at and drive a running minferd over gRPC.

Everything here is formatting and argument parsing around minferd.client.Client; it never
imports numpy, CuPy or the model code, and grpc only once a command runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from minferd.argtypes import INT32, UINT32, UINT64, TokenFlagGone, int_in, real_in
from minferd.client import PATHS, Client, default_address, normalize_address
from minferd.ctl_text import (ProgressBar, available_table, footprint_text, human_bytes,  # noqa: F401 (tests)
                              human_duration, keep_alive_text, plan_text, status_table)
from minferd.units import fmt_bytes


# ---- commands: each takes (client, args) and returns the exit status -----------------------
def _emit(args, obj, text: str) -> None:
    print(json.dumps(obj) if args.json else text)


def cmd_status(c: Client, args) -> int:
    st = c.status()
    _emit(args, st, status_table(st))
    return 0


def cmd_ls(c: Client, args) -> int:
    rows = c.available()
    _emit(args, rows, available_table(rows))
    return 0


def model_argument(arg: str) -> str:
    """What LoadModel gets for `minferctl load ARG`: a local file, or anything spelled as a path, as
    an absolute path from the caller's working directory (the daemon's is another one); a bare
    name that is no file here (gemma3-270m, a name under --models-dir) as it is."""
    if os.path.exists(arg) or os.sep in arg or (os.altsep and os.altsep in arg):
        return os.path.abspath(arg)
    return arg


def cmd_load(c: Client, args) -> int:
    bar = None if args.quiet else ProgressBar()
    try:
        m = c.load(model_argument(args.path), args.name, args.ctx, args.matmul_path, args.pin, args.keep_alive, bar,
                   args.parallel, args.kv_tokens, args.device)
    finally:
        if bar:
            bar.close()
    _emit(args, m, f"loaded {m['name']} ({os.path.basename(m['path'])}, {m['architecture']}): "
                   f"plan {m['matmul_path']} ({m['reason']})\n  {footprint_text(m)}")
    return 0


def cmd_unload(c: Client, args) -> int:
    freed = c.unload(args.name)
    _emit(args, {"name": args.name, "freed_bytes": freed}, f"unloaded {args.name}, freed {fmt_bytes(freed)}")
    return 0


def _stream_out(args):
    if args.json:
        return None
    return lambda piece: (sys.stdout.write(piece), sys.stdout.flush())


def _finish(args, res: dict) -> int:
    if args.json:
        print(json.dumps(res))
        return 0
    print()
    t = res["timings"]
    print(f"[{t['prompt_tokens']} prompt tokens, {t['generated_tokens']} generated ({res['finish_reason']}); "
          f"prefill {t['prefill_tok_s']:.1f} tok/s, decode {t['decode_tok_s']:.1f} tok/s]", file=sys.stderr)
    return 0


def _sampling(args) -> dict:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
            "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repeat_penalty": args.repeat_penalty, "stop": args.stop or None}


def cmd_generate(c: Client, args) -> int:
    if (args.prompt is None) == (args.prompt_ids is None):
        print("minferctl generate: give a PROMPT or --prompt-ids (one of them)", file=sys.stderr)
        return 2
    prompt = args.prompt if args.prompt_ids is None else args.prompt_ids
    add_special = False if args.no_special else None
    return _finish(args, c.generate(args.name, prompt, _stream_out(args), add_special, **_sampling(args)))


def cmd_chat(c: Client, args) -> int:
    msgs = ([{"role": "system", "content": args.system}] if args.system else [])
    msgs.append({"role": "user", "content": args.message})
    return _finish(args, c.chat(args.name, msgs, _stream_out(args), **_sampling(args)))


def cmd_tokenize(c: Client, args) -> int:
    ids = c.tokenize(args.name, args.text, False if args.no_special else None)
    _emit(args, {"ids": ids}, ",".join(map(str, ids)))
    return 0


def cmd_detokenize(c: Client, args) -> int:
    text = c.detokenize(args.name, args.ids)
    _emit(args, {"text": text}, text)
    return 0


def _model_cmd(call, verb):
    def run(c: Client, args) -> int:
        m = call(c, args)
        _emit(args, m, f"{m['name']}: {verb(m)}; plan {plan_text(m)}, {footprint_text(m)}")
        return 0
    return run


def token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers, like 1,2,3") from None
    bad = next((i for i in ids if not -INT32 - 1 <= i <= INT32), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"token id {bad} is outside the 32-bit range")
    return ids


def parse_seconds(text: str) -> float:
    """'300', '5m', '1h', 'forever' (negative), '0' (unload when idle)."""
    t = text.strip().lower()
    if t in ("forever", "inf", "never"):
        return -1.0
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(t[-1:], None)
    try:
        seconds = float(t[:-1]) * scale if scale else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, 5m, 1h or forever") from None
    if math.isnan(seconds):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, 5m, 1h or forever")
    return seconds


def _common(suppress: bool) -> argparse.ArgumentParser:
    # The same options before or after the command; after it they must not reset what came before.
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--address", default=d(None),
                   help=f"unix:///path.sock or host:port (env MINFERD_ADDRESS; default {default_address()})")
    p.add_argument("--token", nargs="?", action=TokenFlagGone, help=argparse.SUPPRESS)
    p.add_argument("--token-file", default=d(None), metavar="FILE",
                   help="read the bearer token from FILE (or set MINFERD_TOKEN)")
    p.add_argument("--ca-cert", default=d(os.environ.get("MINFERD_CA_CERT")), help="TLS: the server's CA (PEM)")
    p.add_argument("--tls", action="store_true", default=d(False), help="TLS with the system's roots")
    p.add_argument("--timeout", type=real_in(0, lo_open=True), default=d(None),
                   help="seconds per call (default: none for streams)")
    p.add_argument("--json", action="store_true", default=d(False), help="print one JSON object")
    return p


def parser() -> argparse.ArgumentParser:
    common = _common(suppress=True)
    ap = argparse.ArgumentParser(prog="minferctl", description=__doc__.splitlines()[0], parents=[_common(False)])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name, fn, help, *pos):
        p = sub.add_parser(name, help=help, parents=[common])
        for a in pos:
            p.add_argument(a)
        p.set_defaults(fn=fn)
        return p

    add("status", cmd_status, "the pool and every model's footprint")
    add("ls", cmd_ls, "the model files the daemon may load, and what each would take")
    p = add("load", cmd_load, "load a GGUF file (a path under --models-dir or a bare name)", "path")
    p.add_argument("--name", default="", help="the name requests use (default: from the file name)")
    p.add_argument("--ctx", type=int_in(1, UINT32), default=0, help="context length (default: the daemon's)")
    p.add_argument("--parallel", type=int_in(1, UINT32), default=0,
                   help="KV for this many full contexts (default: the daemon's --parallel)")
    p.add_argument("--kv-tokens", type=int_in(1, UINT32), default=0,
                   help="KV positions for all sequences together (wins over --parallel)")
    p.add_argument("--matmul-path", default="auto", choices=list(PATHS))
    p.add_argument("--device", default="", help="one of the daemon's devices (cuda:1); default: its placement")
    p.add_argument("--pin", action="store_true", help="never evict it to make room")
    p.add_argument("--keep-alive", type=parse_seconds, help="idle time before it may be unloaded (5m, forever)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add("unload", cmd_unload, "unload a model", "name")
    for name, fn, hlp in (("generate", cmd_generate, "complete a prompt, streaming"),
                          ("chat", cmd_chat, "one chat turn through the model's template")):
        p = add(name, fn, hlp, "name")
        if name == "generate":
            p.add_argument("prompt", nargs="?")
            p.add_argument("--prompt-ids", type=token_ids, help="comma-separated token ids, fed exactly")
            p.add_argument("--no-special", action="store_true", help="no BOS when tokenizing the prompt")
        else:
            p.add_argument("message")
            p.add_argument("--system", help="a system message first")
        p.add_argument("--max-tokens", type=int_in(1, UINT32))
        p.add_argument("--temperature", type=real_in(0), help="0 = greedy")
        p.add_argument("--seed", type=int_in(0, UINT64))
        p.add_argument("--top-k", type=int_in(0, INT32), help="0 = off")
        p.add_argument("--top-p", type=real_in(0, 1, lo_open=True))
        p.add_argument("--min-p", type=real_in(0, 1))
        p.add_argument("--repeat-penalty", type=real_in(0, lo_open=True), help="1 = off")
        p.add_argument("--stop", action="append", help="a stop string (repeatable)")
    p = add("tokenize", cmd_tokenize, "text -> token ids", "name", "text")
    p.add_argument("--no-special", action="store_true")
    add("detokenize", cmd_detokenize, "token ids (1,2,3) -> text", "name").add_argument("ids", type=token_ids)
    add("pin", _model_cmd(lambda c, a: c.set_options(a.name, pinned=True), lambda m: "pinned"), "never evict", "name")
    add("unpin", _model_cmd(lambda c, a: c.set_options(a.name, pinned=False), lambda m: "unpinned"),
        "may be evicted again", "name")
    p = add("keep-alive", _model_cmd(lambda c, a: c.set_options(a.name, keep_alive=a.seconds),
                                     lambda m: f"keep-alive {keep_alive_text(m)}"), "set the idle keep-alive", "name")
    p.add_argument("seconds", type=parse_seconds, help="seconds, 5m, 1h, 0 (unload when idle) or forever")
    add("demote", _model_cmd(lambda c, a: c.demote(a.name), lambda m: "demoted"), "drop the w16 cache", "name")
    add("promote", _model_cmd(lambda c, a: c.promote(a.name), lambda m: "promoted"), "rebuild the w16 cache", "name")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    address = normalize_address(args.address)
    try:
        import grpc
        token = read_token_file(args.token_file) if args.token_file else None
        client = Client(address, token, args.timeout, args.ca_cert, args.tls)
    except OSError as e:  # an unreadable --ca-cert or --token-file
        print(f"minferctl: {e}", file=sys.stderr)
        return 1
    try:
        return args.fn(client, args)
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and _unreachable(details):
            why = details.rsplit(": ", 1)[-1]  # grpc's chain of causes ends in the one a person knows
            details = f"cannot reach minferd at {address} ({why}); is `minferd serve` running?"
        if getattr(args, "json", False):  # a script reading --json output gets its error as JSON too
            print(json.dumps({"error": {"code": code.name, "message": details}}))
        print(f"minferctl: {code.name}: {details}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the stream was cancelled on the way out (Client._stream)
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `minferctl generate ... | head`
        return 0
    finally:
        client.close()


def read_token_file(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().removesuffix("\n").removesuffix("\r")  # `openssl rand -hex 16 > FILE` adds one


def _unreachable(details: str) -> bool:
    d = details.lower()
    return any(s in d for s in ("failed to connect", "connection refused", "no such file", "connect failed",
                                "dns resolution failed", "unix:"))


if __name__ == "__main__":
    sys.exit(main())
