"""Drive the backend HTTP/1.1 client's protocol (gateway/backends/h1/connection.py ``Connection``)
below the network, and read the same bytes with h11 as a client — the reference side of the
differential tests (tests/unit/test_h1_framing_diff.py) and the fuzz harness (fuzz/h1_answer.py).

:func:`drive` plays an event loop's part: ``connection_made`` with a fake transport, then per
exchange ``start`` (as the pool's ``request_now`` does) and the backend's bytes fed through
``get_buffer`` / ``buffer_updated`` in reads of the given sizes; EOF is ``connection_lost(None)``.
As a loop would, it stops feeding a connection once its transport is closed (and then calls
``connection_lost``), and starts the next exchange only on a connection that may carry one. A
streamed answer's body (``stream_min``) is drained after every read, as a consumer keeping up.

:func:`h11_answers` feeds the same bytes, exchange by exchange, to ``h11.Connection(h11.CLIENT)``
that sent a request first: interim answers are skipped, its RemoteProtocolError is a refusal,
and its connection is reusable when both sides are DONE with no bytes left over.

Neither catches what the code under test raises from its callbacks: that is a bug, and it
reaches the caller (the test fails, libFuzzer reports a crash).
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h11

from gateway.backends.h1.answer import BodyStream, H1Response
from gateway.backends.h1.connection import Connection
from gateway.backends.h1.errors import BadAnswer, ConnectionDropped
from gateway.backends.h1.limits import AnswerLimits

__all__ = ["REQUEST_BODY", "REQUEST_HEAD", "Driven", "FakeTransport", "Outcome", "Reference", "RecordingWaiter",
           "drive", "h11_answers", "outcome_of"]

REQUEST_HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: backend\r\nContent-Length: 2\r\n\r\n"
REQUEST_BODY = b"{}"
READ_BUFFER = 512 * 1024  # the pool's one read buffer (pool.py: rawbody.READ_SIZE)


class FakeTransport:
    """What the protocol calls on its transport, recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False
        self.paused = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class RecordingWaiter:
    """Stands where the pool's ``Pending`` stands; records every call (one outcome per exchange)."""

    def __init__(self) -> None:
        self.calls: list[H1Response | Exception] = []

    def done(self) -> bool:
        return bool(self.calls)

    def set_result(self, response: H1Response, /) -> None:
        self.calls.append(response)

    def set_exception(self, exc: Exception, /) -> None:
        self.calls.append(exc)


@dataclass
class Outcome:
    """One exchange as the client saw it. ``kind``: "answer" (a complete answer delivered: its
    body whole, or a streamed body that ended), "refused" (BadAnswer, ConnectionDropped, or a
    streamed body that failed: ``error``), or "pending" (no outcome yet when the bytes ran out,
    no EOF). ``closed`` / ``keep_alive``: the connection's flags once the exchange's bytes were
    fed (and EOF, if any)."""

    kind: str
    status: int | None = None
    headers: dict[str, str] | None = None
    body: bytes | None = None
    error: Exception | None = None
    streamed: bool = False
    closed: bool = False
    keep_alive: bool = False
    violations: list[str] = field(default_factory=list)

    @property
    def reusable(self) -> bool:
        return self.kind == "answer" and not self.closed and self.keep_alive


@dataclass
class Driven:
    outcomes: list[Outcome]
    transport: FakeTransport
    connection: Connection


