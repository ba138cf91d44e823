"""A request that does not parse gets INVALID_ARGUMENT naming the method, not gRPC's INTERNAL.

gRPC runs a method's request deserializer before any servicer code; when it raises (invalid UTF-8
in a string field, which protobuf refuses, or bytes that are no message at all), the call ends
INTERNAL "Exception deserializing request!" and the daemon's log gets a traceback, for nothing
but a client's bad bytes (bench/hostile_sweep.py's utf8_edges). This interceptor swaps the
deserializer of every method for one that hands an Undecodable placeholder on, and the behavior
for one that aborts on it (a streaming-request method's, Session's or reflection's, when its
iterator reaches the message that did not parse).
"""
from __future__ import annotations

import grpc

from minferd.errors import excerpt


class Undecodable:
    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _safe(deserialize):
    def parse(data):
        try:
            return deserialize(data)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, or a deserializer's own
            return Undecodable(str(e))
    return parse


def _guarded(behavior, method: str):
    def call(request, context, *callback):  # a non-blocking streaming behavior also gets its sender
        if isinstance(request, Undecodable):
            _refuse(context, method, request)
        return behavior(request, context, *callback)
    # gRPC reads this mark off the behavior (health's Watch has it) to pass send_response_callback.
    if getattr(behavior, "experimental_non_blocking", False):
        call.experimental_non_blocking = True
    return call


def _checked(requests, context, method: str):
    for request in requests:
        if isinstance(request, Undecodable):
            _refuse(context, method, request)
        yield request


class Refused(Exception):
    """The call is aborted INVALID_ARGUMENT already: a servicer's own error mapping lets it pass."""


def _refuse(context, method: str, request: Undecodable):
    try:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{method}: the request does not parse (invalid UTF-8 in a string field, or not a "
                      f"protobuf message): {excerpt(request.why)}")
    except Exception:  # noqa: BLE001 - gRPC's abort raises a bare Exception
        raise Refused(method) from None


def _guarded_requests(behavior, method: str):
    def call(requests, context, *callback):
        return behavior(_checked(requests, context, method), context, *callback)
    return call


class DecodeGuard(grpc.ServerInterceptor):
    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.request_streaming:
            kind = "stream_stream" if handler.response_streaming else "stream_unary"
            return handler._replace(request_deserializer=_safe(handler.request_deserializer),
                                    **{kind: _guarded_requests(getattr(handler, kind), method)})
        if handler.response_streaming:
            return handler._replace(request_deserializer=_safe(handler.request_deserializer),
                                    unary_stream=_guarded(handler.unary_stream, method))
        return handler._replace(request_deserializer=_safe(handler.request_deserializer),
                                unary_unary=_guarded(handler.unary_unary, method))
