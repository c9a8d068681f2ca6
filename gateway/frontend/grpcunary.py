"""The frame of the gRPC front end's unary RPCs (frontend/grpc.py builds them): timing,
metrics, the access record and the one mapping of GatewayError to a gRPC status; and the
ModelInfer handler itself.

Compiled with mypyc where the install has a C compiler (setup.py): every gRPC inference runs
through it, and grpcio's own work is the floor the gateway is measured against (the load
benchmark's "× floor"), so the gateway's Python on top of it is what is left to shrink.
Compiled coroutine functions are coroutine functions to ``inspect``, so grpc awaits
``Unary.run`` as it would a Python ``async def``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
from grpc import aio

from ..codec.bounds import check_names
from ..codec.grpcscan import InferScan
from ..config.security import Limits
from ..dataplane import AnswerSink, DataPlane, StreamedMessage
from ..errors import INTERNAL_MESSAGE, GatewayError, InvalidRequest, UpstreamError
from ..observability.access import AccessRecord
from ..observability.metrics import SERVER_LEVEL, Metrics, Observer, RouteLabel
from ..security.guard import Gate
from .kinds import GRPC_KINDS, admit_grpc

__all__ = ["ANSWER_SINK", "CALL_METADATA", "Admit", "Infer", "Seen", "Unary", "abort_with", "call_metadata",
           "failure_code", "grpc_trailers"]

log = logging.getLogger("oip_gateway.grpc")

# The client's metadata of the call being served, as grpc.aio read it to find the call's handler
# (``HandlerCallDetails.invocation_metadata``): set by the front end's generic handler
# (frontend/grpc.py ``Service``), in the call's own task — grpc.aio asks for the handler and then
# runs it in one coroutine (server.pyx.pxi ``_handle_rpc``), so each call sees its own and no
# other's. ``context.invocation_metadata()`` would build the same tuple again (a named tuple per
# entry) on every inference.
CALL_METADATA: ContextVar[tuple[Any, ...] | None] = ContextVar("oip_gateway_call_metadata", default=None)
# Where the call's answer may be streamed (the gateway's own listener sets it, as CALL_METADATA;
# grpc.aio offers none): ModelInfer hands it to the data plane.
ANSWER_SINK: ContextVar[AnswerSink | None] = ContextVar("oip_gateway_answer_sink", default=None)


def call_metadata(context: Any) -> tuple[Any, ...]:
    """The client's metadata of this call: (key, value) pairs (bytes values for ``-bin`` keys)."""
    metadata = CALL_METADATA.get()
    if metadata is None:  # a handler grpc found some other way: ask the context
        metadata = tuple(context.invocation_metadata() or ())
    return metadata


def grpc_trailers(err: GatewayError) -> tuple[tuple[str, str | bytes], ...]:
    """The trailing metadata of a failed call: a load refusal's retry hint (Retry-After's gRPC
    spellings; grpc-retry-pushback-ms is what gRPC's own retry policy reads), and a backend's
    ``grpc-status-details-bin``, relayed as it came."""
    if isinstance(err, UpstreamError) and err.status_details is not None:
        return (("grpc-status-details-bin", err.status_details),)
    if err.retry_after is None:
        return ()
    return (("retry-after", str(err.retry_after)), ("grpc-retry-pushback-ms", str(err.retry_after * 1000)))


def failure_code(exc: Exception) -> str:
    """The gRPC status a call that failed with ``exc`` ends with (its metrics' ``code``)."""
    return exc.grpc_code if isinstance(exc, GatewayError) else "INTERNAL"


