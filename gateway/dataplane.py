"""The contract between the front ends and whatever answers requests.

The HTTP and gRPC front ends (``gateway/frontend``) know only this protocol.
The gateway's implementation is :class:`gateway.proxy.Proxy` (route, pick an
endpoint, forward); the demo's reference V2 server implements it with local
numpy models (``gateway/demo``). Same front ends, two data planes — the
MLServer shape (DESIGN.md), so both speak the protocol identically.

Inference methods take and return the *wire form* of the front end that
called them, so a same-protocol proxy never parses a tensor. Failures are
raised as :class:`gateway.errors.GatewayError`.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from .errors import InvalidRequest, PayloadTooLarge, RequestTimeout, Unsupported

__all__ = ["AGAIN", "CLIENTS_FAULT", "RETRY", "SINK_FULL", "SINK_GONE", "SINK_ROOM", "UNROUTED", "Again",
           "AnswerSink", "ClientDisconnected", "DataPlane", "GrpcOutcome", "HttpReply", "IncomingBody", "MessagePipe",
           "Pending", "Plan", "RouteLabel", "StreamedBody", "StreamedMessage", "is_streamed"]


class ClientDisconnected(Exception):
    """The client went away before its request body arrived: there is no one to answer."""


# Failures that are the client's doing, never counted against a backend.
CLIENTS_FAULT = (ClientDisconnected, InvalidRequest, Unsupported, PayloadTooLarge, RequestTimeout)


@runtime_checkable
class IncomingBody(Protocol):
    """A large request body of known ``length`` that the front end has not read yet.

    The data plane either reads it whole (``read()``) or forwards it as it arrives
    (``async for``, after an optional ``prefix(n)``), once. Iteration repeats the
    prefix, so the body can be sent again while ``consumed`` is False (nothing past
    the prefix handed out yet). Raises ClientDisconnected, or InvalidRequest when the
    body does not match its Content-Length."""

    length: int
    consumed: bool

    async def read(self) -> bytes | bytearray: ...

    async def read_view(self) -> bytes | bytearray | memoryview:
        """The whole body, a view of the listener's buffer where it was read whole (no copy):
        for a reader that only converts it."""
        ...

    async def prefix(self, n: int) -> bytes:
        """The first ``n`` bytes (fewer if the body is shorter), kept for the iteration."""
        ...

    def __aiter__(self) -> AsyncIterator[bytes | memoryview]: ...


SINK_ROOM, SINK_FULL, SINK_GONE = 1, 0, -1  # what AnswerSink.send and MessagePipe.push say


class MessagePipe(Protocol):
    """Where a StreamedMessage's bytes go (a backend call's stream). ``push(data, last)`` sends
    them on (``last``: the message's end) and says SINK_ROOM, SINK_FULL (the message's
    ``resume()`` follows once the backend has taken them) or SINK_GONE; ``fail(error)`` ends the
    call with the client's ``error`` (the message broke a rule on its way)."""

    def push(self, data: bytes, last: bool) -> int: ...

    def fail(self, error: Exception) -> None: ...


class StreamedMessage(Protocol):
    """A gRPC request message still arriving, routed from its ``head`` — the serialized fields
    before its first raw_input_contents (codec/grpcstream.py) — and streamed on as it comes
    (the gateway's own HTTP/2 listener, frontend/h2upload.py). ``len()`` is the message's length.
    ``attach(pipe)`` sends it on: the bytes come as the client sends them (its length prefix
    first), and the client's window reopens as the pipe takes them; it raises the client's error
    if the message already broke a rule, and returns False when it went on once and cannot
    again (``resendable`` False: past what is kept to resend). ``read()`` waits for the whole
    message instead (a mirror, a converting path, grpcio's client). ``encoding``: the
    ``grpc-encoding`` its bytes go on in (b"": identity), for the backend call's head; ``whole``:
    the message is in hand whole all the same (a compressed one, inflated to be routed)."""

    head: bytes
    encoding: bytes
    whole: bool

    def __len__(self) -> int: ...

    @property
    def resendable(self) -> bool: ...

    def attach(self, pipe: MessagePipe) -> bool: ...

    def resume(self) -> None: ...

    async def read(self) -> bytes | memoryview: ...


