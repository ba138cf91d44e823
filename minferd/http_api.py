"""The OpenAI-compatible HTTP front (`minferd serve --http HOST:PORT`): /v1/models, /v1/completions
and /v1/chat/completions, plain and streamed as server-sent events, over the same host (pool,
engines) as the gRPC servicer. Starlette on uvicorn, in a thread of the daemon.

A request naming a model that is not loaded but is a file of --models-dir (by stem or file name)
loads it first, as Ollama does. The token rule is gRPC's: where the daemon has a token, every
call needs `Authorization: Bearer <token>`. Errors are OpenAI error objects.

`/` is a status page (minferd/static/status.html: the pool as one bar by model and kind, each
model's plan, KV blocks and sequences), refreshing itself from `/v1/minferd/status` (GetStatus's
content as JSON). The page holds no data, so it alone is served without the token; the page
sends the token it is given as `/#token=...`.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json

import anyio
import threading
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.routing import Route

from minferd import config
from minferd.auth import bearer_matches
from minferd.available import ensure_loaded, model_files
from minferd.errors import (Aborted, Conflict, InvalidRequest, MinferdError, ModelFileError, NotFound, PermissionDenied,
                            excerpt)
from minferd.host import Host
from minferd.openai_reply import Reply
from minferd.model.sampler import SamplingParams
from minferd.pool.ledger import PoolExhausted
from minferd.request_checks import CHAT_ROLES, check_chat, check_room, check_text_fits

# (HTTP status, OpenAI error type) per domain error; anything else is a 500.
ERRORS = ((InvalidRequest, 400, "invalid_request_error"), (ModelFileError, 400, "invalid_request_error"),
          (NotFound, 404, "not_found_error"), (PermissionDenied, 403, "permission_error"),
          (PoolExhausted, 503, "server_error"), (MemoryError, 503, "server_error"), (Conflict, 409, "conflict_error"),
          (Aborted, 503, "server_error"))
SAMPLING = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "repeat_penalty": float,
            "seed": int, "max_tokens": int}
DEFAULT_MAX_TOKENS = SamplingParams().max_tokens


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


def error_response(e: BaseException) -> JSONResponse:
    if isinstance(e, HttpError):
        status, kind, code = e.status, e.kind, e.code
    else:
        status, kind, code = next(((s, k, None) for cls, s, k in ERRORS if isinstance(e, cls)),
                                  (500, "server_error", None))
        if status == 404:
            code = "model_not_found"
    message = str(e) if status != 500 else f"internal error: {type(e).__name__}"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


class TokenGate:
    """Every call but the page's needs `Authorization: Bearer <token>` where the daemon has one (the
    page holds no data: its fetches send the token). Plain ASGI: Starlette's BaseHTTPMiddleware,
    which ran here before, runs each request's app in a task of its own behind memory streams."""

    def __init__(self, app, token: str | None):
        self.app, self.expected = app, f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send):
        if self.expected and scope["type"] == "http" and scope["path"] != "/":
            got = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not bearer_matches(got.decode("latin-1") if got is not None else None, self.expected):
                deny = error_response(HttpError(401, "missing or wrong bearer token", "authentication_error",
                                                "invalid_api_key"))
                return await deny(scope, receive, send)
        await self.app(scope, receive, send)


