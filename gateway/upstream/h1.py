"""A lean HTTP/1.1 client for backend pools: asyncio protocol + httptools parser.

Why not aiohttp (the stack's first choice, still used by the test suite):
profiled here, one small POST through an aiohttp ``ClientSession`` cost
~180 µs of CPU; the same request through this module costs ~30 µs, and it was
the single largest item of the gateway's HTTP pass-through profile (see the
closing notes in benchmarks/README.md). A backend pool needs only a small
part of HTTP/1.1 — keep-alive POST/GET with a known body, responses with
Content-Length or chunked framing — and httptools (the parser uvicorn uses)
does the parsing.

Connections are pooled per endpoint. A request on a *reused* connection that
the server closed before sending a single byte of the answer is retried once
on a fresh connection: that is the keep-alive race (the server timed the idle
connection out as we sent), not a failed request.

A request can also start without a coroutine (:meth:`H1ConnectionPool.request_now`: a
free slot and a kept-alive connection): its answer is handed to a callback from the
connection's own protocol callbacks (the inference path served from callbacks,
frontend/http.py ``infer_now``).

Large bodies stream both ways, so a pass-through proxy never holds one whole
(issue 3's memory target):
- a request body can be a *source* (an object with ``length``, ``consumed`` and
  ``async for`` chunks, e.g. the front end's IncomingBody): chunks are written as
  they come, waiting whenever the socket's write buffer is full. Once a chunk has
  been handed out it cannot be sent again, so a source only goes out on a fresh
  connection or one that finished an exchange less than ``FRESH_S`` ago — far
  inside any server's keep-alive timeout, which is what the retry above is for;
- an answer whose Content-Length is at least ``stream_min`` (when the caller
  asks) is handed over as a :class:`BodyStream` once its head has arrived; so is
  an answer of unknown length (chunked) when the caller asks ``stream_unsized`` —
  Triton's generate_stream sends its server-sent events so, one chunk per event,
  and each must reach the client as it comes.
"""
from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools

from ..rawbody import HEAD_READ, READ_SIZE, RawBody, plain_socket

__all__ = ["FRESH_S", "BodyStream", "ConnectFailed", "ConnectionDropped", "H1ConnectionPool", "H1Response",
           "SourceStalled"]

# A streamed request body reuses a connection only if it was idle for less than this.
FRESH_S = 1.0
# libuv timers count whole milliseconds: one that fires this much before its deadline is on time.
_CLOCK_SLACK = 0.001


class ConnectFailed(Exception):
    """No TCP connection could be made (refused, unreachable, connect timeout)."""


class SourceStalled(Exception):
    """A streamed request body stopped arriving from its client (idle past the timeout)."""


