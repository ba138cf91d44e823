"""Hostile-client sweep (issue 13, wider): real `minferd serve --device cpu` daemons in a temp dir,
attacked over real sockets, one function per attack class, a table of results at the end.

    python bench/hostile_sweep.py [--json FILE] [--only NAME,...]

Every class expects a typed gRPC status (never INTERNAL/UNKNOWN/UNAVAILABLE, never the daemon
dying), bounded error messages, and afterwards: the daemon answering GetStatus, used == allocated ==
the ledger's per-set/per-model sum, no traceback in its log, and GetStatus (timed every 50 ms by a
prober process of its own) never slower than 0.5 s while the class ran. Exit 1 on any FAIL.
"""
from __future__ import annotations

import argparse, json, os, re, secrets, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_attacks import *  # noqa: F401,F403,E402
from hostile_transport import *  # noqa: F401,F403,E402
from hostile_beyond import *  # noqa: F401,F403,E402
from hostile_harness import *  # noqa: F401,F403,E402
from hostile_sessions import session_socket, sessions  # noqa: E402


ISSUE = [reaper_unload_race, truncate_during_load, symlink_swap, transport_rules, health_metrics_leaks, stalls_behind_work,
         weight_sets_and_refusals, chat_templates, amplifying_inputs, socket_rules, health_vs_table, promote_demote,
         same_file_200_names, cli_rules]
BEYOND = [streams_abandoned, streams_pending, never_reading, deadlines_1ms, keep_alive_values, sampling_extremes,
          load_unload_storm, reflection_token, metadata_16k, special_files, hard_link, utf8_edges, bad_token_ids,
          health_watch_storm, metrics_idle_connections, metrics_series_of_unloaded, socket_garbage, odd_fields, sessions, session_socket]


