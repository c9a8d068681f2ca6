"""The calls of a gRPC client channel (``h2channel.py``): one stream each, fed by its
connection's events — a unary call's one answer message, or a bidirectional stream's messages
both ways with flow control (the rules: gRPC's doc/PROTOCOL-HTTP2.md; the framing:
``h2frames.py``)."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..dataplane import SINK_FULL, SINK_GONE, SINK_ROOM, AnswerSink, StreamedMessage
from ..h2 import _h2
from ..rawbody import new_buffer
from .grpcfault import Fault
from .h2frames import AnswerFault, CallError, MessageReader, Status, answer_head, answer_status, fault_error, prefix

if TYPE_CHECKING:
    from .h2channel import Channel
    from .h2conn import ChannelConnection

__all__ = ["GATHER_MIN", "RELAY_MIN", "Call", "Gathered", "Metadata", "Outcome", "Relay", "Settled", "StreamCall",
           "Unary"]

Metadata = Sequence[tuple[str, str | bytes]]

NO_ERROR, CANCEL = _h2.NO_ERROR, _h2.CANCEL
SMALL_BODY = 1024  # a request body this small goes out joined to its prefix, in one call
_WRITE_MARK = 64 * 1024  # a stream's unsent bytes past which its writer waits for WRITABLE
# An answer message at least this large goes to the client as it arrives (Relay), when the
# client's side offers a sink; a smaller one is received whole (one hand-over, no per-piece work).
RELAY_MIN = 256 * 1024
# An answer message at least this large that is read whole (to be converted) is gathered into one
# buffer of its size as it arrives (Gathered) rather than kept in pieces and joined at the end.
GATHER_MIN = 64 * 1024
_NO_STATUS = "ended its answer without a grpc-status (the gRPC protocol requires one in trailers)"
# Faults that would send the request again; once part of the answer has gone on, they are resets.
_RETRIED = frozenset({Fault.TRANSPORT, Fault.UNPROCESSED, Fault.REFUSED_STREAM})
# The trailers of almost every answer (grpc-core's and the gateway's own servers send no
# grpc-message with an OK status): matched whole, they need no parsing.
_OK_TRAILERS = [(b"grpc-status", b"0")]
_OK = Status("OK", "", None)


class Outcome(Protocol):
    """Where a unary call's end goes: the ``asyncio.Future`` its caller awaits, or a
    :class:`Settled` for a call served from callbacks."""

    def done(self) -> bool: ...

    def set_result(self, result: bytes | memoryview, /) -> None: ...

    def set_exception(self, error: BaseException, /) -> None: ...

    def cancel(self) -> bool: ...


class Settled:
    """An :class:`Outcome` that hands the call's end to ``then`` once, from the connection's
    callbacks: the answer, the error, or CancelledError (the caller's own cancel, ``Call.cancel``)."""

    __slots__ = ("over", "then")

    def __init__(self, then: Callable[[bytes | memoryview | BaseException], None]) -> None:
        self.then = then
        self.over = False

    def done(self) -> bool:
        return self.over

    def set_result(self, result: bytes | memoryview, /) -> None:
        if not self.over:
            self.over = True
            self.then(result)

    def set_exception(self, error: BaseException, /) -> None:
        if not self.over:
            self.over = True
            self.then(error)

    def cancel(self) -> bool:
        if self.over:
            return False
        self.over = True
        self.then(asyncio.CancelledError())
        return True


class Call:
    """One call's stream, fed by its connection's events."""

    __slots__ = ("conn", "done", "headed", "limit", "reader", "sid", "timer")
    TRUNCATED = "ended its answer in the middle of a message"

    def __init__(self, limit: int) -> None:
        self.conn: ChannelConnection | None = None
        self.sid = 0
        self.limit = limit
        self.reader: MessageReader | None = None
        self.headed = False  # a byte of the answer came
        self.done = False
        self.timer: asyncio.TimerHandle | None = None

    def settle(self, error: BaseException | None) -> None:
        raise NotImplementedError

    def deliver(self, messages: list[bytes]) -> None:
        raise NotImplementedError

    def taken(self, n: int) -> None:
        """``n`` DATA bytes are in the message buffer: they may be acknowledged."""
        assert self.conn is not None
        self.conn.h2.consume(self.sid, n)

    def finish(self, status: Status) -> None:
        """The backend's status ended the answer."""
        error = None if status.code == "OK" else CallError(status.code, status.message,
                                                            status_details=status.details)
        self.close(error, NO_ERROR)

    def close(self, error: BaseException | None, code: int | None) -> None:
        """The call is over: its stream is forgotten (and reset with ``code`` unless None)."""
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        if self.conn is not None:
            self.conn.end(self.sid, code)
        self.settle(error)

    def abort(self, kind: str, why: str) -> None:
        self.close(fault_error(kind, why), CANCEL)

    def expire(self) -> None:
        # The deadline is enforced here as well as by the backend (grpc-timeout).
        self.abort(Fault.TIMEOUT, "did not answer in time")

    # -- the connection's events --
    def on_head(self, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        try:
            head = answer_head(headers, end)
        except AnswerFault as exc:
            self.abort(exc.kind, exc.why)
            return
        self.headed = True
        if head.status is not None:  # Trailers-Only
            self.finish(head.status)
        else:
            self.reader = MessageReader(self.limit, head.encoding)

    def on_data(self, data: bytes, end: bool) -> None:
        reader = self.reader
        if reader is None:
            self.abort(Fault.BAD, "sent DATA before the answer's head")
            return
        self.taken(len(data))
        try:
            messages = reader.feed(data)
        except AnswerFault as exc:
            self.abort(exc.kind, exc.why)
            return
        if messages:
            self.deliver(messages)
        if end and not self.done:
            self.close(fault_error(Fault.FRAMING, _NO_STATUS), NO_ERROR)

    def on_trailers(self, trailers: list[tuple[bytes, bytes]]) -> None:
        status = _OK if trailers == _OK_TRAILERS else answer_status(dict(trailers))
        if status is None:
            self.close(fault_error(Fault.FRAMING, _NO_STATUS), NO_ERROR)
        elif status.code == "OK" and self.partial():
            self.close(fault_error(Fault.FRAMING, self.TRUNCATED), NO_ERROR)
        else:
            self.finish(status)

    def on_writable(self) -> None:
        pass

    def partial(self) -> bool:
        """The answer ended inside a message (or before its head)."""
        return self.reader is None or self.reader.partial


class Unary(Call):
    __slots__ = ("answer", "future")
    TRUNCATED = "answered OK without a complete response message (a unary call has exactly one)"

    def __init__(self, limit: int, future: Outcome) -> None:
        super().__init__(limit)
        self.future = future
        self.answer: bytes | memoryview | None = None

    def cancel(self) -> None:
        """The caller gives up on the call (its client went): the stream is reset (CANCEL)."""
        self.close(None, CANCEL)

    def deliver(self, messages: list[bytes]) -> None:
        if self.answer is not None or len(messages) > 1:
            self.abort(Fault.FRAMING, "answered with more than one message (a unary call has exactly one)")
        else:
            self.answer = messages[0]

    def finish(self, status: Status) -> None:
        if status.code == "OK" and self.answer is None:
            self.close(fault_error(Fault.FRAMING, self.TRUNCATED), NO_ERROR)
        else:
            Call.finish(self, status)

    def settle(self, error: BaseException | None) -> None:
        future = self.future
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        elif self.answer is not None:
            future.set_result(self.answer)
        else:
            future.cancel()  # (the caller's own cancel)


class Gathered(Unary):
    """A unary call whose answer is read whole: once its length prefix shows an uncompressed
    message of ``least`` bytes or more (within the limit; GATHER_MIN for a converted answer),
    the message is copied into one buffer of that size as its DATA arrives and each piece is let
    go — one copy of the message held, not its pieces and then their join (twice the message). The buffer is uninitialised
    (``rawbody.new_buffer``): its pages are taken as bytes arrive, so a backend that announces a
    large message and sends little of it makes the gateway hold only what it sent. The answer is
    a memoryview of it. The unary call's rules stay: anything after the message is a second
    message (refused), an end inside it is a truncated answer.

    ``request``: the request message's pieces (views of the client's body on the converting
    path), emptied at the answer's first DATA — the backend has run the request by then, so it
    is never sent again (the caller's retry stops at an empty list, backends/grpc.py), and the
    client's body can go before the answer is gathered rather than beside it: HTTP binary →
    gRPC at 1 MiB held ~1 × the tensor per request in flight instead of ~2 ×."""

    __slots__ = ("filled", "into", "least", "request")

    def __init__(self, limit: int, future: Outcome, least: int,
                 request: list[bytes | memoryview] | None = None) -> None:
        super().__init__(limit, future)
        self.least = least
        self.into: memoryview | None = None
        self.filled = 0
        self.request = request

    def on_data(self, data: bytes, end: bool) -> None:
        request = self.request
        if request is not None:
            self.request = None
            request.clear()
        into = self.into
        skip = 0
        if into is None:
            reader = self.reader
            if reader is None or self.answer is not None or reader.pending or not self._begin(data):
                Unary.on_data(self, data, end)
                return
            into = self.into
            assert into is not None
            skip = 5
        self.taken(len(data))
        n = len(data) - skip
        at = self.filled
        if n > len(into) - at:
            self.abort(Fault.FRAMING, "answered with more than one message (a unary call has exactly one)")
            return
        if n:
            into[at:at + n] = memoryview(data)[skip:] if skip else data
            self.filled = at + n
            if at + n == len(into):
                self.answer = into
                self.into = None
        if end and not self.done:
            self.close(fault_error(Fault.FRAMING, _NO_STATUS), NO_ERROR)

    def _begin(self, data: bytes) -> bool:
        """Whether the answer is gathered from ``data``, the start of its message."""
        if len(data) < 5 or data[0] != 0:
            return False
        n = int.from_bytes(data[1:5], "big")
        if n < self.least or n > self.limit:
            return False  # (a message over the limit is the reader's to refuse)
        self.into = new_buffer(n)
        self.filled = 0
        return True

    def partial(self) -> bool:
        return self.into is not None or Unary.partial(self)


class Relay(Unary):
    """A unary call whose answer, once its length prefix shows a message of RELAY_MIN bytes or
    more, goes to the client's sink (dataplane.AnswerSink) as it arrives, bytes as the backend
    framed them. They are acknowledged to the backend (its window reopened) only as the client
    takes them, so flow control reaches from the client through to the backend and the gateway
    holds about one stream window of the answer, never the whole message. The rules stay the
    unary call's: one message, of the length its prefix said, then a grpc-status — a backend
    that breaks them ends the client's call with the error, after what was passed on."""

    __slots__ = ("held", "left", "sink", "upload")

    def __init__(self, limit: int, future: Outcome, sink: AnswerSink) -> None:
        super().__init__(limit, future)
        self.sink = sink
        self.left = -1  # bytes of the relayed message (prefix included) still to come; -1: not relaying
        self.held = 0  # bytes passed on that the client has not taken yet
        self.upload: StreamedMessage | None = None  # the request, when it streams in (this is its MessagePipe)

    # -- the request's MessagePipe --
    def push(self, data: bytes, last: bool) -> int:
        conn = self.conn
        if self.done or conn is None:
            return SINK_GONE
        h2 = conn.h2
        try:
            if not h2.send_data(self.sid, data, last):
                return SINK_GONE
        except _h2.H2Error:
            return SINK_GONE  # the connection failed: its loss ends the call
        conn.schedule_flush()
        return SINK_FULL if h2.buffered(self.sid) > _WRITE_MARK else SINK_ROOM

    def fail(self, error: Exception) -> None:
        self.close(error, CANCEL)

    def on_writable(self) -> None:
        upload = self.upload
        if upload is not None:
            upload.resume()

    def on_data(self, data: bytes, end: bool) -> None:
        if self.left < 0:
            reader = self.reader
            if reader is None or self.answer is not None or reader.pending or not self._start(data):
                Unary.on_data(self, data, end)
                return
        n = len(data)
        if n > self.left:
            self.abort(Fault.FRAMING, "answered with more than one message (a unary call has exactly one)")
            return
        self.left -= n
        if n:
            if self.sink.send(data) == SINK_FULL:
                self.held += n
                self.sink.watch(self.drained)
            else:  # room, or the client is gone (its reset cancels the call): acknowledged at once
                self.taken(n)
        if end and not self.done:
            self.close(fault_error(Fault.FRAMING, _NO_STATUS), NO_ERROR)

    def _start(self, data: bytes) -> bool:
        """Whether the answer is relayed from ``data``, the start of its first message: an
        uncompressed message of RELAY_MIN bytes or more, within the limit, the client still there."""
        if len(data) < 5 or data[0] != 0:
            return False
        n = int.from_bytes(data[1:5], "big")
        if n < RELAY_MIN or n > self.limit or not self.sink.open():
            return False
        self.left = n + 5
        return True

    def drained(self) -> None:
        """The client took what was passed on: the backend may send as much again."""
        conn = self.conn
        if self.held and not self.done and conn is not None:
            conn.h2.consume(self.sid, self.held)
            conn.schedule_flush()
        self.held = 0

    def partial(self) -> bool:
        return self.left > 0 if self.left >= 0 else Unary.partial(self)

    def finish(self, status: Status) -> None:
        if self.left < 0:
            Unary.finish(self, status)
        else:
            Call.finish(self, status)

    def close(self, error: BaseException | None, code: int | None) -> None:
        if self.left >= 0 and isinstance(error, CallError) and error.fault is not None and \
                error.fault[0] in _RETRIED:
            error = fault_error(Fault.RESET, error.fault[1])
        Call.close(self, error, code)

    def settle(self, error: BaseException | None) -> None:
        if self.left >= 0 and error is None:
            if not self.future.done():
                self.future.set_result(b"")  # all of it went to the sink
            return
        Unary.settle(self, error)


class StreamCall(Call):
    """A bidirectional streaming call: an async iterator of the answer's messages (the call
    starts at the first ``__anext__``; the request messages are written as the request iterator
    yields them, then the request ends). The backend's status, when not OK, is raised as
    CallError after the messages that came before it; ``cancel()`` resets the stream."""

    __slots__ = ("channel", "error", "held", "messages", "metadata", "method", "requests", "started", "timeout",
                 "waiter", "writable", "writer")

    def __init__(self, channel: Channel, method: str, requests: AsyncIterator[bytes], timeout: float | None,
                 metadata: Metadata | None) -> None:
        super().__init__(channel.max_message_bytes)
        self.channel = channel
        self.method = method
        self.requests = requests
        self.timeout = timeout
        self.metadata = metadata
        self.messages: deque[bytes] = deque()
        self.held = 0  # DATA bytes not acknowledged while messages wait for the consumer
        self.error: BaseException | None = None
        self.started = False
        self.waiter: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.writer: asyncio.Task[None] | None = None

    def __aiter__(self) -> StreamCall:
        return self

    async def __anext__(self) -> bytes:
        if not self.started:
            await self._start()
        while True:
            if self.messages:
                message = self.messages.popleft()
                if not self.messages and self.held:
                    # The consumer took what waited: the backend may send more (flow control).
                    assert self.conn is not None
                    self.conn.h2.consume(self.sid, self.held)
                    self.held = 0
                    self.conn.schedule_flush()
                return message
            if self.error is not None:
                raise self.error
            if self.done:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter

    def cancel(self) -> bool:
        """Stop the call (a no-op once it ended): RST_STREAM(CANCEL) to the backend."""
        if self.done:
            return False
        if not self.started:
            self.started = self.done = True
            self.error = asyncio.CancelledError()
            return True
        self.close(asyncio.CancelledError(), CANCEL)
        return True

    async def _start(self) -> None:
        self.started = True
        channel = self.channel
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        try:
            conn = channel.usable() or await channel.acquire(loop, deadline)
        except CallError as exc:
            self.done = True
            self.error = exc
            raise
        sid = conn.h2.request(channel.head(self.method, self.timeout, self.metadata), None, end=False)
        self.conn, self.sid = conn, sid
        conn.calls[sid] = self
        conn.schedule_flush()
        if deadline is not None:
            self.timer = loop.call_at(deadline, self.expire)
        self.writer = loop.create_task(self._write(conn, sid))

    async def _write(self, conn: ChannelConnection, sid: int) -> None:
        h2 = conn.h2
        limit = self.limit
        try:
            async for message in self.requests:
                if self.done:
                    return
                n = len(message)
                if n > limit:
                    self.close(CallError("RESOURCE_EXHAUSTED", f"Sent message larger than max ({n} vs. {limit})"),
                               CANCEL)
                    return
                if not h2.send_data(sid, prefix(n) + message if n <= SMALL_BODY else prefix(n)) or \
                        (n > SMALL_BODY and not h2.send_data(sid, message)):
                    return  # the stream is gone: its end is the reader's to report
                conn.schedule_flush()
                if h2.buffered(sid) > _WRITE_MARK:
                    self.writable = asyncio.get_running_loop().create_future()
                    await self.writable
                    if self.done:
                        return
            if not self.done:
                h2.send_data(sid, b"", True)
                conn.schedule_flush()
        except _h2.H2Error:
            return  # the connection failed: its loss ends the call
        except Exception as exc:  # the request iterator failed: the call cannot go on
            self.close(exc, CANCEL)

    def on_writable(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def taken(self, n: int) -> None:
        if self.messages:
            self.held += n
        else:
            Call.taken(self, n)

    def deliver(self, messages: list[bytes]) -> None:
        self.messages.extend(messages)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def settle(self, error: BaseException | None) -> None:
        self.error = error
        writer = self.writer
        if writer is not None and not writer.done() and writer is not asyncio.current_task():
            writer.cancel()
        for future in (self.waiter, self.writable):
            if future is not None and not future.done():
                future.set_result(None)
