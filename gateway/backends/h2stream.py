"""The calls of a gRPC client channel (``h2channel.py``): one stream each, fed by its
connection's events — what every call shares (:class:`Call`) and the unary calls, whose answer is
one message (the rules: gRPC's doc/PROTOCOL-HTTP2.md; the framing: ``h2frames.py``). The
bidirectional streaming call is ``h2bidi.py``'s."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..dataplane import SINK_FULL, SINK_GONE, SINK_ROOM, AnswerSink, StreamedMessage
from ..h2 import _h2
from ..rawbody import new_buffer
from .grpcfault import Fault
from .h2frames import AnswerFault, CallError, MessageReader, Status, answer_head, answer_status, fault_error

if TYPE_CHECKING:
    from .h2conn import ChannelConnection

__all__ = ["GATHER_MIN", "RELAY_MIN", "SMALL_BODY", "WRITE_MARK", "Call", "Gathered", "Metadata", "Outcome", "Relay", "Settled",
           "Unary"]

Metadata = Sequence[tuple[str, str | bytes]]

NO_ERROR, CANCEL = _h2.NO_ERROR, _h2.CANCEL
SMALL_BODY = 1024  # a request body this small goes out joined to its prefix, in one call
WRITE_MARK = 64 * 1024  # a stream's unsent bytes past which its writer waits for WRITABLE
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
        return SINK_FULL if h2.buffered(self.sid) > WRITE_MARK else SINK_ROOM

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
