"""The gRPC edge: a thin servicer (proto <-> host calls), errors mapped to status codes by
grpc_status's one map, and create_server (kept apart from serve, as in the gRPC examples; the token interceptor
and the health service are minferd.auth's)."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from minferd import config, reflection_v1
from minferd._proto import pb2, pb2_grpc
from minferd.auth import GatedHealth, TokenAuth
from minferd.decode_guard import DecodeGuard
from minferd.devices import MatmulPath
from minferd.errors import Busy, InvalidRequest
from minferd.fleet import Fleet
from minferd.grpc_status import edge, status_code
from minferd.host import LoadOptions
from minferd.idle_streams import IdleStreams
from minferd.model.sampler import SamplingParams
from minferd.paths import open_model_source
from minferd.priority import lower_this_thread
from minferd.request_checks import bound, check_chat, check_room, check_text_fits, keep_alive_seconds, utf8_len

log = logging.getLogger("minferd")

PATHS = {pb2.W16: MatmulPath.W16, pb2.MMQ: MatmulPath.MMQ, pb2.FUSED_B: MatmulPath.FUSED_B}
SERVICE = "minferd.v1.Minferd"


def model_info(d: dict) -> pb2.ModelInfo:
    return pb2.ModelInfo(**{k: v for k, v in d.items() if k not in ("bytes", "engine", "classes")},
                         bytes=pb2.ByKind(**d["bytes"]), engine=pb2.EngineInfo(**d["engine"]),
                         classes=[pb2.TensorClass(**c) for c in d["classes"]])


SAMPLING_CACHE_BYTES = 512  # the largest SamplingParams message sampling() keeps


def sampling(p: pb2.SamplingParams) -> SamplingParams:
    # A client's requests mostly repeat their parameters: made and checked once (~15 us a request),
    # found by the message's bytes (~0.5 us); a frozen SamplingParams is safe to share. Only small
    # messages are kept (long stop strings are not: 256 of them could hold a GB).
    raw = p.SerializeToString(deterministic=True)
    return _sampling_cached(raw) if len(raw) <= SAMPLING_CACHE_BYTES else _sampling(p)


@functools.lru_cache(maxsize=256)
def _sampling_cached(raw: bytes) -> SamplingParams:
    return _sampling(pb2.SamplingParams.FromString(raw))


def _sampling(p: pb2.SamplingParams) -> SamplingParams:
    kw = {f: getattr(p, f) for f in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                                    "seed", "max_tokens") if p.HasField(f)}
    return SamplingParams(**kw, stop=tuple(p.stop))


class MinferdServicer(pb2_grpc.MinferdServicer):
    def __init__(self, host: Fleet, models_dirs, keep_alive: float, health_servicer=None, metrics=None,
                 max_streams: int | None = None, session_idle: float = config.SESSION_IDLE_SECONDS):
        self.host, self.models_dirs, self.keep_alive = host, tuple(models_dirs), keep_alive
        self.health, self.metrics = health_servicer, metrics
        # Generations hold a gRPC thread each while they wait and stream; past this many at once a
        # new one is refused, so GetStatus, health and loads always find a thread.
        self.max_streams = max_streams or GRPC_STREAMS
        self._streams = threading.BoundedSemaphore(self.max_streams)
        self.idle_streams = IdleStreams(session_idle)  # a Session holds its place while it waits

    @contextlib.contextmanager
    def stream_place(self):
        if not self._streams.acquire(blocking=False):
            raise Busy(f"{self.max_streams} generations are in flight, the most this daemon streams at once; "
                       f"retry when one ends")
        try:
            yield
        finally:
            self._streams.release()

    def refusal(self, e: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status a request that raised e ends with, and its text (counted, logged if internal)."""
        code = status_code(e)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("internal error")
        if self.metrics:
            self.metrics.refusal(code.name)
        return code, str(e) if code != grpc.StatusCode.INTERNAL else f"internal error: {type(e).__name__}: {e}"

    def _abort(self, context, e: BaseException):
        context.abort(*self.refusal(e))

    @edge
    def LoadModel(self, request, context):
        if request.matmul_path != pb2.MATMUL_PATH_AUTO and request.matmul_path not in PATHS:
            # proto3 enums are open: an unknown number silently meant "auto"
            raise InvalidRequest(f"matmul_path {request.matmul_path} is not one of AUTO, W16, MMQ, FUSED_B")
        keep = keep_alive_seconds(request.keep_alive_seconds) if request.HasField("keep_alive_seconds") else self.keep_alive
        opts = LoadOptions(PATHS.get(request.matmul_path), request.ctx or None, request.pinned, keep,
                           request.parallel or None, request.kv_tokens or None)
        # Opened once, after the checks above (they hold no descriptor); the host reads through it.
        source = open_model_source(request.path, self.models_dirs)
        name = request.name or _name_from(str(source.path))
        yield pb2.LoadProgress(phase="planning")
        progress: queue.SimpleQueue = queue.SimpleQueue()
        box = {}

        def load():
            lower_this_thread()  # parsing, tokenizer and upload are compute: status answers first
            try:
                box["lm"] = self.host.load(name, source, opts, lambda ph, d, t: progress.put((ph, d, t)),
                                           device=request.device or None)
            except BaseException as e:
                box["error"] = e
            progress.put(None)

        threading.Thread(target=load, name=f"minferd-load-{name}", daemon=True).start()
        last = 0.0
        while (item := progress.get()) is not None:
            now = time.monotonic()
            if item[0] != "weights" or now - last > 0.05 or item[1] == item[2]:  # at most ~20 updates a second
                last = now
                yield pb2.LoadProgress(phase=item[0], bytes_done=item[1], bytes_total=item[2])
        if "error" in box:
            raise box["error"]
        yield pb2.LoadProgress(phase="ready", bytes_done=1, bytes_total=1,
                               model=model_info(self.host.model_info(box["lm"])))

    @edge
    def UnloadModel(self, request, context):
        freed = self.host.unload(request.name)
        return pb2.UnloadModelResponse(name=request.name, freed_bytes=freed)

    @edge
    def ListModels(self, request, context):
        return pb2.ListModelsResponse(models=[model_info(m) for m in self.host.status()["models"]])

    @edge
    def ListAvailable(self, request, context):
        from minferd.available import available
        return pb2.ListAvailableResponse(models=[
            pb2.AvailableModel(**{k: v for k, v in m.items() if k != "bytes"},
                               **({"bytes": pb2.ByKind(**m["bytes"])} if "bytes" in m else {}))
            for m in available(self.host, self.models_dirs)])

    @edge
    def GetStatus(self, request, context):
        st = self.host.status()
        return pb2.Status(pool=pb2.PoolInfo(**st["pool"]), models=[model_info(m) for m in st["models"]],
                          events=st["events"], pools=[pb2.PoolInfo(**p) for p in st["pools"]])

    def _prepare_model(self, request) -> None:
        """Load on demand (a file of --models-dir by that name), then the request's keep-alive."""
        from minferd.available import ensure_loaded
        ensure_loaded(self.host, self.models_dirs, request.model, self.keep_alive)
        if request.HasField("keep_alive_seconds"):
            self.host.set_keep_alive(request.model, keep_alive_seconds(request.keep_alive_seconds))

    @edge
    def Generate(self, request, context):
        with self.stream_place():
            yield from self.generate_events(request, cancelled_event(context))

    def generate_events(self, request, gone: threading.Event):
        params = sampling(request.sampling)
        self._prepare_model(request)
        if request.WhichOneof("prompt") == "ids":
            ids = list(request.ids.ids)
        else:
            add = request.add_special if request.HasField("add_special") else True
            lm = self.host.get(request.model)
            check_text_fits(lm.ws.tokenizer, request.text, lm.ctx)
            ids = lm.ws.tokenizer.encode(request.text, add_special=add)
        self._check_room(request.model, ids, request.sampling)
        yield from self._stream(request.model, ids, params, gone)

    def _check_room(self, model: str, ids, sp: pb2.SamplingParams) -> None:
        if sp.HasField("max_tokens"):
            check_room(len(ids), sp.max_tokens, self.host.get(model).ctx)

    @edge
    def Chat(self, request, context):
        with self.stream_place():
            yield from self.chat_events(request, cancelled_event(context))

    def chat_events(self, request, gone: threading.Event):
        check_chat([(m.role, m.content) for m in request.messages])
        self._prepare_model(request)
        lm = self.host.get(request.model)
        msgs = [{"role": m.role, "content": m.content} for m in request.messages]
        text = lm.ws.tokenizer.render_chat(msgs)
        check_text_fits(lm.ws.tokenizer, text, lm.ctx)
        ids = lm.ws.tokenizer.encode(text, add_special=True)
        self._check_room(request.model, ids, request.sampling)
        yield from self._stream(request.model, ids, sampling(request.sampling), gone)

    @edge
    def Session(self, requests, context):
        """Generate and Chat requests in turn over one call (the proto says why); a request that
        fails ends the session with its status, as it would end its own call."""
        with self.stream_place():
            gone = cancelled_event(context)
            for request in self.idle_streams.requests(requests, context.cancel):
                yield from self.session_events(request, gone)

    def session_events(self, request: pb2.SessionRequest, gone: threading.Event):
        """One request of a Session (over gRPC or the session socket): its Generate's or Chat's events."""
        kind = request.WhichOneof("request")
        if kind is None:
            raise InvalidRequest("Session: a SessionRequest must hold a generate or a chat request")
        yield from (self.generate_events if kind == "generate" else self.chat_events)(getattr(request, kind), gone)

    def _stream(self, model, ids, params, gone: threading.Event):
        t0 = time.perf_counter()
        events = self.host.stream(model, ids, params, cancel=gone)
        outcome, generated, timings = "cancelled", 0, None  # what a request the client left counts as
        try:
            for kind, a, b in events:
                if kind == "piece":
                    if a >= 0:
                        if not generated and self.metrics:
                            self.metrics.first_token(model, time.perf_counter() - t0)
                        generated += 1
                    yield pb2.GenerateEvent(text=b, token_id=a)
                else:
                    res = a
                    t = timings = res.timings
                    outcome, generated = res.finish_reason, len(res.token_ids)
                    yield pb2.GenerateEvent(token_id=-1, finish_reason=res.finish_reason, timings=pb2.Timings(
                        prompt_tokens=res.prompt_tokens, generated_tokens=len(res.token_ids),
                        prefill_ms=t["prefill_ms"], decode_ms=t["decode_ms"],
                        prefill_tok_s=t["prefill_tok_s"], decode_tok_s=t["decode_tok_s"],
                        cached_tokens=t.get("cached_tokens", 0), preemptions=t.get("preemptions", 0)))
        except Exception as e:
            outcome = status_code(e).name
            raise
        finally:
            events.close()
            if self.metrics:
                self.metrics.request(model, outcome, len(ids), generated, time.perf_counter() - t0, timings)

    @edge
    def Tokenize(self, request, context):
        bound("text", utf8_len(request.text), config.MAX_TOKENIZE_BYTES, "bytes")
        add = request.add_special if request.HasField("add_special") else True
        return pb2.TokenizeResponse(ids=self.host.get(request.model).ws.tokenizer.encode(request.text, add_special=add))

    @edge
    def Detokenize(self, request, context):
        bound("ids", len(request.ids), config.MAX_DETOKENIZE_IDS, "ids")
        tok = self.host.get(request.model).ws.tokenizer
        ids = list(request.ids)
        bad = [i for i in ids if not 0 <= i < tok.vocab_size]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary [0, {tok.vocab_size})")
        # What one may tokenize one may detokenize: the answer is bounded as Tokenize's text is, and
        # counted from the pieces' lengths before any of it is built.
        bound("ids", tok.decoded_bytes(ids), config.MAX_TOKENIZE_BYTES, "bytes of text", "would decode to")
        return pb2.DetokenizeResponse(text=tok.decode(ids))

    @edge
    def SetModelOptions(self, request, context):
        keep = keep_alive_seconds(request.keep_alive_seconds) if request.HasField("keep_alive_seconds") else None
        if request.HasField("pinned"):
            self.host.set_pinned(request.name, request.pinned)
        if keep is not None:
            self.host.set_keep_alive(request.name, keep)
        return model_info(self.host.model_info(self.host.get(request.name)))

    @edge
    def Demote(self, request, context):
        self.host.demote(request.name)
        return model_info(self.host.model_info(self.host.get(request.name)))

    @edge
    def Promote(self, request, context):
        self.host.promote(request.name)  # waits for requests in flight; PoolExhausted with the numbers
        return model_info(self.host.model_info(self.host.get(request.name)))


