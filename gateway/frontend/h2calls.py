"""One gRPC call on the gateway's own HTTP/2 listener (frontend/h2listen.py): its head read,
its handler found and run, its answer written.

The handlers are the ones grpc.aio serves (frontend/grpc.py, frontend/v1_grpc.py), found through
grpc's public ``GenericRpcHandler.service`` and run with a ``Context`` (h2head.py) that offers what
they use of ``aio.ServicerContext``: ``invocation_metadata()``, ``time_remaining()`` and ``abort()``.
So both engines serve one set of handlers, and a call ends with the same status on either.

The framing follows gRPC's "gRPC over HTTP2" (doc/PROTOCOL-HTTP2.md): a response is HEADERS
(``:status 200``, ``content-type: application/grpc``), length-prefixed messages as DATA, and
trailers carrying ``grpc-status`` and ``grpc-message``; a call that fails before its first message
answers "trailers-only", one HEADERS frame with END_STREAM.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from grpc import aio

from ..codec.grpcframe import ACCEPT_ENCODING, FrameError, MessageReader, frame
from ..codec.grpcstream import head_end
from ..dataplane import SINK_FULL, SINK_GONE, SINK_ROOM
from .h2head import Context, status_trailers
from .h2upload import STREAM_MIN, Compressed, Upload

if TYPE_CHECKING:
    from .h2session import H2Connection

__all__ = ["RELAY_LOW_WATER", "RESPONSE_HEAD", "Call", "Running"]

log = logging.getLogger("oip_gateway.grpc")

RESPONSE_HEAD = ((b":status", b"200"), (b"content-type", b"application/grpc"),
                 (b"grpc-accept-encoding", ACCEPT_ENCODING))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
# The most a streaming call's unread requests may hold before the client's window stays shut.
_STREAM_QUEUE_BYTES = 1 << 20
# A single message above this goes out as its own DATA (no join with its prefix: zero-copy).
_JOIN_MAX = 16384
# A stream's queued answer bytes past which a relay waits for the client (WRITABLE): the
# connection's write_low_water (h2listen.py passes it), so the event comes when it drops below.
RELAY_LOW_WATER = 65536


class Running(Protocol):
    """What serves a call once its request is here: its task, or a ModelInfer under way from
    callbacks (h2infer.py ``Going``)."""

    def cancel(self) -> bool: ...

    def done(self) -> bool: ...


class Requests:
    """A streaming call's request messages as its handler reads them (an async iterator). The
    client's flow-control window reopens as the handler takes them, so a handler that stops
    reading stops the client."""

    def __init__(self, call: Call, deserialize: Callable[[bytes], Any] | None) -> None:
        self._call = call
        self._deserialize = deserialize
        self._queue: deque[bytes] = deque()
        self.queued = 0
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def push(self, messages: list[bytes]) -> None:
        for m in messages:
            self._queue.append(m)
            self.queued += len(m)
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        self._ended = True
        self._error = error
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> Any:
        while not self._queue:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        message = self._queue.popleft()
        self.queued -= len(message)
        self._call.taken()
        return self._deserialize(message) if self._deserialize is not None else message


class Call:
    """One stream of an HTTP/2 connection: a gRPC call from its head to its status."""

    __slots__ = ("answered", "conn", "context", "handler", "held", "last", "late", "messages", "reader", "relayable",
                 "relayed", "requests", "sid", "started", "task", "timer", "unconsumed", "upload", "wake", "writable")

    def __init__(self, conn: H2Connection, sid: int, handler: grpc.RpcMethodHandler, context: Context,
                 reader: MessageReader, now: float) -> None:
        self.conn = conn
        self.sid = sid
        self.handler = handler
        self.context = context
        self.reader = reader
        self.messages: list[bytes] = []  # a unary call's request (one message)
        self.requests: Requests | None = None  # a streaming call's
        self.task: Running | None = None
        self.answered = False  # our side of the stream has ended (or was reset)
        self.unconsumed = 0  # received bytes not yet given back to the client's window
        self.held = 0  # a unary request's bytes given back, counted against the connection's budget
        self.timer: asyncio.TimerHandle | None = None  # the deadline
        self.late = False  # the deadline passed
        self.last = now  # last progress (a read, or a write accepted), for the stall sweep
        self.writable: asyncio.Future[None] | None = None
        self.started = False  # a streaming (or relayed) answer's head has gone out
        self.relayed = 0  # answer bytes relayed through the sink (AnswerSink.send)
        self.wake: Callable[[], None] | None = None  # a relay waiting for the client to take its bytes
        self.relayable = False  # a large request may be streamed on (ModelInfer: h2upload.py)
        self.upload: Upload | None = None  # the request, streamed on as it arrives

    # -- received -----------------------------------------------------------------------
    def data(self, data: bytes, end: bool) -> FrameError | None:
        """DATA of this call; a FrameError ends the call with its status. A large ModelInfer
        request whose head is here becomes an Upload (the connection then starts its handler)."""
        self.unconsumed += len(data)
        upload = self.upload
        if upload is None and self.relayable and not self.messages and not self.reader.pending:
            upload = self.upload = self.streamed(data)
            if upload is not None:
                if end:
                    upload.ended()
                return None
        elif upload is not None:
            upload.add(data)
            if end:
                upload.ended()
            return None
        try:
            messages = self.reader.feed(data) if data else []
        except FrameError as err:
            return err
        requests = self.requests
        if requests is None:
            self.messages.extend(messages)
            if len(self.messages) > 1:  # refused at once: nothing more is held for it
                return FrameError(FrameError.FRAMING, "INTERNAL",
                                  "a unary call carries one request message; this one sent more")
            self.taken()  # one message, bounded by the reader's limit: read it all
        else:
            if messages:
                requests.push(messages)
            if requests.queued < _STREAM_QUEUE_BYTES:
                self.taken()
            if end:
                truncated = self.truncated()
                if truncated is not None:
                    return truncated
                requests.end()
        return None

    def streamed(self, data: bytes) -> Upload | None:
        """An Upload of the request that ``data`` begins, if it is one to stream on: uncompressed,
        of STREAM_MIN bytes or more (within the limit), its head all in ``data``."""
        if len(data) < 5 or data[0] != 0:
            return None
        n = int.from_bytes(data[1:5], "big")
        if n < STREAM_MIN or n > self.reader.limit:
            return None
        at = head_end(data, 5, min(len(data), 5 + n))
        return Upload(self, data, at, n) if at > 0 else None

    def truncated(self) -> FrameError | None:
        if self.reader.pending:
            return FrameError(FrameError.FRAMING, "INTERNAL",
                              f"the request ended inside a message ({self.reader.pending} bytes of it received)")
        return None

    def taken(self) -> None:
        """The handler has what was received: give the client its window back — for a unary
        request, while the connection's budget allows (H2Connection.may_hold)."""
        n = self.unconsumed
        if not n:
            return
        requests = self.requests
        if requests is None:
            if not self.conn.may_hold(self, n):
                return
        elif requests.queued >= _STREAM_QUEUE_BYTES:
            return
        self.conn.consume(self.sid, n)
        self.unconsumed = 0

    # -- answered -----------------------------------------------------------------------
    def finish(self, code: grpc.StatusCode, message: str = "",
               trailing: Sequence[tuple[str, str | bytes]] = (), started: bool = False) -> None:
        """End the call with a status: trailers after a started answer, else trailers-only."""
        if self.answered:
            return
        self.answered = True
        trailers = status_trailers(code, message, trailing)
        if started:
            self.conn.send_trailers(self.sid, trailers)
        else:
            self.conn.respond(self.sid, [*RESPONSE_HEAD, *trailers])

    def answer(self, body: bytes) -> None:
        """A unary call's answer: its one message and an OK status."""
        if self.answered:
            return
        self.answered = True
        if len(body) <= _JOIN_MAX:
            self.conn.respond(self.sid, RESPONSE_HEAD, frame(len(body)) + body, _OK_TRAILERS)
        else:
            self.conn.send_headers(self.sid, RESPONSE_HEAD)
            self.conn.send_message(self.sid, body)
            self.conn.send_trailers(self.sid, list(_OK_TRAILERS))

    # -- the AnswerSink a unary answer may be relayed through (dataplane.py) -------------------
    @property
    def opened(self) -> bool:
        return self.started

    @property
    def sent(self) -> int:
        return self.relayed

    def open(self) -> bool:
        if self.answered:
            return False
        self.started = True
        self.conn.send_headers(self.sid, RESPONSE_HEAD)
        return True

    def send(self, data: bytes | memoryview) -> int:
        if self.answered or not self.conn.send_data(self.sid, data):
            return SINK_GONE
        self.relayed += data.nbytes if isinstance(data, memoryview) else len(data)
        return SINK_FULL if self.conn.buffered(self.sid) > RELAY_LOW_WATER else SINK_ROOM

    def watch(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def woken(self) -> None:
        """The connection sent what was queued on this call (WRITABLE)."""
        wake = self.wake
        if wake is not None:
            self.wake = None
            wake()
        writable = self.writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def run_unary(self, request: bytes | Upload | Compressed) -> None:
        handler = self.handler
        ctx = self.context
        try:
            try:
                message = handler.request_deserializer(request) if handler.request_deserializer else request
            except Exception:
                self.finish(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
                return
            result = await handler.unary_unary(message, ctx)
            if self.started:  # relayed: the answer went through the sink
                self.finish(grpc.StatusCode.OK, "", (), True)
                return
            body = handler.response_serializer(result) if handler.response_serializer else result
            self.answer(body)
        except aio.AbortError:
            self.finish(ctx.code or grpc.StatusCode.UNKNOWN, ctx.details, ctx.trailing, self.started)
        except asyncio.CancelledError:
            self.cancelled()
            raise
        except Exception:
            log.exception("unexpected error in gRPC call %s", self.context.method)
            self.finish(grpc.StatusCode.UNKNOWN, "Unexpected error in RPC handling", (), self.started)
        finally:
            self.conn.done(self)

    async def run_stream(self) -> None:
        handler = self.handler
        ctx = self.context
        assert self.requests is not None
        serialize = handler.response_serializer
        try:
            async for result in handler.stream_stream(self.requests, ctx):
                body = serialize(result) if serialize else result
                if not self.started:
                    self.started = True
                    self.conn.send_headers(self.sid, RESPONSE_HEAD)
                if not self.conn.send_message(self.sid, body):
                    return  # the stream is gone: reset by the client
                if self.conn.buffered(self.sid) > _STREAM_QUEUE_BYTES:
                    self.writable = asyncio.get_running_loop().create_future()
                    await self.writable
                    self.writable = None
            self.finish(grpc.StatusCode.OK, "", (), self.started)
        except aio.AbortError:
            self.finish(ctx.code or grpc.StatusCode.UNKNOWN, ctx.details, ctx.trailing, self.started)
        except asyncio.CancelledError:
            self.cancelled()
            raise
        except Exception:
            log.exception("unexpected error in gRPC call %s", self.context.method)
            self.finish(grpc.StatusCode.UNKNOWN, "Unexpected error in RPC handling", (), self.started)
        finally:
            self.conn.done(self)

    def cancelled(self) -> None:
        """The task was cancelled: by the deadline (answer DEADLINE_EXCEEDED, as grpc does), or
        because the client reset the stream or went away (nothing to answer)."""
        if self.late:
            self.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", (), self.started)

    def expired(self) -> None:
        self.timer = None
        self.late = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        elif not self.answered:  # not dispatched yet: the request is still arriving
            self.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self.conn.done(self)


def stream_requests(call: Call) -> AsyncIterator[Any]:
    """Attach a request queue to a streaming call (before its first DATA)."""
    call.requests = Requests(call, call.handler.request_deserializer)
    return call.requests
