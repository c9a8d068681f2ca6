"""What a gRPC backend's call ends with, in the gateway's terms: a failed call as the error of the
party at fault (:func:`mapped_error`), and a call sent from callbacks as its ``GrpcOutcome``
(:func:`call_outcome`). ``GrpcBackend`` (grpc.py) and ModelStreamInfer (streams.py) read their
calls' failures here; it is on the path of every call, so compiled with them (setup.py).

A backend is untrusted input here too (docs/design-notes.md, "Backends are untrusted input").
grpc-core reports what went wrong on the backend's side in the status codes of a client's
faults — a stream reset with CANCEL as CANCELLED, an answer over
``grpc.max_receive_message_length`` as RESOURCE_EXHAUSTED — so every failed call is read by
:func:`~.grpcfault.fault` first: what grpc-core itself says of the exchange becomes the error of
the party at fault (UpstreamReset, UpstreamTooLarge, UpstreamEncoding, UpstreamFraming,
UpstreamTimeout, or a Refused when nothing can have run); only a status the backend chose is
relayed as its own (UpstreamError). The gateway's own client (``h2channel.py``) needs no reading
of words: its CallError carries the fault kind it saw, or none for a status the backend sent.
"""
from __future__ import annotations

from grpc import aio

from ..dataplane import AGAIN, RETRY, AnswerSink, GrpcOutcome
from ..errors import (
    BadUpstreamResponse,
    NoEndpointAvailable,
    UpstreamEncoding,
    UpstreamError,
    UpstreamFraming,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from .base import Backend
from .grpc_endpoint import GrpcEndpoint
from .grpcfault import Fault, fault, never_sent, own_status, seconds
from .h2frames import CallError
from .refusal import Refused, is_not_ready_message

__all__ = ["call_outcome", "mapped_error"]


def mapped_error(backend: Backend[GrpcEndpoint], ep: GrpcEndpoint, exc: aio.AioRpcError | CallError,
                 tmo: float | None, model: str = "", version: str = "", stateful: bool = False) -> Exception:
    """The client's error on ``ep`` (an endpoint of ``backend``, called with the deadline ``tmo``)
    as the gateway's. A ``stateful`` request (one carrying a ``sequence_id``) whose connection went
    after it may have been sent is an UpstreamReset, never a Refused: a step of a sequence must not
    run twice (docs/config.md "Safe retries")."""
    if isinstance(exc, CallError):
        code, details = exc.code, exc.details
        found = exc.fault or own_status(code, details)
        unsent = exc.never_sent
        status_details = exc.status_details
    else:
        code, details = exc.code().name, exc.details() or ""
        found = fault(code, details)
        unsent = never_sent(details)
        status_details = next((v for k, v in exc.trailing_metadata() or () if k == "grpc-status-details-bin"
                               and isinstance(v, bytes)), None)
    where = f"backend '{backend.name}' endpoint {ep.address}"
    if found is not None:
        kind, why = found
        if kind == Fault.TIMEOUT:
            return UpstreamTimeout(f"{where}: did not answer within {seconds(tmo)}")
        if kind == Fault.TRANSPORT:
            if stateful and not unsent:
                backend.transport_failed(ep)
                return UpstreamReset(f"{where}: {details} (a request of a sequence: not sent again, it may "
                                     "have run)")
            return Refused(NoEndpointAvailable(f"{where}: {details}"), kind=Refused.TRANSPORT)
        if kind == Fault.UNPROCESSED:
            # RFC 9113 sections 6.8 and 8.7: the backend says it did not process the stream.
            return Refused(NoEndpointAvailable(f"{where}: {why}"), kind=Refused.TRANSPORT)
        if kind == Fault.REFUSED_STREAM:
            return Refused(NoEndpointAvailable(f"{where}: {why}"), kind=Refused.BUSY)
        backend.transport_failed(ep)  # a backend that breaks exchanges off counts towards its ejection
        if kind == Fault.TOO_LARGE:
            return UpstreamTooLarge(f"{where}: {why}")
        if kind == Fault.ENCODING:
            return UpstreamEncoding(f"{where}: {why}")
        if kind == Fault.FRAMING:
            return UpstreamFraming(f"{where}: {why}")
        if kind == Fault.RESET:
            return UpstreamReset(f"{where}: {why}")
        return BadUpstreamResponse(f"{where}: {why}")
    if code == "UNAVAILABLE":
        # The backend refused the request itself (Triton: queue full, model not ready).
        error = UpstreamError(details or code, grpc_code=code, status_details=status_details)
        return backend.refusal(ep, model, version, error, True) if is_not_ready_message(error.message) else \
            Refused(error, kind=Refused.BUSY)
    # The backend's own error: relay its code, message and details unchanged.
    return UpstreamError(details or code, grpc_code=code, status_details=status_details)


def call_outcome(backend: Backend[GrpcEndpoint], ep: GrpcEndpoint, result: bytes | memoryview | BaseException,
                 tmo: float | None, model: str, version: str, stateful: bool, sink: AnswerSink | None,
                 others: int) -> GrpcOutcome:
    """What a call sent from callbacks (``GrpcBackend.infer_grpc_now``) ends with, as
    ``GrpcBackend._call`` and ``Backend.attempt`` would have ended it: the answer, the error, or
    AGAIN / RETRY (``others``: the endpoints a retry may go to)."""
    if not isinstance(result, BaseException):
        if ep.health.failures or ep.health.check_failures:  # live traffic is evidence too
            ep.health.succeeded()
        return result
    if not isinstance(result, CallError):
        return result  # the caller's cancel
    if result.fault is not None and result.fault[0] == Fault.REFUSED_STREAM and (sink is None or not sink.opened):
        return AGAIN  # (Channel.unary sends a refused stream once more itself)
    error = mapped_error(backend, ep, result, tmo, model, version, stateful)
    if sink is not None and sink.opened and isinstance(error, Refused):
        # Part of the answer reached the client: nothing is sent again (as GrpcBackend._call).
        inner = error.error
        error = inner if isinstance(inner, UpstreamError) else UpstreamReset(inner.message)
    if isinstance(error, UpstreamError) and error.grpc_code in ("NOT_FOUND", "INVALID_ARGUMENT"):
        error = backend.refusal(ep, model, version, error, True)
    if isinstance(error, Refused):
        backend.refused_by(ep, error, model, version)
        if backend.retries_after(error, others):
            return RETRY
        return error.error
    return error
