"""Loaded by a daemon that bench/ttft_split.py starts (this folder first on its PYTHONPATH), and a
no-op anywhere else: with MINFERD_STAMPS=FILE it stamps (perf_counter_ns, one clock for every
process of the machine) where a request is on its way through the daemon, and writes them to FILE
at exit. MINFERD_STAMP_LINES=1 adds every line the engine thread runs in the files of LINE_FILES:
the gaps between them show where it waits (a copy, a launch, a sync); tracing slows each line.

MINFERD_NULL_FORWARD=1 (with or without stamps): the CPU backend's passes return a fixed row of
logits at once and run on a request's own thread as a device backend's do (caller_steps), so what
is timed is the daemon's own Python around an engine step, the model's arithmetic left out (on a
GPU host that arithmetic is a graph's replay, which this machine cannot run). MINFERD_PROFILE=FILE:
cProfile's stats of the session socket's request handling (one connection at a time) to FILE."""
import atexit
import os
import threading
import time

STAMPS = os.environ.get("MINFERD_STAMPS")
NULL_FORWARD = os.environ.get("MINFERD_NULL_FORWARD") == "1"
LINE_FILES = ("backend/cuda.py", "backend/cuda_graph.py", "backend/cuda_sample.py", "backend/batch.py",
              "engine/engine.py", "kernels/sample.py", "kernels/launch.py")


def targets():
    """(class, method, stamp label, whether a generator) of every method stamped: a test checks
    they exist (a renamed method would leave the daemon's sitecustomize failing)."""
    import minferd.decode_guard as guard
    import minferd.engine.engine as engine
    import minferd.engine.sequence as sequence
    import minferd.server as server
    return [(guard.DecodeGuard, "intercept_service", "intercept", False),
            (server.MinferdServicer, "Generate", "generate", True),
            (server.MinferdServicer, "generate_events", "request", True),  # a call's, a Session's or the session socket's
            (server.MinferdServicer, "_prepare_model", "prepare", False),
            (server.MinferdServicer, "_stream", "stream", True),
            (engine.ModelEngine, "step", "step", False),
            (engine.ModelEngine, "_batch", "batch", False),
            (engine.ModelEngine, "_postprocess", "post", False),
            (sequence.Sequence, "flush", "flush", False)]


def _install():
    import queue
    import types

    stamps = []

    def stamp(name):
        stamps.append((name, time.perf_counter_ns()))

    def dump():
        with open(STAMPS, "w") as f:
            f.writelines(f"{n}\t{t}\n" for n, t in stamps)

    atexit.register(dump)

    def wrap(cls, name, label, generator=False):
        f = getattr(cls, name)
        if generator:
            def g(*a, **k):
                stamp(label)
                for x in f(*a, **k):
                    stamp(label + ".item")
                    yield x
                    stamp(label + ".resumed")
        else:
            def g(*a, **k):
                stamp(label)
                try:
                    return f(*a, **k)
                finally:
                    stamp(label + ".end")
        setattr(cls, name, g)

    def stamped_queue(label):
        class Q(queue.SimpleQueue):
            def get(self, *a, **k):
                stamp(label + ".get")
                item = super().get(*a, **k)
                stamp(label + ".got")
                return item

            def put(self, *a, **k):
                stamp(label + ".put")
                super().put(*a, **k)
        return Q

    def patch():
        import minferd.engine.engine as engine
        import minferd.engine.sequence as sequence
        for cls, name, label, generator in targets():
            wrap(cls, name, label, generator)
        sequence.queue = types.SimpleNamespace(SimpleQueue=stamped_queue("events"))
        engine.queue = types.SimpleNamespace(SimpleQueue=stamped_queue("inbox"), Empty=queue.Empty)

    def tracer(frame, event, arg):
        path = frame.f_code.co_filename
        if not path.endswith(LINE_FILES) or not threading.current_thread().name.startswith("minferd-model"):
            return None
        where = f"line {path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"

        def local(frame, event, arg):
            if event in ("line", "return"):
                stamp(f"{where}:{frame.f_lineno if event == 'line' else 'return'}")
            return local
        return local

    if os.environ.get("MINFERD_STAMP_LINES"):
        threading.settrace(tracer)  # threads started from now on: the engine's

    patch()  # the daemon's modules, imported here rather than by serve: the same ones


def _profile(path):
    """cProfile over each request's handling on the session socket (its connection's thread: the
    request's own step included where it runs one), written to path at exit."""
    import cProfile

    import minferd.session_socket as session_socket

    prof, answer = cProfile.Profile(), session_socket.SessionSocket._answer

    def profiled(self, conn, request, watched):
        prof.enable()
        try:
            return answer(self, conn, request, watched)
        finally:
            prof.disable()

    session_socket.SessionSocket._answer = profiled
    atexit.register(prof.dump_stats, path)


def _null_forward():
    import numpy as np

    from minferd.backend.cpu import CpuBackend

    rows = {}

    def forward(self, model, batch, cache):
        n = batch.n_seqs
        if (n, model) not in rows:  # token 7 wins every greedy pick
            rows[n, model] = np.zeros((n, model.spec.n_vocab), np.float32)
            rows[n, model][:, 7] = 1.0
        return rows[n, model]

    CpuBackend.run = forward
    CpuBackend.caller_steps = True
    CpuBackend.runs_anywhere = lambda self, model, batch, cache: True


if NULL_FORWARD:
    _null_forward()
if os.environ.get("MINFERD_PROFILE"):
    _profile(os.environ["MINFERD_PROFILE"])
if STAMPS:
    _install()