# ---- the files, the daemon, the runner -----------------------------------------------------------
def make_files():
    for p in (W.M, W.O, W.O / "dir"):
        p.mkdir(parents=True)
    write_model(W.M / "q.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(W.M / "l.gguf", "llama", "tiny", "q4_k", seed=2)
    write_model(W.O / "evil.gguf", "llama", "tiny", "q8_0", seed=3)
    write_model(W.M / "hugectx.gguf", "qwen2", "tiny", "q8_0", seed=4, overrides={"ctx": 1 << 22})
    write_model(W.M / "big.gguf", "qwen2", "tiny", "q8_0", random_blocks_=True,
                overrides=dict(vocab=32768, hidden=1024, layers=8, ffn=4096))
    shutil.copy(W.M / "big.gguf", W.M / "big2.gguf")
    shutil.copy(W.M / "q.gguf", W.M / "w.gguf")
    for name, (src, _) in TEMPLATES.items():
        rewrite(W.M / "q.gguf", W.M / f"t-{name}.gguf", metadata={"tokenizer.chat_template": src})
    os.link(W.M / "q.gguf", W.M / "hard.gguf")
    os.symlink(W.O / "evil.gguf", W.M / "out.gguf")
    os.symlink(W.O, W.M / "sub")
    os.symlink("/dev/zero", W.M / "zero.gguf")
    os.mkfifo(W.M / "fifo.gguf")
    (W.M / "dir.gguf").mkdir()
    with contextlib.suppress(OSError):  # root only
        os.mknod(W.M / "chr.gguf", 0o600 | 0o020000, os.makedev(1, 5))


def main_daemon():
    d = Daemon(W.TMP / f"main{secrets.token_hex(2)}", ["--models-dir", W.M, "--budget", "1GiB", "--metrics-port", W.METRICS,
                                                    "--drain-seconds", "5"])
    for n in BASE:
        d.load(n, f"{n}.gguf", ctx=2048 if n == "q" else 256, keep_alive_seconds=-1)
    probe = subprocess.Popen([PY, "-c", PROBER, d.address, str(W.TMP / "probe.txt"), str(ROOT)],
                             env={**os.environ, "T": TOKEN})
    return d, probe


def run(fn, d):
    k, t0, seen_log = Case(), time.monotonic(), d.log.stat().st_size
    tried, expected = (" ".join(x.split()) for x in re.split(r"\s\|\s", fn.__doc__, maxsplit=1))
    try:
        fn(d, k)
    except Exception as e:  # the sweep's own failure is a FAIL too, named
        k.bad.append(f"sweep raised {type(e).__name__}: {str(e)[:200]}")
    if not d.alive():
        k.bad.append(f"the daemon died: {d.log.read_text()[-300:]!r}")
    elif k.expect("GetStatus afterwards", attempt(lambda: d.status(timeout=2)), OK) == "OK":
        d.unload_all(keep=BASE)
        ledger_ok(d, k)
    time.sleep(0.1)
    worst = slow_status(W.TMP / "probe.txt", t0, time.monotonic())
    k.check(worst <= STALL, f"GetStatus took {worst:.2f} s while this ran (prober)")
    new = d.log.read_bytes()[seen_log:].decode(errors="replace") if d.log.exists() else ""
    for line in new.splitlines():
        if any(m in line for m in ("Traceback", "internal error", "reaper:", "Exception")):
            k.bad.append(f"log: {line.strip()[:200]}")
            break
    got = ", ".join(f"{c} x{n}" for c, n in k.seen.most_common()) or "-"
    got += f"; GetStatus max {worst:.2f} s; {time.monotonic() - t0:.1f} s"
    return {"class": fn.__name__, "listed": fn in ISSUE, "tried": tried, "expected": expected, "got": got,
            "failures": k.bad, "verdict": "FAIL" if k.bad else "PASS"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--only", default=None, help="comma-separated class names")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = ap.parse_args(argv)
    W.TMP = Path(tempfile.mkdtemp(prefix="mhs-", dir="/tmp"))  # short: unix socket paths
    W.M, W.O, W.METRICS = W.TMP / "models", W.TMP / "outside", free_port()
    t_start, results = time.monotonic(), []
    head = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    make_files()
    d, probe = main_daemon()
    threads0 = None
    try:
        for fn in BEYOND[:2] + ISSUE + BEYOND[2:]:  # the stream storms first: gRPC's pool is at its size after them
            if args.only and fn.__name__ not in args.only.split(","):
                continue
            results.append(run(fn, d))
            print(f"{results[-1]['verdict']} {fn.__name__}: {results[-1]['got']}", flush=True)
            threads0 = threads0 or d.threads()
            if not d.alive():
                probe.kill()
                d, probe = main_daemon()
        k = Case()
        d.unload_all()
        st = d.status()
        k.check(st.pool.used_bytes == st.pool.allocated_bytes == 0, f"after unloading everything: used "
                f"{st.pool.used_bytes} allocated {st.pool.allocated_bytes}")
        k.check(d.threads() <= max(threads0, 256 + 12), f"threads {threads0} at start, {d.threads()} at the end")
        os.kill(d.pid, signal.SIGTERM)
        t0 = time.monotonic()
        while d.alive() and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        k.check(not d.alive(), "SIGTERM: the daemon still running after 15 s (drain 5 s)")
        results.append({"class": "final", "listed": True, "tried": "unload everything, SIGTERM", "expected":
                        "used == allocated == 0; threads <= gRPC's 256 + 12; exit within the 5 s drain", "got":
                        f"used {st.pool.used_bytes}, threads {threads0} -> {d.threads() if d.alive() else 'exited'}",
                        "failures": k.bad, "verdict": "FAIL" if k.bad else "PASS"})
    finally:
        probe.kill()
        stop_daemon(d.pid, timeout=5)
        if not args.keep:
            shutil.rmtree(W.TMP, ignore_errors=True)
    print(f"\n{'class':<26} {'verdict':<7} got\n" + "\n".join(
        f"{r['class']:<26} {r['verdict']:<7} {r['got']}" + "".join(f"\n{'':<35}- {b}" for b in r["failures"][:6])
        for r in results))
    for r in results:
        print(f"\n[{r['verdict']}] {r['class']}\n  tried:    {r['tried']}\n  expected: {r['expected']}\n  got:      {r['got']}")
    fails = [r["class"] for r in results if r["verdict"] == "FAIL"]
    print(f"\n{head}: {len(results) - len(fails)} PASS, {len(fails)} FAIL in {time.monotonic() - t_start:.0f} s"
          + (f": {', '.join(fails)}" if fails else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"commit": head, "results": results}, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