class OpenAIFront:
    def __init__(self, host: Host, models_dirs, keep_alive: float, token: str | None = None, metrics=None,
                 max_requests: int = config.HTTP_MAX_REQUESTS):
        self.host, self.models_dirs, self.keep_alive = host, tuple(models_dirs), keep_alive
        self.metrics = metrics
        if not isinstance(max_requests, int) or max_requests < 1:
            raise InvalidRequest(f"http_max_requests {excerpt(repr(max_requests))}: a whole number >= 1")
        # A generation blocks a thread while it waits for its next token (or its model's load):
        # on Starlette's shared pool of 40, 40 of them stalled every other call of the front.
        # Each gets a thread of this pool instead, as many as may be in progress at once.
        self.max_requests, self.in_progress = max_requests, 0
        self.request_threads = anyio.CapacityLimiter(max_requests)
        self.app = Starlette(routes=[
            Route("/", self.status_page, methods=["GET"]),
            Route("/v1/minferd/status", self.status, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ], middleware=[Middleware(TokenGate, token=token)],
            exception_handlers={HttpError: self._error, MinferdError: self._error, MemoryError: self._error,
                                Exception: self._error})

    @staticmethod
    async def _error(request: Request, e: Exception) -> JSONResponse:
        return error_response(e)

    # ---- the status page ---------------------------------------------------------------------
    async def status_page(self, request: Request):
        html, csp = _status_page()
        return HTMLResponse(html, headers={"Content-Security-Policy": csp, "Cache-Control": "no-store",
                                           "X-Content-Type-Options": "nosniff"})

    async def status(self, request: Request):
        return JSONResponse(self.host.status())

    # ---- /v1/models ---------------------------------------------------------------------------
    def files(self) -> dict[str, Path]:
        return model_files(self.models_dirs)

    async def models(self, request: Request):
        loaded = {m["name"]: m for m in self.host.status()["models"]}
        rows = [{"id": n, "object": "model", "created": int(m["loaded_unix"]), "owned_by": "minferd", "loaded": True}
                for n, m in loaded.items()]
        rows += [{"id": stem, "object": "model", "created": int(p.stat().st_mtime), "owned_by": "minferd",
                  "loaded": False} for stem, p in (await run_in_threadpool(self.files)).items() if stem not in loaded]
        return JSONResponse({"object": "list", "data": rows})

    def _model(self, name) -> str:
        """A loaded model's name, loading a file of --models-dir of that name first where needed."""
        if not isinstance(name, str) or not name:
            raise HttpError(400, "model: a model name is required")
        ensure_loaded(self.host, self.models_dirs, name, self.keep_alive)
        return name

    # ---- requests -----------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict:
        limit = config.MAX_HTTP_BODY_BYTES
        said = request.headers.get("content-length", "")
        if said.isdigit() and int(said) > limit:
            raise HttpError(413, f"request body of {said} bytes, at most {limit}")
        parts, size = [], 0
        async for part in request.stream():  # counted as it comes: a body that lies about its length too
            size += len(part)
            if size > limit:
                raise HttpError(413, f"request body past {limit} bytes")
            parts.append(part)
        raw = b"".join(parts)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"request body is not JSON: {excerpt(str(e))}") from None
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        try:  # json.loads lets lone surrogates through (from an escape like \ud800, or encoded ones)
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise HttpError(400, f"request body holds text that is not valid Unicode (a lone surrogate at "
                                 f"{e.start}): {excerpt(e.object[max(0, e.start - 20):e.start + 20])}") from None
        if body.get("n", 1) != 1:
            raise HttpError(400, "n: only 1 completion per request is supported")
        return body

    def _params(self, body: dict, n_prompt: int, ctx: int) -> SamplingParams:
        kw = {}
        for field, kind in SAMPLING.items():
            v = body.get(field)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
                raise HttpError(400, f"{field}: expected a number, got {excerpt(repr(v))}")
            kw[field] = kind(v)
        if kw.get("seed") is not None and kw["seed"] < 0:
            kw["seed"] &= (1 << 64) - 1  # OpenAI clients send signed seeds
        if "max_tokens" in kw:
            check_room(n_prompt, kw["max_tokens"], ctx)
        kw.setdefault("max_tokens", max(1, min(DEFAULT_MAX_TOKENS, ctx - n_prompt)))
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise HttpError(400, "stop: a string or a list of strings")
        return SamplingParams(**kw, stop=tuple(stop))

    def _prompt_ids(self, name: str, prompt) -> list[int]:
        lm = self.host.get(name)
        if isinstance(prompt, str):
            check_text_fits(lm.ws.tokenizer, prompt, lm.ctx)
            return lm.ws.tokenizer.encode(prompt, add_special=True)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise HttpError(400, "prompt: a string or a list of token ids (one prompt per request)")

    def _chat_ids(self, name: str, messages) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise HttpError(400, "messages: a list of one or more messages")
        msgs = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: the text ones, in order
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(content, str):
                raise HttpError(400, f"messages: each needs a role of {', '.join(sorted(CHAT_ROLES))} and text content")
            msgs.append({"role": m["role"], "content": content})
        check_chat([(m["role"], m["content"]) for m in msgs])  # the bounds gRPC's Chat meets
        lm = self.host.get(name)
        text = lm.ws.tokenizer.render_chat(msgs)
        check_text_fits(lm.ws.tokenizer, text, lm.ctx)
        return lm.ws.tokenizer.encode(text, add_special=True)

    async def completions(self, request: Request):
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._serve(request, chat=True)

    async def _in_thread(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.request_threads)

    async def _serve(self, request: Request, chat: bool):
        if self.in_progress >= self.max_requests:  # the event loop's thread alone counts: no lock
            raise HttpError(429, f"{self.in_progress} requests in progress, at most {self.max_requests} "
                            "(--http-max-requests); retry later", "rate_limit_error", "too_many_requests")
        self.in_progress += 1
        streaming = False
        try:
            response = await self._generate(request, chat)
            streaming = isinstance(response, StreamingResponse)
            return response
        finally:
            if not streaming:  # a stream counts until it ends (sse's finally)
                self.in_progress -= 1

    async def _generate(self, request: Request, chat: bool):
        body = await self._body(request)
        cancel, t0 = threading.Event(), time.perf_counter()
        # One hand-off to a worker thread for the whole start (a load on demand, the tokenizer, the
        # first chunks): each costs two thread wakes, and four of them stood between a short
        # request and its first chunk (s47, 2 cores, with TokenGate: the tiny model's first chunk
        # 11.8 / 12.0 -> 9.3 / 10.0 ms in turns, a gRPC Session's 8.6-9.1 in the same daemons).
        name, ids, reply, rest, head = await self._in_thread(self._start, body, chat, cancel)

        def ended():
            cancel.set()  # the client went away (or the answer is complete): the engine drops it
            if self.metrics:
                r = reply.result
                self.metrics.request(name, r.finish_reason if r else "cancelled", len(ids),
                                     len(r.token_ids) if r else reply.pieces, time.perf_counter() - t0,
                                     r.timings if r else None)

        if not body.get("stream"):
            try:
                return JSONResponse(await self._in_thread(reply.whole, rest))
            finally:
                ended()

        async def sse():
            try:
                yield ""  # primed below
                for chunk in head:
                    yield f"data: {json.dumps(chunk)}\n\n"
                while (chunk := await self._in_thread(next, rest, None)) is not None:
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                ended()
                self.in_progress -= 1

        # Started before it is handed over: a response that is never sent (the client left first)
        # drops a started generator, which asyncio closes, so its finally still runs.
        stream = sse()
        await stream.__anext__()
        return ClosingStream(stream, media_type="text/event-stream")

    def _start(self, body: dict, chat: bool, cancel: threading.Event):
        """In a worker thread: (name, ids, reply, what is to come, what came): a stream's chunks after
        and up to its first token's; a whole answer's events, not started, and None. A refusal before the first chunk
        raises here, so it is still an HTTP error."""
        name = self._model(body.get("model"))
        ids = (self._chat_ids if chat else self._prompt_ids)(name, body.get("messages") if chat else body.get("prompt"))
        params = self._params(body, len(ids), self.host.get(name).ctx)
        keep = body.get("keep_alive")  # Ollama's field, in seconds: 0 unloads once idle, negative keeps
        if keep is not None:
            if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep != keep:
                raise HttpError(400, f"keep_alive: seconds as a number, got {excerpt(repr(keep))}")
            self.host.set_keep_alive(name, float(keep))
        reply = Reply(name, chat, len(ids), bool((body.get("stream_options") or {}).get("include_usage")))
        events = self.host.stream(name, ids, params, cancel=cancel)
        if not body.get("stream"):
            return name, ids, reply, events, None
        try:
            chunks = reply.chunks(next(events, None), events)
            return name, ids, reply, chunks, list(itertools.islice(chunks, 2 if chat else 1))  # a chat's role first
        except BaseException:
            events.close()  # its request ends at the engine's next step
            raise


class ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends. When a client
    leaves mid-stream Starlette cancels the sending task and leaves the generator suspended at its
    yield; its finally, which ends the generation and frees the request's place, then ran only
    when the garbage collector got to it (seconds, or never: a --http-max-requests place lost)."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


@functools.lru_cache(maxsize=1)
def _status_page() -> tuple[str, str]:
    """The page (minferd/static/status.html) and a policy that lets only its own script run."""
    html = (Path(__file__).parent / "static" / "status.html").read_text()
    script = html.split("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; connect-src 'self'; "
           "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
    return html, csp


def start(front: OpenAIFront, host: str, port: int):
    """uvicorn in a daemon thread; returns the server (server.should_exit = True stops it)."""
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(front.app, host=host, port=port, log_level="warning", lifespan="off",
                                           access_log=False))
    thread = threading.Thread(target=server.run, name="minferd-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise MinferdError(f"the HTTP front did not start on {host}:{port} (in use?)")
    server.thread = thread
    return server
