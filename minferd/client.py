"""A minferd connection that speaks plain Python (dicts, lists, str): minferctl and the pytest plugin use it.

Light on purpose: grpc and the generated stubs, imported when a Client is made, so that
`minferctl --help` starts in a blink; never numpy, CuPy or the model code.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading

from minferd.client_session import STALE, Session, SessionEnded

KINDS = ("weights", "w16", "kv", "scratch")
PATHS = {"auto": 0, "w16": 1, "mmq": 2, "fused_b": 3}  # MatmulPath enum values


def default_address() -> str:
    # Must agree with `minferd serve`'s default, so both find each other with no flags.
    run = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(run, "minferd.sock") if run else os.path.join(tempfile.gettempdir(), f"minferd-{os.getuid()}.sock")
    return "unix://" + path


def normalize_address(address: str | None) -> str:
    address = address or os.environ.get("MINFERD_ADDRESS") or default_address()
    return "unix://" + address if address.startswith("/") else address  # a bare socket path is obvious


# ---- proto -> plain Python values (what --json prints and what tests compare) ----------------
def model_dict(m) -> dict:
    return {"name": m.name, "path": m.path, "architecture": m.architecture, "type_mix": dict(m.type_mix),
            "matmul_path": m.matmul_path, "planned_matmul_path": m.planned_matmul_path, "reason": m.reason,
            "bytes": {k: getattr(m.bytes, k) for k in KINDS}, "ctx": m.ctx, "pinned": m.pinned,
            "keep_alive_seconds": m.keep_alive_seconds, "keep_alive_left_seconds": m.keep_alive_left_seconds,
            "last_used_unix": m.last_used_unix, "loaded_unix": m.loaded_unix, "requests": m.requests,
            "tokens_generated": m.tokens_generated, "shared_with": list(m.shared_with), "busy": m.busy,
            "waiting_for_w16": m.waiting_for_w16, "device": m.device,
            "engine": {f.name: getattr(m.engine, f.name) for f in m.engine.DESCRIPTOR.fields},
            "classes": [{f.name: getattr(c, f.name) for f in c.DESCRIPTOR.fields} for c in m.classes]}


def available_dict(m) -> dict:
    d = {"name": m.name, "path": m.path, "file_bytes": m.file_bytes, "loaded": m.loaded}
    if m.error:
        return {**d, "error": m.error}
    return {**d, "architecture": m.architecture, "type_mix": dict(m.type_mix), "plan": m.plan,
            "plan_reason": m.plan_reason, "bytes": {k: getattr(m.bytes, k) for k in KINDS}, "fits": m.fits}


def pool_dict(p) -> dict:
    pool = {k: getattr(p, k) for k in ("device", "capacity_bytes", "used_bytes", "reserved_bytes",
                                       "free_bytes", "total_bytes", "w16_min_bytes")}
    return {**pool, "loading": list(p.loading), "unloading": list(p.unloading)}


def status_dict(s) -> dict:
    return {"pool": pool_dict(s.pool), "pools": [pool_dict(p) for p in s.pools] or [pool_dict(s.pool)],
            "models": [model_dict(m) for m in s.models], "events": list(s.events)}


def channel_options() -> tuple:
    """Options of every channel a client of minferd opens: a server stream (Generate, Chat,
    LoadModel) is read on the calling thread, with no hand-off through grpc's channel-spin thread
    for each message: a bare one-message stream's round trip 0.76-0.81 -> 0.46-0.54 ms on a 2-core
    machine (bench/rpc_floor.py), the floor under every time to first token. Deadlines,
    cancel() from another thread and Ctrl-C behave as before."""
    import grpc.experimental
    return ((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),)


def _session_socket(address: str) -> str | None:
    from minferd.errors import InvalidRequest
    from minferd.unix_socket import session_path, unix_path
    try:
        path = unix_path(address)
    except InvalidRequest:  # grpc says what is wrong with the address when it is used
        return None
    return session_path(path) if path else None


class Client:
    """A minferd connection that speaks plain Python: dicts, lists, str. Errors are grpc.RpcError."""

    def __init__(self, address: str | None = None, token: str | None = None, timeout: float | None = None,
                 ca_cert: str | None = None, tls: bool = False):
        import grpc
        from minferd._proto import pb2, pb2_grpc
        self.grpc, self.pb = grpc, pb2
        self.address = normalize_address(address)
        token = token if token is not None else os.environ.get("MINFERD_TOKEN")
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout = timeout  # None: unary calls get 60 s, streams run as long as they need
        if ca_cert or tls:
            roots = open(ca_cert, "rb").read() if ca_cert else None
            self.channel = grpc.secure_channel(self.address, grpc.ssl_channel_credentials(roots),
                                               options=channel_options())
        else:
            self.channel = grpc.insecure_channel(self.address, options=channel_options())
        self.stub = pb2_grpc.MinferdStub(self.channel)
        self._token = token
        self._socket_path = None if ca_cert or tls else _session_socket(self.address)
        self._session, self._session_lock = None, threading.Lock()
        self._sessions = True  # False once the daemon says it has no Session (an older one)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        self.channel.close()

    def __del__(self):  # dropped unclosed: its session's stream place goes back now, not when it idles out
        if getattr(self, "_session", None) is not None:
            with contextlib.suppress(Exception):  # grpc may be torn down already at interpreter exit
                self._session.close()

    def _request(self, kind: str, request, on_event):
        """A Generate or Chat request, on this client's Session where it is free (another thread's
        request on it: a call of its own), where no timeout is set (a session has no deadline) and
        where the daemon has Session (an older one answers UNIMPLEMENTED: calls from then on)."""
        if self._sessions and self.timeout is None and self._session_lock.acquire(blocking=False):
            try:
                return self._on_session(kind, request, on_event)
            except self.grpc.RpcError as e:
                if e.code() != self.grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._sessions = False  # a daemon from before Session: a call each from now on
            finally:
                self._session_lock.release()
        return self._stream(self.stub.Generate if kind == "generate" else self.stub.Chat, request, on_event)

    def _on_session(self, kind: str, request, on_event):
        while True:
            s = self._session = self._session or self._new_session()
            got = []
            try:
                return s.run(kind, request, lambda e: (got.append(1), on_event(e)))
            except (self.grpc.RpcError, SessionEnded) as e:  # ended OK: a draining daemon's
                self._session = None
                if got or not s.served or not (isinstance(e, SessionEnded) or e.code().name in STALE):
                    raise
            except BaseException:
                self._session = None
                raise

    def _new_session(self):
        """On the daemon's session socket where it has one (a round trip ~10x cheaper than gRPC's),
        else a gRPC Session: a TCP daemon's, one with MINFERD_SESSION_SOCKET=0, an older one."""
        if self._socket_path:
            from minferd.client_socket import SocketSession
            try:
                return SocketSession(self._socket_path, self.pb, self._token)
            except OSError:
                self._socket_path = None
        return Session(self.stub, self.pb, self.metadata)

    def _unary(self, method, request):
        return method(request, timeout=self.timeout or 60.0, metadata=self.metadata)

    def _stream(self, method, request, on_event):
        call = method(request, timeout=self.timeout, metadata=self.metadata)
        last = None
        try:
            for last in call:
                on_event(last)
        except BaseException:
            call.cancel()  # Ctrl-C or a failing callback: the daemon frees the slot at once
            raise
        return last

    def status(self) -> dict:
        return status_dict(self._unary(self.stub.GetStatus, self.pb.GetStatusRequest()))

    def available(self) -> list[dict]:
        """The model files the daemon may load, each with what a load would take."""
        return [available_dict(m) for m in self._unary(self.stub.ListAvailable, self.pb.ListAvailableRequest()).models]

    def models(self) -> list[dict]:
        return [model_dict(m) for m in self._unary(self.stub.ListModels, self.pb.ListModelsRequest()).models]

    def load(self, path: str, name: str = "", ctx: int = 0, matmul_path: str = "auto", pinned: bool = False,
             keep_alive: float | None = None, on_progress=None, parallel: int = 0, kv_tokens: int = 0,
             device: str = "") -> dict:
        """on_progress(phase, bytes_done, bytes_total); returns the loaded model. device: one of the
        daemon's ("cuda:1"), or empty for its placement."""
        req = self.pb.LoadModelRequest(name=name or "", path=str(path), ctx=ctx or 0, pinned=pinned,
                                       matmul_path=PATHS[matmul_path], parallel=parallel, kv_tokens=kv_tokens,
                                       device=device)
        if keep_alive is not None:
            req.keep_alive_seconds = keep_alive
        last = self._stream(self.stub.LoadModel, req,
                            lambda e: on_progress and on_progress(e.phase, e.bytes_done, e.bytes_total))
        return model_dict(last.model)

    def unload(self, name: str) -> int:
        return self._unary(self.stub.UnloadModel, self.pb.UnloadModelRequest(name=name)).freed_bytes

    def sampling(self, **kw):
        kw = {k: v for k, v in kw.items() if v is not None}
        return self.pb.SamplingParams(**kw)

    def generate(self, model: str, prompt: str | list[int], on_text=None, add_special: bool | None = None,
                 keep_alive: float | None = None, **sampling) -> dict:
        """Completes `prompt` (text, or token ids fed exactly); on_text(piece) as each piece arrives.
        keep_alive: the model's keep-alive from this request on (None: unchanged)."""
        req = self.pb.GenerateRequest(model=model, sampling=self.sampling(**sampling))
        if keep_alive is not None:
            req.keep_alive_seconds = keep_alive
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.ids.ids.extend(prompt)
        if add_special is not None:
            req.add_special = add_special
        return self._collect("generate", req, on_text)

    def chat(self, model: str, messages: list[dict], on_text=None, keep_alive: float | None = None,
             **sampling) -> dict:
        msgs = [self.pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
        req = self.pb.ChatRequest(model=model, messages=msgs, sampling=self.sampling(**sampling))
        if keep_alive is not None:
            req.keep_alive_seconds = keep_alive
        return self._collect("chat", req, on_text)

    def _collect(self, kind: str, req, on_text) -> dict:
        pieces, ids = [], []

        def take(e):
            pieces.append(e.text)
            if e.token_id >= 0 and not e.finish_reason:  # the closing event carries no token
                ids.append(e.token_id)
            if on_text and e.text:
                on_text(e.text)
        last = self._request(kind, req, take)
        t = last.timings if last is not None else self.pb.Timings()
        timings = {k: getattr(t, k) for k in ("prompt_tokens", "generated_tokens", "prefill_ms", "decode_ms",
                                              "prefill_tok_s", "decode_tok_s")}
        return {"text": "".join(pieces), "token_ids": ids,
                "finish_reason": last.finish_reason if last is not None else "", "timings": timings}

    def tokenize(self, model: str, text: str, add_special: bool | None = None) -> list[int]:
        req = self.pb.TokenizeRequest(model=model, text=text)
        if add_special is not None:
            req.add_special = add_special
        return list(self._unary(self.stub.Tokenize, req).ids)

    def detokenize(self, model: str, ids: list[int]) -> str:
        return self._unary(self.stub.Detokenize, self.pb.DetokenizeRequest(model=model, ids=ids)).text

    def set_options(self, name: str, pinned: bool | None = None, keep_alive: float | None = None) -> dict:
        req = self.pb.SetModelOptionsRequest(name=name)
        if pinned is not None:
            req.pinned = pinned
        if keep_alive is not None:
            req.keep_alive_seconds = keep_alive
        return model_dict(self._unary(self.stub.SetModelOptions, req))

    def demote(self, name: str) -> dict:
        return model_dict(self._unary(self.stub.Demote, self.pb.DemoteRequest(name=name)))

    def promote(self, name: str) -> dict:
        return model_dict(self._unary(self.stub.Promote, self.pb.PromoteRequest(name=name)))

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ... for the daemon ("") or one model ("model/<name>")."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self.channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout or 10.0,
                          metadata=self.metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