async def abort_with(context: Any, exc: Exception, record: AccessRecord | None, api: str) -> None:
    """The one mapping of a failed call to its gRPC status: a GatewayError's own code, message
    and retry hint (its message is the access record's reason, unless it is the backend's);
    anything else INTERNAL, logged with its traceback. Aborts the call: raises AbortError."""
    if isinstance(exc, GatewayError):
        if record is not None and not isinstance(exc, UpstreamError):
            record.reason = exc.message
        await context.abort(grpc.StatusCode[exc.grpc_code], exc.message, grpc_trailers(exc))
    else:
        log.error("unhandled error in %s", api, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


class Admit:
    """``admit(ctx, rpc, model, version)``: the name limits, then the guard's check
    (security/guard.py) of a call that names ``model``. Raises LimitExceeded, Unauthenticated,
    PermissionDenied or RateLimited (a guard's refusal counted in the metrics first)."""

    def __init__(self, gate: Gate, limits: Limits, metrics: Metrics | None) -> None:
        self.gate = gate
        self.limits = limits
        self.metrics = metrics

    def __call__(self, ctx: Any, rpc: str, model: str = "", version: str = "") -> None:
        check_names(model, version, self.limits)
        guard = self.gate.current
        if guard is None:
            return
        try:
            admit_grpc(guard, GRPC_KINDS[rpc], model, version, call_metadata(ctx))
        except GatewayError as err:
            if self.metrics is not None:
                self.metrics.refused("grpc", err)
            raise


class Seen:
    """What a call is about, as far as it is known: model and version (its route label is
    looked up when the call ends: the backend it went to)."""

    def __init__(self) -> None:
        self.model = ""
        self.version = ""

    def note(self, model: str, version: str) -> None:
        self.model = model
        self.version = version


class Unary:
    """One unary RPC: ``fn(request, context, seen)`` answers it; ``run`` is grpc's handler."""

    def __init__(self, api: str, fn: Callable[[Any, Any, Seen], Awaitable[Any]],
                 route_label: Callable[[str, str], RouteLabel], metrics: Metrics | None,
                 begin: Callable[[Any, Any], AccessRecord | None] | None) -> None:
        self.api = api
        self.fn = fn
        self.route_label = route_label
        self.metrics = metrics
        self.begin = begin  # None: no access log

    async def run(self, request: Any, context: Any) -> Any:
        start = time.perf_counter()
        code = "OK"
        # Filled by the handler as soon as it knows the model: a failed call is then
        # still counted under its route and backend.
        seen = Seen()
        record = self.begin(context, request) if self.begin is not None else None
        try:
            result = await self.fn(request, context, seen)
            if record is not None and isinstance(result, bytes):
                sink = ANSWER_SINK.get() if not result else None
                record.bytes_out = sink.sent if sink is not None and sink.opened else len(result)
            return result
        except aio.AbortError:
            raise
        except Exception as exc:
            code = failure_code(exc)
            await abort_with(context, exc, record, self.api)
        except asyncio.CancelledError:
            # grpc cancels the handler's task when the client cancelled or went away (never
            # for a backend's fault: that arrives as an error): the client's doing.
            code = "CANCELLED"
            if record is not None:
                record.reason = "the client cancelled the call"
            raise
        finally:
            metrics = self.metrics
            if metrics is not None:
                # After the call: the backend it went to (a split's side, a header route).
                label = self.route_label(seen.model, seen.version) if seen.model else SERVER_LEVEL
                metrics.observe("grpc", self.api, label, code, time.perf_counter() - start, seen.model,
                                seen.version, record)
        return None  # not reached: abort raises


class Infer:
    """ModelInfer (spec "Inference", GRPC): the request's routing fields and hard limits read
    from its bytes, which go to the data plane unparsed. Hands back the data plane's
    coroutine rather than awaiting it: one coroutine less per call."""

    def __init__(self, plane: DataPlane, scan: InferScan, bytes_in: Observer | None, admit: Admit) -> None:
        self.plane = plane
        self.scan = scan
        self.bytes_in = bytes_in
        self.admit = admit

    def __call__(self, message: bytes | StreamedMessage, ctx: Any, seen: Seen) -> Awaitable[bytes]:
        sequence = self.check(message, ctx, seen)
        return self.plane.infer_grpc(message, seen.model, seen.version, ctx.time_remaining(), sequence,
                                     call_metadata(ctx), ANSWER_SINK.get())

    def check(self, message: bytes | StreamedMessage, ctx: Any, seen: Seen) -> str | None:
        """The request's checks before the data plane (both paths: h2infer.py serves it from
        callbacks): routing fields and hard limits, then the guard; ``seen`` notes the model
        first, so a refusal is counted under its route. Returns the ``sequence_id``."""
        # A large request may still be arriving (h2upload.py): routed from its head, the fields
        # before its raw contents, which are all the scan reads of a whole one anyway.
        head = message if isinstance(message, bytes) else message.head
        model, version, sequence = self.scan.scan(head)  # routing fields + hard limits
        if not model:
            raise InvalidRequest("ModelInferRequest.model_name is required")
        if self.bytes_in is not None:
            self.bytes_in.observe(len(message))
        seen.note(model, version)
        self.admit(ctx, "ModelInfer", model, version)
        return sequence
