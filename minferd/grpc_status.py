"""The one map from domain errors to gRPC status codes, and the decorator that applies it at the
servicer's edge (a method's domain error aborts its call with the mapped code)."""
from __future__ import annotations

import inspect

import grpc

from minferd.decode_guard import Refused
from minferd.errors import (
    Aborted,
    Busy,
    Conflict,
    InvalidRequest,
    MinferdError,
    ModelFileError,
    NotFound,
    PermissionDenied,
)
from minferd.pool.ledger import PoolExhausted

STATUS = {  # the one map from domain errors to gRPC status codes
    ModelFileError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    PoolExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    Aborted: grpc.StatusCode.ABORTED,  # its model was unloaded under it
    MemoryError: grpc.StatusCode.RESOURCE_EXHAUSTED,  # a device out of memory mid-request (CuPy's too)
    Busy: grpc.StatusCode.RESOURCE_EXHAUSTED,  # every generation place taken: a full queue
}


def status_code(e: BaseException) -> grpc.StatusCode:
    for cls, code in STATUS.items():
        if isinstance(e, cls):
            return code
    return grpc.StatusCode.UNAVAILABLE if isinstance(e, MinferdError) else grpc.StatusCode.INTERNAL


def edge(method):
    """Run a servicer method; a domain error aborts the call with its mapped code."""
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except Exception as e:
            self._abort(context, e)

    def streaming(self, request, context):
        try:
            yield from method(self, request, context)
        except Refused:
            raise
        except Exception as e:
            self._abort(context, e)

    wrapper = streaming if inspect.isgeneratorfunction(method) else unary
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper
