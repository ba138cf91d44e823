"""The attack classes of issue 13's list that start daemons of their own over the transports and
sockets they attack (bench/hostile_sweep.py runs them): docstring "what was tried | what is expected"."""
from hostile_harness import *  # noqa: F401,F403


def transport_rules(d, k):
    """starts with TLS but no token, blank/short/spaced tokens, --token on argv, plain TCP, --insecure on 0.0.0.0,
    metrics on 0.0.0.0 without token; a TLS+token daemon called without/with wrong/blank/the token | each bad
    start refused in one line (no traceback, no token echoed); UNAUTHENTICATED unless the token; the token in no
    argv or log"""
    cert, key = W.TMP / "c.pem", W.TMP / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-subj",
                    "/CN=localhost", "-days", "1"], capture_output=True, check=True)
    (W.TMP / "spaced").write_text("tok en" + "x" * 20)
    secret = "argv" + secrets.token_hex(12)
    tcp, unix = f"127.0.0.1:{free_port()}", f"unix://{W.TMP}/refused.sock"
    bad = {"TLS, no token": ([tcp, "--tls-cert", cert, "--tls-key", key], {}), "blank token": ([tcp], {"MINFERD_TOKEN": "   "}),
           "short token": ([tcp], {"MINFERD_TOKEN": "short"}), "--token argv": ([unix, "--token", secret], {}),
           "plain TCP": ([tcp], {}), "--insecure 0.0.0.0": ([f"0.0.0.0:{free_port()}", "--insecure"], {}),
           "metrics 0.0.0.0": ([unix, "--metrics-listen", f"0.0.0.0:{free_port()}"], {}),
           "spaced token file": ([tcp, "--token-file", W.TMP / "spaced"], {})}
    procs = {w: (spawn(a[0], a[1:], e, log=W.TMP / f"bad{i}.log"), W.TMP / f"bad{i}.log") for i, (w, (a, e)) in enumerate(bad.items())}
    for what, (p, log) in procs.items():
        rc, text = p.wait(60), log.read_text()
        k.check(rc != 0 and "minferd: listening on" not in text and "Traceback" not in text and secret not in text,
                f"{what}: exit {rc}: {text.strip()[-160:]!r}")
    tf, tls = W.TMP / "token", f"127.0.0.1:{free_port()}"
    tf.write_text(TOKEN + "\n")
    p = spawn(tls, ["--tls-cert", cert, "--tls-key", key, "--token-file", tf], log=W.TMP / "tls.log")
    if k.check(listening(p, W.TMP / "tls.log"), "TLS+token daemon did not start"):
        s = pb2_grpc.MinferdStub(grpc.secure_channel(tls, grpc.ssl_channel_credentials(cert.read_bytes()),
                                                     options=[("grpc.ssl_target_name_override", "localhost")]))
        for what, md, want in (("no token", (), "UNAUTHENTICATED"), ("wrong", (("authorization", "Bearer " + "0" * 32),),
                               "UNAUTHENTICATED"), ("blank bearer", (("authorization", "Bearer "),), "UNAUTHENTICATED"),
                               ("the token", d.md, "OK")):
            k.expect(f"TLS {what}", attempt(lambda: s.GetStatus(pb2.GetStatusRequest(), metadata=md, timeout=5)), {want})
        plain = pb2_grpc.MinferdStub(grpc.insecure_channel(tls))
        k.expect("plaintext to TLS", attempt(lambda: plain.GetStatus(pb2.GetStatusRequest(), timeout=3)),
                 {"UNAVAILABLE", "DEADLINE_EXCEEDED"})
    kill(p)
    for what, text in (("cmdline", Path(f"/proc/{d.pid}/cmdline").read_bytes().decode()), ("log", d.log.read_text()),
                       ("tls log", (W.TMP / "tls.log").read_text())):
        k.check(TOKEN not in text, f"the token is in the daemon's {what}")