def cancelled_event(context) -> threading.Event:
    """Set once the call ends early (the client went away): the request reads it and cancels at
    once. The callback used to close the generator, which raised "generator already executing"
    whenever the thread was waiting inside it (so a queued request still ran)."""
    gone = threading.Event()
    if not context.add_callback(gone.set):
        gone.set()
    return gone


def _name_from(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.endswith(".gguf") else base


# A streaming Generate holds one of these threads for as long as it waits in its model's queue, and
# a call that finds none free waits behind them: with 64, GetStatus under 128 clients (bench/load.py)
# took 12 s at p99. Idle threads cost a little memory; each Generate beyond this many still waits.
GRPC_WORKERS = 256
GRPC_STREAMS = config.GRPC_MAX_STREAMS  # the threads generations may hold; the rest answer everything else


def create_server(servicer: MinferdServicer, health_servicer, token: str | None = None,
                  max_message_bytes: int = 16 << 20, workers: int = GRPC_WORKERS) -> grpc.Server:
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.max_metadata_size", 16 << 10)]
    interceptors = ([TokenAuth(token)] if token else []) + [DecodeGuard()]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minferd-grpc"),
                         interceptors=interceptors, options=options)
    pb2_grpc.add_MinferdServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection_v1.enable((pb2.DESCRIPTOR.services_by_name["Minferd"].full_name, health.SERVICE_NAME), server)
    return server


def new_health(host: Fleet | None = None, token: str | None = None) -> GatedHealth:
    """grpc.health.v1: overall entries open for probes, `model/<name>` read from `host` and asking
    for `token` where one is set (minferd.auth)."""
    return GatedHealth(host, token)
