"""ModelInfer on the gateway's own gRPC listener (h2listen.py) from callbacks: a whole,
uncompressed request read, checked, routed and sent to the backend, and its answer written
back, from the two connections' protocol callbacks — no task, future or coroutine chain.

Every check, status, metric and access record is the awaited path's (grpcunary.py ``Unary.run``
around ``Infer``); what the data plane cannot send at once (``DataPlane.infer_grpc_now``: a
split, mirror or hold, no stream free on the backend's connections) or sends again (Again: a
retry) goes on in a task from where the callbacks left it, never checked or counted twice.

Why: the task, the futures and the coroutines between the front end and the backend's stream
were ~13 % of the gateway's instructions on a small call (callgrind: 182k → 158k per call;
docs/design-notes.md, "gRPC inference from callbacks").
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from ..dataplane import Again, GrpcOutcome, Pending, RouteLabel
from ..errors import INTERNAL_MESSAGE, GatewayError, UpstreamError
from ..observability.access import AccessRecord, attach
from ..observability.metrics import SERVER_LEVEL
from .grpcunary import Infer, Seen, Unary, grpc_trailers
from .h2calls import Call

__all__ = ["InferNow"]

log = logging.getLogger("oip_gateway.grpc")

_OK = grpc.StatusCode.OK
_INTERNAL = grpc.StatusCode.INTERNAL


def metadata_of(call: Call) -> Any:
    """The client's metadata, as the data plane takes it (a ``-bin`` entry's value is bytes)."""
    return call.context.invocation_metadata()


class InferNow:
    """``serve(call, message)``: ModelInfer from callbacks (else in a task from where they
    stopped). ``unary`` and ``infer`` are the awaited path's own (frontend/grpc.py), so both
    paths answer alike; ``record`` opens a call's access record by hand (a context variable set
    from a callback would outlive the call)."""

    def __init__(self, unary: Unary, infer: Infer,
                 record: Callable[[Any, bytes], AccessRecord | None] | None) -> None:
        self.unary = unary
        self.infer = infer
        self.record = record

    def serve(self, call: Call, message: bytes) -> None:
        start = time.perf_counter()
        ctx = call.context
        record = self.record(ctx, message) if self.record is not None else None
        infer = self.infer
        seen = Seen()
        try:
            sequence = infer.check(message, ctx, seen)
            model, version = seen.model, seen.version
            going = Going(self, call, message, model, version, sequence, start, record)
            taken = infer.plane.infer_grpc_now(message, model, version, ctx.time_remaining(), sequence,
                                               metadata_of(call), call, record, going.ended)
        except Exception as exc:
            self.complete(call, exc, None, seen.model, seen.version, start, record)
            return
        if taken is None:
            call.task = asyncio.get_running_loop().create_task(
                self.rest(call, message, model, version, sequence, start, record, 0))
            return
        going.label, going.pending = taken
        call.task = going

    async def rest(self, call: Call, message: bytes, model: str, version: str, sequence: str | None,
                   start: float, record: AccessRecord | None, tried: int) -> None:
        """The awaited path from where the callbacks stopped (checked and admitted already)."""
        if record is not None:
            attach(record)  # (this task's own context: the backend notes its endpoint there)
        ctx = call.context
        try:
            result = await self.infer.plane.infer_grpc(message, model, version, ctx.time_remaining(), sequence,
                                                       metadata_of(call), call, tried)
        except asyncio.CancelledError as cancel:
            self.complete(call, cancel, None, model, version, start, record)
            raise
        except Exception as exc:
            self.complete(call, exc, None, model, version, start, record)
            return
        self.complete(call, result, None, model, version, start, record)

    def complete(self, call: Call, result: bytes | memoryview | BaseException, label: RouteLabel | None,
                 model: str, version: str, start: float, record: AccessRecord | None) -> None:
        """The call's end, as ``Unary.run`` and ``Call.run_unary`` end it: the answer or the
        status, the metrics and the access record. Never raises (it runs inside protocol
        callbacks)."""
        unary = self.unary
        code = "OK"
        try:
            if not isinstance(result, BaseException):
                if record is not None:
                    record.bytes_out = call.sent if call.opened and not result else len(result)
                if call.started:  # relayed: the answer went through the sink
                    call.finish(_OK, "", (), True)
                else:
                    call.answer(bytes(result) if isinstance(result, memoryview) else result)
            elif isinstance(result, asyncio.CancelledError):
                # The client reset the stream or went away, or its deadline passed
                # (DEADLINE_EXCEEDED then, as grpc answers): the client's doing.
                code = "CANCELLED"
                if record is not None:
                    record.reason = "the client cancelled the call"
                call.cancelled()
            elif isinstance(result, GatewayError):
                code = result.grpc_code
                if record is not None and not isinstance(result, UpstreamError):
                    record.reason = result.message
                call.finish(grpc.StatusCode[code], result.message, grpc_trailers(result), call.started)
            else:
                code = "INTERNAL"
                log.error("unhandled error in %s", unary.api, exc_info=result)
                call.finish(_INTERNAL, INTERNAL_MESSAGE, (), call.started)
            metrics = unary.metrics
            if metrics is not None:
                if label is None:
                    label = unary.route_label(model, version) if model else SERVER_LEVEL
                metrics.observe("grpc", unary.api, label, code, time.perf_counter() - start, model, version, record)
        except Exception:
            log.exception("unexpected error ending gRPC call %s", call.context.method)
        finally:
            call.conn.done(call)


class Going:
    """One ModelInfer under way from callbacks: what the listener holds as the call's running
    work (``cancel()``, ``done()``: as a task), and the data plane's ``done`` (:meth:`ended`)."""

    __slots__ = ("call", "cancelled", "label", "message", "model", "over", "owner", "pending", "record", "sequence",
                 "start", "version")

    def __init__(self, owner: InferNow, call: Call, message: bytes, model: str, version: str, sequence: str | None,
                 start: float, record: AccessRecord | None) -> None:
        self.owner = owner
        self.call = call
        self.message = message
        self.model = model
        self.version = version
        self.sequence = sequence
        self.start = start
        self.record = record
        self.label: RouteLabel | None = None
        self.pending: Pending | None = None
        self.over = False
        self.cancelled = False

    def done(self) -> bool:
        return self.over

    def cancel(self) -> bool:
        """The client reset the stream, went away or let its deadline pass: the backend's
        stream is reset, and :meth:`ended` then comes with CancelledError."""
        if self.over or self.pending is None:
            return False
        self.cancelled = True
        self.pending.cancel()
        return True

    def ended(self, result: GrpcOutcome) -> None:
        """The data plane's outcome, from the backend connection's callbacks."""
        self.over = True
        # The backend's call holds this (its Settled's chain of callbacks ends in this method):
        # let go of it so the pair is not a cycle left to the collector.
        self.pending = None
        call = self.call
        if self.cancelled or (call.answered and not isinstance(result, BaseException)):
            result = asyncio.CancelledError()  # (a relayed answer ends with b"" even when cut off)
        if isinstance(result, Again):
            if call.answered:
                result = asyncio.CancelledError()
            else:
                owner = self.owner
                call.task = asyncio.get_running_loop().create_task(
                    owner.rest(call, self.message, self.model, self.version, self.sequence, self.start, self.record,
                               result.tried))
                return
        self.owner.complete(call, result, self.label, self.model, self.version, self.start, self.record)