def _reads(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    """``data`` cut into reads of ``sizes`` (cycled; a size < 1 counts as 1)."""
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = max(1, sizes[i % len(sizes)]) if sizes else len(data)
        out.append(data[pos : pos + n])
        pos += n
        i += 1
    return out


class _Drain:
    """A streamed body, read as it arrives (``async for`` stepped by hand: a chunk is
    returned at once when one is queued)."""

    def __init__(self, stream: BodyStream) -> None:
        self.stream = stream
        self.parts: list[bytes] = []
        self.error: BaseException | None = None
        self.ended = False

    def pull(self) -> None:
        while not self.ended:
            s = self.stream
            if not s._chunks and s._error is None and not s._finished:
                return  # would wait
            coro = s.__anext__()
            try:
                coro.send(None)
            except StopIteration as stop:
                self.parts.append(bytes(stop.value))
            except StopAsyncIteration:
                self.ended = True
            except (ConnectionDropped, BadAnswer, TimeoutError) as exc:
                self.error = exc
                self.ended = True
            else:  # it suspended: it found nothing after all
                coro.close()
                return


def outcome_of(waiter: RecordingWaiter, drain: _Drain | None, conn: Connection) -> Outcome:
    violations = []
    if len(waiter.calls) > 1:
        violations.append(f"the waiter was answered {len(waiter.calls)} times: {waiter.calls!r}")
    if not waiter.calls:
        out = Outcome("pending")
    else:
        first = waiter.calls[0]
        if isinstance(first, H1Response):
            if isinstance(first.body, BodyStream):
                assert drain is not None
                drain.pull()
                body = b"".join(drain.parts)
                if drain.error is not None:
                    out = Outcome("refused", first.status, dict(first.headers), body, drain.error, streamed=True)  # type: ignore[arg-type]
                elif drain.ended:
                    out = Outcome("answer", first.status, dict(first.headers), body, streamed=True)
                else:
                    out = Outcome("pending", first.status, dict(first.headers), body, streamed=True)
            else:
                out = Outcome("answer", first.status, dict(first.headers), bytes(first.body))
        else:
            if not isinstance(first, (BadAnswer, ConnectionDropped)):
                violations.append(f"an exception other than BadAnswer / ConnectionDropped: {first!r}")
            out = Outcome("refused", error=first)
    out.closed = conn.closed
    out.keep_alive = conn.keep_alive
    out.violations = violations
    return out


def drive(exchanges: Sequence[bytes], *, sizes: Sequence[int] = (), eof: bool = True,
          limits: AnswerLimits | None = None, stream_min: int | None = None,
          idle: Sequence[bytes] = (), loop: asyncio.AbstractEventLoop | None = None) -> Driven:
    """Run one exchange per item of ``exchanges`` on one Connection: start it, feed its bytes in
    reads of ``sizes``; EOF after the last one if ``eof``. An exchange whose answer is not
    complete when its bytes run out ends the run (EOF, if asked, comes then); so does a connection
    that may not carry another exchange. ``idle[i]``: bytes fed after exchange i, before the next
    one starts (a backend talking out of turn). ``loop``: the loop the connection is made with
    (never run: ``start`` needs none; default a new one, closed at the end)."""
    own = loop is None
    if loop is None:
        loop = asyncio.new_event_loop()
    try:
        conn = Connection(loop, memoryview(bytearray(READ_BUFFER)), limits or AnswerLimits())
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        outcomes: list[Outcome] = []
        state = _State(conn, transport, sizes)
        for i, data in enumerate(exchanges):
            waiter = RecordingWaiter()
            conn.start(waiter, REQUEST_HEAD, REQUEST_BODY, stream_min)
            state.feed(data, waiter)
            last = i == len(exchanges) - 1
            if (last or not state.ended(waiter)) and eof:
                state.lose()
            out = outcome_of(waiter, state.drain, conn)
            outcomes.append(out)
            state.drain = None
            if last or not out.reusable or state.lost:
                break
            if i < len(idle) and idle[i]:
                state.feed(idle[i], RecordingWaiter())
                if conn.closed or transport.closing:
                    break
        return Driven(outcomes, transport, conn)
    finally:
        if own:
            loop.close()


class _State:
    def __init__(self, conn: Connection, transport: FakeTransport, sizes: Sequence[int]) -> None:
        self.conn = conn
        self.transport = transport
        self.sizes = sizes
        self.lost = False
        self.drain: _Drain | None = None

    def lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.conn.connection_lost(None)
            if self.drain is not None:
                self.drain.pull()

    def ended(self, waiter: RecordingWaiter) -> bool:
        if not waiter.calls:
            return False
        return self.drain is None or self.drain.ended

    def feed(self, data: bytes, waiter: RecordingWaiter) -> None:
        conn, transport = self.conn, self.transport
        for piece in _reads(data, self.sizes):
            while piece and not transport.closing and not self.lost:
                buf = conn.get_buffer(-1)
                if len(buf) == 0:
                    raise AssertionError("get_buffer returned an empty buffer")
                n = min(len(buf), len(piece))
                buf[:n] = piece[:n]
                piece = piece[n:]
                conn.buffer_updated(n)
                if self.drain is None and waiter.calls and isinstance(waiter.calls[0], H1Response) and \
                        isinstance(waiter.calls[0].body, BodyStream):
                    self.drain = _Drain(waiter.calls[0].body)
                if self.drain is not None:
                    self.drain.pull()
            if transport.closing or self.lost:
                break
        if transport.closing:
            self.lose()  # what the loop does after a transport's close()


# ---------------------------------------------------------------------------- h11, the reference
@dataclass
class Reference:
    """One exchange as h11 read it: ``kind`` "answer" / "refused" / "pending"."""

    kind: str
    status: int | None = None
    headers: dict[str, str] | None = None
    body: bytes | None = None
    error: str = ""
    reusable: bool = False
    leftover: bool = False  # bytes came after the answer
    version: bytes = b""  # the final answer's HTTP version
    interim: int = 0


def h11_answers(exchanges: Sequence[bytes], *, eof: bool = True, max_head_bytes: int = 65536) -> list[Reference]:
    """What h11 makes of the same exchanges (see :func:`drive` for how a run ends)."""
    c = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head_bytes)
    refs: list[Reference] = []
    for i, data in enumerate(exchanges):
        last = i == len(exchanges) - 1
        if i:
            c.start_next_cycle()
        c.send(h11.Request(method="POST", target="/v2/models/m/infer",
                           headers=[("Host", "backend"), ("Content-Length", "2")]))
        c.send(h11.Data(data=REQUEST_BODY))
        c.send(h11.EndOfMessage())
        ref = Reference("pending")
        parts: list[bytes] = []
        fed_eof = False
        try:
            if data:  # (an empty receive_data is h11's EOF)
                c.receive_data(data)
            while True:
                ev = c.next_event()
                if ev is h11.NEED_DATA:
                    if eof and not fed_eof:
                        fed_eof = True
                        c.receive_data(b"")
                        continue
                    break
                if isinstance(ev, h11.InformationalResponse):
                    ref.interim += 1
                elif isinstance(ev, h11.Response):
                    ref.status = ev.status_code
                    ref.version = ev.http_version
                    ref.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in ev.headers}
                elif isinstance(ev, h11.Data):
                    parts.append(bytes(ev.data))
                elif isinstance(ev, h11.EndOfMessage):
                    ref.kind = "answer"
                    ref.body = b"".join(parts)
                    break
                elif isinstance(ev, h11.ConnectionClosed):
                    ref.kind, ref.error = "refused", "connection closed"
                    break
                else:
                    break
        except h11.RemoteProtocolError as exc:
            ref.kind, ref.error = "refused", str(exc)
        if ref.kind == "answer":
            leftover, closed = c.trailing_data
            ref.leftover = bool(leftover)
            if last and eof:
                closed = True
            ref.reusable = (c.our_state is h11.DONE and c.their_state is h11.DONE and not leftover and not closed)
        refs.append(ref)
        if last or not ref.reusable:
            break
    return refs