class AnswerSink(Protocol):
    """Where a gRPC client's unary answer may go as it arrives from the backend, a piece at a
    time, instead of whole (the gateway's own HTTP/2 listener offers it, frontend/h2calls.py):
    a large ModelInferResponse is then never held whole in the gateway.

    ``open()`` sends the answer's head (False: the client is gone); ``send(data)`` queues answer
    bytes as the backend framed them (gRPC length prefixes included) and says whether the client
    still has room (SINK_ROOM), has enough queued for now (SINK_FULL: ``watch(wake)`` calls
    ``wake`` once it has taken it) or is gone (SINK_GONE). The call's status is the data plane's
    answer as usual: an error after ``opened`` goes out as trailers after the bytes already sent."""

    @property
    def opened(self) -> bool: ...

    @property
    def sent(self) -> int:
        """Answer bytes handed to send()."""
        ...

    def open(self) -> bool: ...

    def send(self, data: bytes | memoryview) -> int: ...

    def watch(self, wake: Callable[[], None]) -> None: ...


@runtime_checkable
class StreamedBody(Protocol):
    """A body that arrives while it is being sent (``async for`` chunks, bytes or views of
    buffers nothing writes to again; iteration raises a GatewayError if it breaks off).
    ``length`` is known in advance, or None (a stream of server-sent events: sent chunked).
    ``close()`` is called once the sender is done with it, at its end or not (a client that
    left: the backend's call is cancelled)."""

    length: int | None

    def __aiter__(self) -> AsyncIterator[bytes | memoryview]: ...

    def ready(self) -> list[bytes | memoryview]:
        """The chunks already here after the one just taken (taken too): sent with it in one
        write."""
        ...

    def close(self) -> None: ...


def is_streamed(body: object) -> TypeGuard[StreamedBody]:
    """Whether an answer's body is a :class:`StreamedBody`. Not ``isinstance``: on a runtime
    Protocol that walks the protocol's members on every call (~20 µs, measured on each
    streamed answer); the other bodies (bytes, a list of parts, an array) are not async
    iterables."""
    return hasattr(body, "__aiter__")


# Not frozen: made for every answer, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~3 x the cost). Nothing writes to one after it is made.
@dataclass(slots=True)
class HttpReply:
    """An HTTP answer: status, body, headers. The body is bytes, parts sent one after
    the other without a join, or a StreamedBody (large pass-through answers)."""

    status: int
    body: bytes | bytearray | Sequence[bytes | memoryview] | StreamedBody
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    """How one HTTP inference goes, decided once from its head (before its body is read):
    the route it took (the data plane's own), what admission counts per byte of its body, and
    whether it can be served from callbacks once its whole body is here (one backend that can,
    no split, no mirror). The front end passes it back with the body."""

    route: Any
    cost: int
    now: bool


class Again:
    """A request served from callbacks that was not answered and is to be sent again through
    the awaited path (:meth:`DataPlane.infer_grpc` with ``tried``): ``tried`` attempts of it
    count against the backend's retries already (1: an endpoint refused it and another may
    take it; 0: the server refused the stream before processing it, sent anew as gRPC's
    transparent retry does)."""

    __slots__ = ("tried",)

    def __init__(self, tried: int) -> None:
        self.tried = tried


AGAIN = Again(0)
RETRY = Again(1)
# How a gRPC inference served from callbacks ends: the serialized answer (b"" when it went to the
# sink), the error the awaited path would raise (CancelledError: the caller's cancel), or Again.
GrpcOutcome = bytes | memoryview | BaseException | Again


class Pending(Protocol):
    """A request under way from callbacks: ``cancel()`` resets it at the backend; its ``done``
    then gets CancelledError."""

    def cancel(self) -> None: ...


# The (route pattern, backend) label of a request's metrics; what a request no route took is labelled.
RouteLabel = tuple[str, str]
UNROUTED: RouteLabel = ("_unrouted", "")