class ConnectionDropped(Exception):
    """The connection closed or broke before a complete answer arrived."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class _IdleClock:
    """The idle bound of a streamed request body (``_Connection._pump``): one timer for the whole
    body, not one per wait. It fires ``idle_s`` after the last progress (a chunk came, or the
    backend took what was written) and, if there was progress since it was armed, re-arms itself
    for ``idle_s`` after that (a timer armed and cancelled per chunk cost ~5 µs a chunk, hundreds
    of chunks per large body). On a stall it records what was awaited and cancels the pump.

    A class, not a closure: compiled by mypyc, a nested function and its enclosing environment
    refer to each other — a reference cycle per streamed request, left to the cyclic GC
    (at 64 concurrent 1 MiB requests its collections cost ~20 µs per request)."""

    __slots__ = ("_handle", "_loop", "_task", "idle_s", "progress", "stalled", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], idle_s: float) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = task
        self.idle_s = idle_s
        self.progress = loop.time()
        self.waiting = "client"
        self.stalled: str | None = None
        self._handle = loop.call_at(self.progress + idle_s, self._check)

    def _check(self) -> None:
        due = self.progress + self.idle_s
        if self._loop.time() + _CLOCK_SLACK < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.stalled = self.waiting
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()
        self._task = None


class BodyStream:
    """A large answer's body, chunk by chunk as it arrives (``async for``); ``length``
    is its Content-Length, None for a chunked answer (its length is known at its end).

    Backpressure: above ``_HIGH`` queued bytes the connection stops reading
    from the socket (the backend's TCP window closes), below ``_LOW`` it reads
    again, so a slow client never makes the gateway hold the whole answer.
    ``close()`` abandons it (the connection is closed if the body is unfinished).
    Errors surface from the iteration: ConnectionDropped or TimeoutError, passed
    through ``map_error`` (set by the pool to its own error tree).
    """

    _HIGH: ClassVar[int] = 4 << 20  # (ClassVar: class constants, also when mypyc compiles this module)
    _LOW: ClassVar[int] = 1 << 20

    __slots__ = ("_chunks", "_conn", "_error", "_finished", "_paused", "_queued", "_waiter", "length", "map_error")

    def __init__(self, conn: _Connection, length: int | None) -> None:
        self.length = length
        self.map_error: Callable[[Exception], Exception] = lambda exc: exc
        self._conn: _Connection | None = conn
        # bytes from the parser, or (a body read raw) views of buffers nothing else writes to
        self._chunks: deque[bytes | memoryview] = deque()
        self._queued = 0
        self._finished = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- producer side (the connection) --------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, chunk: bytes | memoryview) -> None:
        self._chunks.append(chunk)
        self._queued += len(chunk)
        if self._queued > self._HIGH and not self._paused and self._conn is not None:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._finished = True
        if self._paused and self._conn is not None:
            # The chunk that crossed the high mark also ended the answer: the connection
            # goes back to its pool and must read again (its next answer would never arrive).
            self._conn.resume_reading()
        self._paused = False
        self._conn = None
        self._wake()

    def _fail(self, exc: Exception) -> None:
        if not self._finished and self._error is None:
            self._error = exc
            self._conn = None
            self._wake()

    # -- consumer side -------------------------------------------------------
    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes | memoryview:
        while not self._chunks:
            if self._error is not None:
                raise self.map_error(self._error)
            if self._finished:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._queued -= len(chunk)
        if self._paused and self._queued < self._LOW:
            self._paused = False
            if self._conn is not None:
                self._conn.resume_reading()
        return chunk

    def close(self) -> None:
        """Stop reading: an unfinished body closes its connection (it cannot be reused)."""
        self._chunks.clear()
        self._queued = 0
        conn, self._conn = self._conn, None
        if conn is not None and not self._finished:
            self._error = self._error or ConnectionDropped("answer abandoned", before_response=False)
            conn.abandon()


# Not frozen: made for every answer, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~3 x the cost). Nothing writes to one after it is made.
@dataclass(slots=True)
class H1Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes | bytearray | BodyStream


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive HTTP/1.1 connection. A buffered protocol: the loop reads into the
    pool's one read buffer and the parser takes the bytes from there — a plain protocol gets
    each read as a new bytes object, one more copy of every byte of every answer (measured:
    user-space copies were ~13 % of the gateway's CPU on 16 MB answers). One buffer serves
    all of a pool's connections: the loop reads one socket at a time and ``buffer_updated``
    is done with the bytes before it returns (the parser copies what it hands on).

    The body of a streamed answer with a Content-Length (``BodyStream``, ≥ ``stream_min``) is
    read past the parser instead: after the read that brought its head, the loop reads the
    rest of the body straight into buffers of the connection's own that become the stream's
    chunks — no copy at all (the parser would hand each chunk over as a new bytes object: one
    copy of every byte of every large answer). See :meth:`buffer_updated`."""

    __slots__ = (
        "_body",
        "_body_got",
        "_buf",
        "_clock",
        "_clock_at",
        "_complete",
        "_deadline",
        "_drain",
        "_fut",
        "_got_bytes",
        "_hbuf",
        "_headers",
        "_in_body",
        "_loop",
        "_on_end",
        "_parser",
        "_pos",
        "_raw",
        "_raw_keep_alive",
        "_rbuf",
        "_stream",
        "_stream_min",
        "_stream_unsized",
        "_transport",
        "closed",
        "idle_since",
        "keep_alive",
        "sent_all",
        "write_paused",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, read_buffer: memoryview) -> None:
        self._loop = loop
        self._rbuf = read_buffer
        # While an answer's head is awaited a read takes at most HEAD_READ bytes (rawbody.py):
        # the rest of a large body stays in the socket for the raw read.
        self._hbuf = read_buffer[:HEAD_READ]
        self._in_body = False
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._fut: asyncio.Future[H1Response] | _Pending | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._buf: memoryview | None = None
        self._pos = 0
        self._got_bytes = False
        self._complete = False
        self._stream: BodyStream | None = None
        self._stream_min: int | None = None
        self._stream_unsized = False
        # A streamed answer's body read past the parser (see the class text): the rest of it,
        # and the answer's keep-alive.
        self._raw: RawBody | None = None
        self._raw_keep_alive = False
        self._body_got = 0  # body bytes of a streamed answer the parser handed over
        # The current exchange's deadline (loop time; 0: none) and the one timer that
        # watches it: see _arm().
        self._deadline = 0.0
        self._clock: asyncio.TimerHandle | None = None
        self._clock_at = 0.0
        # Called once when a streamed exchange ends (complete, failed or abandoned):
        # the pool takes the connection back and frees its slot.
        self._on_end: Callable[[_Connection], None] | None = None
        self.keep_alive = True
        self.closed = False
        self.sent_all = True  # False when an answer came before the whole request went out
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.idle_since = 0.0

    # -- asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def get_buffer(self, sizehint: int) -> memoryview:
        raw = self._raw
        if raw is not None:
            return raw.buffer()
        return self._rbuf if self._in_body else self._hbuf

    def buffer_updated(self, nbytes: int) -> None:
        if self._raw is not None:
            self._raw_read(nbytes)
            return
        self.data_received(self._rbuf[:nbytes])
        stream = self._stream
        if stream is not None and stream.length is not None and not self._complete and not self.closed:
            # A streamed answer with a Content-Length is under way and the parser has taken
            # every byte read so far (it stops only at an error): the rest of the body is
            # counted, not parsed, from the next read on. This parser stops here; a new one
            # takes the next answer on this connection (_raw_done).
            self._raw = RawBody(stream.length - self._body_got, plain_socket(self._transport))
            self._raw_keep_alive = self._parser.should_keep_alive()

    # -- a streamed answer's body, read past the parser --------------------------------
    def _raw_read(self, nbytes: int) -> None:
        raw = self._raw
        assert raw is not None and self._stream is not None
        self._got_bytes = True
        self._stream._push(raw.take(nbytes))
        if not raw.left:
            self._raw_done()

    def _raw_done(self) -> None:
        """The raw body is complete: the answer ends as ``on_message_complete`` ends it, and
        the connection gets a new parser for its next answer (this one stopped mid-body)."""
        if self._raw is not None:
            self._raw.done()
        self._raw = None
        self._parser = httptools.HttpResponseParser(self)
        self._in_body = False
        self._complete = True
        self.keep_alive = self._raw_keep_alive
        stream = self._stream
        assert stream is not None
        stream._finish()
        self._end_stream()

    def data_received(self, data: bytes | memoryview) -> None:
        self._got_bytes = True
        if self._fut is None and self._on_end is None:
            # Bytes nobody asked for (a server talking out of turn): this connection is unusable.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionDropped(f"malformed HTTP response: {exc}", before_response=False))
            self.close()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drain()

    def _wake_drain(self, *_: object) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake_drain()
        error = ConnectionDropped(
            f"connection closed by the backend{': ' + str(exc) if exc else ''}",
            before_response=not self._got_bytes,
        )
        if self._fut is not None and not self._fut.done():
            self._fail(error)
        if self._stream is not None and not self._complete:
            self._stream._fail(error)
            self._end_stream()

    # -- httptools callbacks --------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._in_body = True
        length = self._headers.get("content-length", "")
        sized = length.isascii() and length.isdigit()  # not str.isdigit() alone: it takes "²"
        if (self._stream_min is not None and sized and int(length) >= self._stream_min) or \
                (self._stream_unsized and not sized):
            self._stream = BodyStream(self, int(length) if sized else None)
            fut = self._fut
            if fut is not None and not fut.done():
                fut.set_result(H1Response(self._parser.get_status_code(), self._headers, self._stream))
            return
        if length.isascii() and length.isdigit() and int(length) > 1 << 20:
            # One buffer of the announced size, filled as chunks arrive: no chunk list
            # beside a joined copy (2x the answer), no second set of fresh pages.
            self._buf = memoryview(bytearray(int(length)))
            self._pos = 0

    def on_body(self, body: bytes) -> None:
        if self._stream is not None:
            self._body_got += len(body)
            self._stream._push(body)
        elif self._buf is not None:
            end = self._pos + len(body)
            self._buf[self._pos : end] = body
            self._pos = end
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._stream is not None:
            self._stream._finish()
            self._end_stream()
            return
        if self._buf is not None:
            buf: bytearray = self._buf.obj  # type: ignore[assignment]
            body: bytes | bytearray = buf[: self._pos] if self._pos != len(buf) else buf
            self._buf = None
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(H1Response(self._parser.get_status_code(), self._headers, body))

    # -- use ------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        self._deadline = 0.0
        if self._clock is not None:
            self._clock.cancel()  # (it holds this connection until it fires)
            self._clock = None
        if self._transport is not None:
            self._transport.close()

    @property
    def streaming(self) -> bool:
        """A streamed answer is still arriving (its end will call ``on_end``)."""
        return self._on_end is not None

    def pause_reading(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()

    def abandon(self) -> None:
        """The consumer of a streamed body stopped before its end."""
        self.close()
        self._end_stream()

    def _end_stream(self) -> None:
        """A streamed exchange is over: no deadline any more, the connection goes back (once)."""
        self._deadline = 0.0
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            if not self._complete:
                self.close()
            on_end(self)

    def _arm(self, timeout: float) -> None:
        """The exchange must be over ``timeout`` seconds from now.

        One timer per connection, armed lazily rather than a timer per exchange: arming and
        cancelling a libuv timer costs ~2.7 µs, about a tenth of the gateway's Python on a
        small request. The timer is left running when an exchange ends; when it fires it
        compares the time with the deadline of the exchange then under way (if any), and
        re-arms itself for it. A connection in steady use thus sees one timer event per
        ``timeout``; it is re-armed early only when a deadline comes before the armed one."""
        deadline = self._loop.time() + timeout
        self._deadline = deadline
        clock = self._clock
        if clock is None or self._clock_at > deadline:
            if clock is not None:
                clock.cancel()
            self._clock = self._loop.call_at(deadline, self._tick)
            self._clock_at = deadline

    def _tick(self) -> None:
        self._clock = None
        deadline = self._deadline
        if not deadline or self.closed:
            return
        if self._loop.time() + _CLOCK_SLACK < deadline:  # an earlier exchange's time: not this one's
            self._clock = self._loop.call_at(deadline, self._tick)
            self._clock_at = deadline
            return
        self._deadline = 0.0
        self._timed_out()

    def _timed_out(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(TimeoutError())
        elif self._stream is not None and not self._complete:
            # The head came in time, the rest of the body did not.
            self._stream._fail(TimeoutError())
            self.close()
            self._end_stream()

    async def _pump(self, source: Any, idle_s: float) -> None:
        """Write a streamed request body as it arrives, pausing while the socket's
        write buffer is full. Stops early if the answer (or a failure) comes first:
        the connection then cannot carry another request.

        Each wait — for the client's next chunk, or for the backend to take what was
        written — is bounded by ``idle_s`` (nginx's client_body_timeout, by analogy):
        a stalled client raises SourceStalled, a backend that stopped reading TimeoutError.
        """
        fut = self._fut
        assert isinstance(fut, asyncio.Future) and self._transport is not None
        fut.add_done_callback(self._wake_drain)
        task = asyncio.current_task()
        assert task is not None
        loop = self._loop
        clock = _IdleClock(loop, task, idle_s)
        chunks = source.__aiter__()
        try:
            while True:
                clock.waiting = "client"
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                clock.progress = loop.time()
                if fut.done() or self.closed or self._transport.is_closing():
                    self.sent_all = False
                    return
                self._transport.write(chunk)
                if self.write_paused:
                    clock.waiting = "backend"
                    try:
                        while self.write_paused and not fut.done() and not self.closed:
                            self._drain = loop.create_future()
                            await self._drain
                    finally:
                        self._drain = None
                    clock.progress = loop.time()
        except asyncio.CancelledError:
            stalled = clock.stalled
            if stalled is None:
                raise
            task.uncancel()
            if stalled == "client":
                raise SourceStalled(f"the request body stalled: no bytes from the client for {idle_s}s") from None
            raise TimeoutError(f"the backend took no request body bytes for {idle_s}s") from None
        finally:
            clock.stop()

    def _reset(self, fut: Any, stream_min: int | None, stream_unsized: bool) -> None:
        """A new exchange begins: ``fut`` gets its answer (a future, or a :class:`_Pending`)."""
        self._fut = fut
        self._headers = {}
        self._body = []
        self._buf = None
        self._stream = None
        self._stream_min = stream_min
        self._stream_unsized = stream_unsized
        self._got_bytes = False
        self._in_body = False
        self._complete = False
        self.sent_all = True
        if self._raw is not None:
            self._raw.done()
        self._raw = None
        self._body_got = 0

    def start(self, pending: _Pending, head: bytes, body: bytes | bytearray | memoryview,
              stream_min: int | None) -> None:
        """The request of a :class:`_Pending` exchange, written at once (its answer reaches
        ``pending`` from this protocol's callbacks)."""
        assert self._transport is not None
        self._reset(pending, stream_min, False)
        if len(body) <= 65536 and not isinstance(body, memoryview):
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.writelines([head, body])

    async def exchange(self, head: bytes, body: bytes | bytearray | memoryview | None, timeout: float,
                       stream_min: int | None = None,
                       on_end: Callable[[_Connection], None] | None = None,
                       stream_unsized: bool = False) -> H1Response:
        """Send one request and wait for its answer. A timer (not ``asyncio.wait_for``,
        which costs a task per call in Python 3.11) bounds the exchange from the end of
        the request (as Envoy's route timeout) to the end of the answer, a streamed
        answer included; while a streamed request body goes out, each wait is bounded by
        ``timeout`` instead. When the answer is streamed and not yet complete, ``on_end``
        is called once it ends; otherwise the exchange is over on return."""
        assert self._transport is not None
        if self._transport.is_closing():
            # The peer closed this idle connection and the loop has not told us yet
            # (uvloop refuses the write): nothing was sent, so it is the keep-alive race.
            self.closed = True
            raise ConnectionDropped("connection closed by the backend", before_response=True)
        fut: asyncio.Future[H1Response] = self._loop.create_future()
        self._reset(fut, stream_min, stream_unsized)
        if hasattr(body, "__aiter__"):
            self._transport.write(head)
            try:
                await self._pump(body, timeout)
            except BaseException:
                self._fut = None
                self.close()
                raise
        elif isinstance(body, list):
            self._transport.writelines([head, *body])  # each part as it is: no joined copy
        elif body is not None and len(body) <= 65536:
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.write(head)
            if body is not None:
                self._transport.write(body)
        self._arm(timeout)
        try:
            response = await fut
        except BaseException:
            self._broken()
            raise
        self._answered(on_end)
        return response

    def _answered(self, on_end: Callable[[_Connection], None] | None) -> None:
        """The answer, or the head of a streamed one, has come. A streamed body goes on: the
        deadline keeps bounding it and ``on_end`` is called at its end. Otherwise the exchange
        is over, and the connection closed unless it can carry another."""
        self._fut = None
        if self._stream is not None and not self._complete and not self.closed:
            self._on_end = on_end
            return
        self._deadline = 0.0
        if not self._complete or not self.keep_alive or not self.sent_all:
            self.close()

    def _broken(self) -> None:
        """The exchange failed: the connection cannot carry another."""
        self._fut = None
        self.close()


class _Slots:
    """The connection slots of one endpoint: at most ``limit`` exchanges at once; the rest
    wait in order within their timeout. (Not an asyncio.Semaphore: :meth:`H1ConnectionPool.
    request_now` must take a slot without awaiting, and a semaphore has no such call.)"""

    __slots__ = ("_waiters", "free", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def take(self, timeout: float) -> None:
        """A slot, waiting at most ``timeout`` seconds (TimeoutError)."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over just as the wait ended: passed on
            else:
                waiter.cancel()
            raise

    def give(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to the longest waiting, still taken
                return
        self.free += 1


class _Pending:
    """An exchange started by :meth:`H1ConnectionPool.request_now`: it stands where a
    future stands in :meth:`_Connection.exchange` (the connection calls ``done``,
    ``set_result`` and ``set_exception`` on it), and hands the outcome to ``callback``
    from the connection's own callbacks — no task, no future, no coroutine."""

    __slots__ = ("_callback", "_conn", "_finished", "_pool", "request")

    def __init__(self, pool: H1ConnectionPool, conn: _Connection,
                 callback: Callable[[H1Response | Exception], None], request: tuple[Any, ...]) -> None:
        self._pool = pool
        self._conn = conn
        self._callback = callback
        self._finished = False
        self.request = request  # request_now's arguments, to send it again (the keep-alive race)

    def done(self) -> bool:
        return self._finished

    def set_result(self, response: H1Response) -> None:
        self._finished = True
        pool = self._pool
        # As request() after its exchange: a streamed body's end hands connection and slot back.
        self._conn._answered(pool._stream_ended)
        if not pool._settle(self._conn):
            pool._slots.give()
        self._callback(response)

    def set_exception(self, exc: Exception) -> None:
        self._finished = True
        self._conn._broken()
        self._pool._slots.give()
        if isinstance(exc, ConnectionDropped) and exc.before_response:
            # The keep-alive race (the connection was a reused one): sent again as request()
            # sends it again, on another idle connection or a fresh one.
            self._pool._again(self._callback, *self.request)
            return
        self._callback(exc)


def _unless_resendable(exc: ConnectionDropped, body: Any) -> None:
    """A connection dropped before the answer began: part of a streamed body may be gone
    with it, and then it cannot be sent again, here or elsewhere."""
    if getattr(body, "consumed", False):
        raise ConnectionDropped(str(exc), before_response=False) from exc


class H1ConnectionPool:
    """Keep-alive connections to one endpoint (host, port)."""

    def __init__(self, host: str, port: int, *, connect_timeout: float, max_idle: int = 256,
                 max_connections: int = 512, ssl: ssl_module.SSLContext | None = None,
                 server_name: str | None = None) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl
        self._server_name = server_name
        # At most this many exchanges (= open connections) at once; the rest wait for a
        # free one within their timeout, so a burst of clients cannot open thousands of
        # connections to one backend.
        self.max_connections = max_connections
        self._slots = _Slots(max_connections)
        self._host_header = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("latin-1")
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._starts: dict[tuple[str, str], bytes] = {}
        self._again_tasks: set[asyncio.Task[None]] = set()
        self._rbuf = memoryview(bytearray(READ_SIZE))  # (_Connection: shared by its connections)
        self.closed = False  # closed pools keep no connection: those in use close when done

    @property
    def busy(self) -> int:
        """Exchanges holding a connection slot now (waiting ones not included)."""
        return self._slots.limit - self._slots.free

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self._rbuf), self.host, self.port, ssl=self._ssl,
                                       server_hostname=(self._server_name or self.host) if self._ssl else None),
                self._connect_timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(f"{exc.__class__.__name__}: {exc}") from exc
        return conn

    def _head(self, method: str, path: str, headers: Mapping[str, str] | None, length: int | None) -> bytes:
        start = self._starts.get((method, path))
        if start is None:
            # The request line and Host of each (method, path), made once: a pool sends few.
            if len(self._starts) >= 1024:
                self._starts.clear()
            start = self._starts[(method, path)] = (f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
                                                    + b"Host: " + self._host_header + b"\r\n")
        parts = [start]
        if length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if headers:
            parts.append("".join([f"{k}: {v}\r\n" for k, v in headers.items()]).encode("latin-1"))
        parts.append(b"\r\n")
        return b"".join(parts)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | bytearray | memoryview | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
        stream_min: int | None = None,
        stream_unsized: bool = False,
    ) -> H1Response:
        """One exchange; raises ConnectFailed, ConnectionDropped or asyncio.TimeoutError.
        An answer with a Content-Length of at least ``stream_min``, or (``stream_unsized``)
        one without a Content-Length, comes back as a :class:`BodyStream`; its connection
        stays taken until the body has arrived."""
        if isinstance(body, list):
            body = [b if isinstance(b, (bytes, bytearray)) else memoryview(b).cast("B") for b in body]
            length: int | None = sum(len(b) for b in body)
        elif hasattr(body, "__aiter__"):
            length = body.length  # type: ignore[union-attr]
        else:
            length = len(body) if body is not None else None
        head = self._head(method, path, headers, length)
        if not self._slots.take_now():
            try:
                await self._slots.take(timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"all {self.max_connections} connections to {self.host}:{self.port} stayed busy") from None
        # (The exchange is written out here rather than in helpers: each coroutine layer
        # costs its share on every request.)
        try:
            while True:
                conn = self._idle_connection(hasattr(body, "__aiter__"))
                fresh = conn is None
                if conn is None:
                    conn = await self._connect()
                try:
                    response = await conn.exchange(head, body, timeout, stream_min, self._stream_ended,
                                                   stream_unsized)
                    break
                except ConnectionDropped as exc:
                    if not exc.before_response:
                        raise
                    _unless_resendable(exc, body)
                    if fresh:
                        raise
                    # The keep-alive race on a reused connection: retry on another (or a fresh) one.
        except BaseException:
            self._slots.give()
            raise
        if not self._settle(conn):
            self._slots.give()
        return response

    def request_now(self, method: str, path: str, body: bytes | bytearray | memoryview,
                    headers: Mapping[str, str] | None,
                    timeout: float, stream_min: int | None,
                    callback: Callable[[H1Response | Exception], None]) -> bool:
        """:meth:`request` without a coroutine, when it can start at once: a free slot and
        a kept-alive connection. The request is written now and the answer (or the error
        :meth:`request` would raise) goes to ``callback`` from the connection's callbacks;
        a streamed answer's body follows as :meth:`request`'s does. False: nothing was done
        (no slot or no idle connection; :meth:`request` connects or waits).

        The keep-alive race (the reused connection dropped before a byte of the answer) is
        what :meth:`request` retries itself: the request goes out again through it (a task),
        whose outcome reaches ``callback`` the same way."""
        if not self._idle or not self._slots.take_now():
            return False
        conn = self._idle_connection(False)
        if conn is None:
            self._slots.give()
            return False
        head = self._head(method, path, headers, len(body))
        pending = _Pending(self, conn, callback, (method, path, body, headers, timeout, stream_min))
        conn.start(pending, head, body, stream_min)
        conn._arm(timeout)
        return True

    def _again(self, callback: Callable[[H1Response | Exception], None], method: str, path: str,
               body: bytes | bytearray | memoryview, headers: Mapping[str, str] | None, timeout: float,
               stream_min: int | None) -> None:
        async def again() -> None:
            try:
                response = await self.request(method, path, body=body, headers=headers, timeout=timeout,
                                              stream_min=stream_min)
            except Exception as exc:
                callback(exc)
                return
            except asyncio.CancelledError:
                callback(ConnectionDropped("the gateway is shutting down", before_response=False))
                raise
            callback(response)

        task = asyncio.get_running_loop().create_task(again())
        self._again_tasks.add(task)  # (a task nobody holds may be collected mid-flight)
        task.add_done_callback(self._again_tasks.discard)

    def _idle_connection(self, source: bool) -> _Connection | None:
        """A kept-alive connection to reuse, or None for a fresh one. A streamed body
        (``source``) goes out on a fresh connection rather than risk the keep-alive race on
        one idle for long: once sent, its chunks cannot be sent again."""
        idle = self._idle
        while idle:
            if source and asyncio.get_running_loop().time() - idle[-1].idle_since > FRESH_S:
                return None
            conn = idle.pop()
            if conn.closed:
                continue
            if conn._transport is None or conn._transport.is_closing():
                conn.close()  # closed by the backend while idle; the loop has not said so yet
                continue
            return conn
        return None

    def _stream_ended(self, conn: _Connection) -> None:
        self._release(conn)
        self._slots.give()

    def _settle(self, conn: _Connection) -> bool:
        """Back to the pool now, unless a streamed body is still arriving (its end does it
        then): True while the exchange goes on."""
        if conn.streaming:
            return True
        self._release(conn)
        return False

    def _release(self, conn: _Connection) -> None:
        if conn.closed or not conn.keep_alive or not conn.sent_all or self.closed:
            conn.close()
        elif len(self._idle) < self._max_idle:
            conn.idle_since = conn._loop.time()  # (not get_running_loop(): a getpid() system call per call in 3.11)
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        self.closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