def socket_rules(d, k):
    """unix:/abs, unix:relative, unix:///abs under umask 0; a second daemon on a live socket; a regular file, a
    directory, a symlink at the path; a stale socket; a successor started while the old daemon drains (3 s) |
    mode 0600 in every spelling; live/file/dir/link refused and left as they were; stale replaced; the successor
    keeps its socket when the old one exits, and the old one exits 0 within its drain"""
    s = W.TMP / "s"
    s.mkdir()
    procs = []
    try:
        for what, listen, cwd in (("unix:/abs", f"unix:{s}/one.sock", None), ("unix:rel", "unix:rel.sock", s),
                                  ("unix:///abs", f"unix://{s}/three.sock", None)):
            path = s / (listen.rsplit("/", 1)[-1].removeprefix("unix:"))
            procs.append(spawn(listen, cwd=cwd, umask=0, log=s / f"{path.name}.log"))
            up = listening(procs[-1], s / f"{path.name}.log")
            mode = oct(path.stat().st_mode & 0o777) if path.exists() else None
            if k.check(up and mode == "0o600", f"{what}: listening {up}, mode {mode}"):
                k.expect(f"{what} GetStatus", attempt(lambda: pb2_grpc.MinferdStub(grpc.insecure_channel(
                    f"unix://{path}")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        (s / "file.sock").write_text("keep me")
        (s / "dir.sock").mkdir()
        os.symlink(s / "file.sock", s / "link.sock")
        tries = {n: spawn(f"unix://{s}/{n}", log=s / f"{n}.try.log") for n in ("one.sock", "file.sock", "dir.sock", "link.sock")}
        for n, p in tries.items():
            rc = p.wait(60)
            k.check(rc != 0 and "minferd: listening on" not in (s / f"{n}.try.log").read_text(), f"a daemon on {n}: exit {rc}")
        k.check((s / "file.sock").read_text() == "keep me" and (s / "dir.sock").is_dir() and (s / "link.sock").is_symlink(),
                "something at a socket path was replaced")
        k.expect("the first still serves", attempt(lambda: pb2_grpc.MinferdStub(grpc.insecure_channel(
            f"unix://{s}/one.sock")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(s / "stale.sock"))
        stale.close()
        procs.append(spawn(f"unix://{s}/stale.sock", log=s / "stale.log"))
        k.check(listening(procs[-1], s / "stale.log"), "a stale socket was not replaced")
        a = spawn(f"unix://{s}/succ.sock", ["--models-dir", W.M, "--drain-seconds", "3"], log=s / "a.log")
        if k.check(listening(a, s / "a.log"), "the draining daemon did not start"):
            sa = pb2_grpc.MinferdStub(grpc.insecure_channel(f"unix://{s}/succ.sock"))
            list(sa.LoadModel(pb2.LoadModelRequest(name="q", path="q.gguf", ctx=2048), timeout=30))
            stream = sa.Generate(pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=1500)), timeout=60)
            next(stream)
            a.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            procs.append(spawn(f"unix://{s}/succ.sock", log=s / "b.log"))
            k.check(listening(procs[-1], s / "b.log"), f"the successor did not start: {(s / 'b.log').read_text()[-200:]!r}")
            t0 = time.monotonic()
            rc = a.wait(30)
            k.check(rc == 0 and time.monotonic() - t0 < 3 + 10, f"the draining daemon: exit {rc} after {time.monotonic() - t0:.1f} s")
            k.expect("the successor serves after the old one exits", attempt(lambda: pb2_grpc.MinferdStub(
                grpc.insecure_channel(f"unix://{s}/succ.sock")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        procs.append(a)
    finally:
        for p in procs:
            kill(p)


def cli_rules(d, k):
    """minferctl load ./q.gguf from the models dir (the daemon's cwd is elsewhere); negative --max-tokens, --ctx,
    --seed; a daemon with --budget 100TiB and --parent-pid of a process then SIGKILLed | the caller's file loads;
    one-line usage errors (exit 2, no traceback); a warning for the clamped budget; the daemon exits with its parent"""
    env = {**os.environ, "MINFERD_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    ctl = {what: subprocess.Popen([PY, "-m", "minferd.ctl", "--address", d.address, *a], cwd=W.M, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for what, a in (("load ./q.gguf", ("load", "./q.gguf", "--name", "rel", "--ctx", "64", "-q")),
                           ("--max-tokens -1", ("generate", "q", "hi", "--max-tokens", "-1")),
                           ("--ctx -5", ("load", "q.gguf", "--ctx", "-5")), ("--seed -1", ("generate", "q", "hi", "--seed", "-1")))}
    for what, p in ctl.items():
        _, err = p.communicate(timeout=60)
        want = 0 if what.startswith("load ./") else 2
        k.check(p.returncode == want and "Traceback" not in err, f"minferctl {what}: exit {p.returncode}: {err.strip()[-160:]!r}")
    k.check("rel" in d.names(), "minferctl load ./q.gguf did not load the caller's file")
    attempt(lambda: d.rpc("UnloadModel", name="rel"))
    sleeper = subprocess.Popen(["sleep", "120"])
    p = spawn(f"unix://{W.TMP}/pp.sock", ["--parent-pid", sleeper.pid, "--budget", "100TiB"], log=W.TMP / "pp.log")
    try:
        up = listening(p, W.TMP / "pp.log")
        k.check(up and "is more than" in (W.TMP / "pp.log").read_text(), "no warning for --budget 100TiB on this host")
        sleeper.kill()
        sleeper.wait()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(8)
        k.check(p.poll() is not None, "the daemon outlived its --parent-pid by 8 s")
    finally:
        kill(p)