class DataPlane:
    """What every data plane answers, in one class the front ends are typed against: the
    gateway's :class:`~gateway.proxy.Proxy`, the demo's ``DemoPlane``. Each method here that a
    data plane may lack (model control, the repository index, settings, generate, callbacks)
    answers "not supported" by default; a data plane overrides what it serves. The front ends
    call these methods, never look them up: a renamed method is a type error, not a feature
    silently gone.

    Triton's generate extension (docs/protocol/extension_generate.md): ``body`` is the JSON
    request as received (``headers`` lower-cased); ``stream`` is False for ``/generate`` (the
    answer: its JSON) and True for ``/generate_stream`` (server-sent events: a StreamedBody of
    unknown length, relayed as they come)."""

    # Set while the process drains (SIGTERM with drain_s): "not ready" while still serving.
    draining = False

    def server_live(self) -> bool:
        raise NotImplementedError

    def server_ready(self) -> bool:
        raise NotImplementedError

    def server_metadata(self) -> dict[str, Any]:
        """{"name": str, "version": str, "extensions": [str, ...]}"""
        raise NotImplementedError

    async def model_ready(self, model: str, version: str) -> bool:
        raise NotImplementedError

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        """The V2 model metadata object (spec "Model Metadata Response JSON Object")."""
        raise NotImplementedError

    def plan_http(self, model: str, version: str, headers: Mapping[str, str]) -> Plan | None:
        """The plan of an HTTP inference from its head; raises what routing raises (an
        unknown model). None: the data plane plans nothing (infer_http decides alone)."""
        return None

    async def infer_http(
        self, model: str, version: str, body: bytes | bytearray | IncomingBody, headers: Mapping[str, str],
        plan: Plan | None = None,
    ) -> HttpReply:
        """``body`` is the HTTP request body as received, or (large bodies with a
        Content-Length) an IncomingBody still to be read; ``headers`` lower-cased names;
        ``plan`` what :meth:`plan_http` gave for this request, if it was asked."""
        raise NotImplementedError

    def infer_http_now(self, plan: Plan, model: str, version: str, body: bytes | bytearray | memoryview,
                       headers: Mapping[str, str], record: Any,
                       done: Callable[[HttpReply | Exception | None], None]) -> RouteLabel | None:
        """:meth:`infer_http` from callbacks for a request whose plan says it can be (``now``):
        the answer goes to ``done``. None: nothing was done, await :meth:`infer_http`."""
        return None

    async def infer_grpc(
        self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
        affinity: str | None = None, metadata: Sequence[tuple[str, str]] = (), sink: AnswerSink | None = None,
        tried: int = 0,
    ) -> bytes:
        """``message`` is a serialized ModelInferRequest; return a serialized ModelInferResponse.
        ``affinity`` is the request's ``sequence_id`` (None outside sequences): requests that
        share one must reach the same backend endpoint. ``metadata``: the client's request
        metadata; the entries the data plane forwards (trace context…) go on to the backend.
        ``sink``: where the answer may be streamed instead (then it returns b"" with
        ``sink.opened`` set). A large ``message`` may still be arriving (a StreamedMessage).
        ``tried``: attempts already made from callbacks (Again.tried)."""
        raise NotImplementedError

    def infer_grpc_now(self, message: bytes, model: str, version: str, timeout: float | None, affinity: str | None,
                       metadata: Sequence[tuple[str, str]], sink: AnswerSink | None, record: Any,
                       done: Callable[[GrpcOutcome], None]) -> tuple[RouteLabel, Pending] | None:
        """:meth:`infer_grpc` from callbacks for a whole ``message`` when it can be (one backend
        that can send it at once; no split, mirror or hold): the outcome goes to ``done``, never
        before this returns. Returns the request's (route, backend) label and the call under way;
        None: nothing was done (await :meth:`infer_grpc`). Raises what routing, admission and
        the backend's choice raise."""
        return None

    def infer_stream(
        self, first: bytes, rest: AsyncIterator[bytes], model: str, version: str, timeout: float | None,
        affinity: str | None = None, metadata: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[bytes]:
        """Triton's ModelStreamInfer: ``first`` and then ``rest`` are serialized
        ModelInferRequests (routed by ``first``'s model); yields serialized
        ModelStreamInferResponses as they come."""
        raise NotImplementedError

    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        """Triton's per-model extensions over HTTP: ``what`` is ``config`` (GET
        /v2/models/{m}/config) or ``stats`` (GET /v2/models/{m}/stats)."""
        raise NotImplementedError

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        """Triton's per-model extension RPCs (``ModelConfig``, ``ModelStatistics``):
        serialized request in, serialized response out."""
        raise NotImplementedError

    # -- what a data plane may not serve -------------------------------------------------
    def route_label(self, model: str, version: str) -> RouteLabel:
        """(route pattern, backend) for the metrics of a request for ``model``."""
        return UNROUTED

    def v1_settings(self) -> Any:
        """The config's ``v1`` section (None: the bridge's defaults)."""
        return None

    async def repository_index(self, ready_only: bool) -> Sequence[Any]:
        raise Unsupported("this server has no repository index")

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        raise Unsupported("this server has no model control")

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        raise Unsupported("this server has no model control")

    async def settings(self, kind: str, model: str, request: tuple[str, bytes | None], update: bool) -> bytes:
        raise Unsupported(f"this server has no {kind} settings")

    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       stream: bool) -> HttpReply:
        raise Unsupported("this server does not serve Triton's generate extension")
