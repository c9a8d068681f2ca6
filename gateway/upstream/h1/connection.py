"""One kept-alive HTTP/1.1 connection to a backend: an asyncio buffered protocol over httptools'
response parser, and the idle bound of a request body it streams out.

The backend is untrusted input, and the framing is as strict as nginx's and Envoy's (RFC 9112
section 6, RFC 9110 section 15.2):

- a connection carries one exchange at a time; interim answers (1xx but 101) are read and
  dropped, at most ``MAX_INTERIM`` of them; a 101 is refused (the client never asks to upgrade);
- any byte after a complete answer, or while no exchange is under way, poisons the connection:
  it is closed and never reused, and the bytes are never parsed into another exchange's answer
  (the answer already complete is still delivered);
- an answer with neither Content-Length nor chunked framing is read to the connection's end
  (close-delimited: HTTP/1.0, or ``Connection: close`` without a length) and is complete there;
- conflicting or invalid framing (two Content-Lengths, Content-Length with Transfer-Encoding, a
  Transfer-Encoding other than chunked, a bad chunk) is refused (llhttp's strict mode does most
  of it), as is a head or body over ``AnswerLimits``. A Content-Length is a claim, not an
  allocation: the buffer of a whole body grows with the bytes that arrive.
Every refusal is a :class:`BadAnswer` and closes the connection."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, Protocol

import httptools

from ...malloc import large_answer
from ...rawbody import HEAD_READ, RawBody, plain_socket
from .answer import BodyStream, H1Response
from .errors import BadAnswer, ConnectionDropped, SourceStalled
from .limits import MAX_INTERIM, AnswerLimits

__all__ = ["CLOCK_SLACK", "Connection", "IdleClock", "Waiter"]

# libuv timers count whole milliseconds: one that fires this much before its deadline is on time.
CLOCK_SLACK = 0.001

# A whole body of unknown truth (its Content-Length is only a claim) goes into a buffer that
# starts this large and grows 4-fold as bytes arrive, never past the claim: a backend that
# lies makes the gateway hold at most ~4 x what it really sent; an honest 16 MB answer costs
# two extra copies of 1 and 4 MiB.
_FIRST_BUF = 1 << 20
_GROWTH = 4


_CRLF = (10, 13)


class _Poisoned(Exception):
    """Raised from the parser's message-begin callback to stop it: bytes after the answer."""


class Waiter(Protocol):
    """Where an exchange's answer goes: the future :meth:`Connection.exchange` awaits, or the
    pool's ``Pending`` (an exchange answered from callbacks, pool.py)."""

    def done(self) -> bool: ...

    def set_result(self, response: H1Response, /) -> None: ...

    def set_exception(self, exc: Exception, /) -> None: ...


class IdleClock:
    """The idle bound of a streamed request body (``Connection._pump``): one timer for the whole
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
        if self._loop.time() + CLOCK_SLACK < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.stalled = self.waiting
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()
        self._task = None


class Connection(asyncio.BufferedProtocol):
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
        "_answer",
        "_body",
        "_body_got",
        "_body_len",
        "_buf",
        "_chunk_at",
        "_chunk_open",
        "_claim",
        "_clock",
        "_clock_at",
        "_complete",
        "_deadline",
        "_drain",
        "_eof_body",
        "_fut",
        "_got_bytes",
        "_hbuf",
        "_head_fed",
        "_header_count",
        "_headers",
        "_in_body",
        "_interim",
        "_interim_now",
        "_last_body",
        "_limits",
        "_max_head",
        "_max_headers",
        "_loop",
        "_max_body",
        "_on_end",
        "_parser",
        "_pos",
        "_raw",
        "_raw_keep_alive",
        "_poisoned",
        "_rbuf",
        "_refusal",
        "_status",
        "_stream",
        "_stream_min",
        "_stream_unsized",
        "_tail_fed",
        "_transport",
        "closed",
        "idle_since",
        "keep_alive",
        "sent_all",
        "write_paused",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, read_buffer: memoryview, limits: AnswerLimits) -> None:
        self._loop = loop
        self._limits = limits
        # (The limits read on every read and header, as plain ints of this object's own.)
        self._max_head = limits.max_head_bytes
        self._max_headers = limits.max_header_count
        self._rbuf = read_buffer
        # While an answer's head is awaited a read takes at most HEAD_READ bytes (rawbody.py):
        # the rest of a large body stays in the socket for the raw read.
        self._hbuf = read_buffer[:HEAD_READ]
        self._in_body = False
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._fut: Waiter | None = None
        self._answer: H1Response | None = None  # a complete answer not yet handed over (_deliver)
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._buf: bytearray | None = None
        self._claim = 0  # the Content-Length of a whole body read into _buf
        self._pos = 0
        self._body_len = 0  # body bytes of the answer so far (the body limit)
        self._last_body = b""  # the last piece of it the parser handed over
        self._max_body = limits.max_body_bytes
        self._head_fed = 0  # bytes fed to the parser while a head was awaited (the head limit)
        self._status = 0  # the answer's status, once its head is complete
        self._refusal: BadAnswer | None = None  # what a parser callback refused the answer with
        self._poisoned = False  # a callback saw a message begin after the answer
        self._header_count = 0
        self._interim = 0  # interim (1xx) answers read in this exchange
        self._interim_now = False  # the answer being parsed is an interim one
        self._eof_body = False  # the answer's body ends with the connection (close-delimited)
        self._chunk_open = False  # a chunk's size line was read, its end not yet
        self._chunk_at = 0  # _body_len when it was
        self._tail_fed = 0  # bytes read since, with none of the chunk's data (trailers)
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
        self._on_end: Callable[[Connection], None] | None = None
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
        if self._in_body:
            return self._rbuf
        # A head is awaited: never more than one byte past the head limit is read for it (the
        # limit is then exact, whatever the reads' sizes).
        room = self._max_head + 1 - self._head_fed
        return self._hbuf if room >= HEAD_READ else self._hbuf[: max(room, 1)]

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
        if stream.length is not None and stream.length >= _FIRST_BUF:
            large_answer()  # its chunks were the reads' own buffers: the idle trim follows them
        stream._finish()
        self._end_stream()

    def data_received(self, data: bytes | memoryview) -> None:
        self._got_bytes = True
        if (self._fut is None and self._on_end is None) or self._complete:
            # Bytes nobody asked for (a server talking out of turn, or more after a complete
            # answer): this connection is unusable, and they are nobody's answer.
            self.close()
            return
        if not self._in_body:
            self._head_fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # What a callback raised is kept on this object (_held), not read from the parser's
            # exception: httptools chains it as __context__, which Python overwrites when the
            # feed runs while another exception is being handled further up.
            refusal = self._refusal
            if self._poisoned or self._complete:
                self.close()  # bytes after a complete answer (still delivered): never reused
            elif refusal is not None:
                self._refuse(refusal)
            else:
                self._refuse(BadAnswer(f"malformed HTTP answer: {exc}", kind=BadAnswer.FRAMING))
        except httptools.HttpParserUpgrade:
            self._refuse(BadAnswer("a 101 (protocol switch) answer: the gateway asked for no upgrade",
                                   kind=BadAnswer.FRAMING))
        if self._complete and not self.closed and data[-1] in _CRLF and self._blank_after(data):
            self.close()  # bytes after a complete answer (still delivered): never reused
        if self._answer is not None:
            self._deliver()
        elif self.closed:
            pass
        elif not self._in_body:
            # The head limit holds for a head still arriving too: httptools gathers a header's
            # value until it ends, and would otherwise hold a 10 MiB header whole.
            if self._head_fed > self._max_head:
                self._refuse(BadAnswer(f"answer head over max_answer_head_bytes ({self._limits.max_head_bytes})",
                                       kind=BadAnswer.TOO_LARGE))
        elif self._chunk_open and self._body_len == self._chunk_at:
            # Bytes after a chunk's size line and none of its data: the last chunk's trailer
            # fields (or a long chunk line), which httptools gathers whole: bounded as a head.
            self._tail_fed += len(data)
            if self._tail_fed > self._max_head:
                self._refuse(BadAnswer(f"answer trailers over max_answer_head_bytes "
                                       f"({self._limits.max_head_bytes})", kind=BadAnswer.TOO_LARGE))
        else:
            self._tail_fed = 0

    def _held(self, exc: BadAnswer) -> BadAnswer:
        """``exc``, kept as this answer's refusal: raised from a parser callback, it stops the
        parser, and data_received refuses the answer with it."""
        self._refusal = exc
        return exc

    def _blank_after(self, data: bytes | memoryview) -> bool:
        """Whether the read that completed the answer went on with empty lines (CR / LF), which
        llhttp skips between messages without a callback. Told from the answer's own last bytes:
        a chunked answer ends with exactly CRLF CRLF after a character that is neither; a sized
        one with its body's own run of CR / LF (and, for an empty body or one of CR / LF alone,
        the head's closing CRLF CRLF)."""
        tail = bytes(data[-64:])
        run = len(tail) - len(tail.rstrip(b"\r\n"))
        if "transfer-encoding" in self._headers:
            return run > 4
        last = self._last_body
        own = len(last) - len(last.rstrip(b"\r\n"))
        return run > (own + 4 if own == self._body_len else own)

    def _refuse(self, exc: BadAnswer) -> None:
        """The answer is refused: the exchange fails with ``exc`` and the connection closes.
        What was gathered of it goes at once (no reference to it stays here)."""
        self._buf = None
        self._body = []
        if self._body_len >= _FIRST_BUF:
            large_answer()
        self._fail(exc)
        stream = self._stream
        if stream is not None and not self._complete:
            stream._fail(exc)
            self.close()
            self._end_stream()
        else:
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
        if exc is None and self._eof_body and self._in_body and not self._complete:
            # A close-delimited answer (RFC 9112 section 6.3 rule 8) ends here.
            self.keep_alive = False
            self.on_message_complete()
            self._deliver()
            return
        error = ConnectionDropped(
            f"connection closed by the backend{': ' + str(exc) if exc else ''}"
            f"{' mid-answer' if self._got_bytes else ''}",
            before_response=not self._got_bytes,
        )
        # What was gathered of an unfinished answer goes now, not when this object does.
        self._buf = None
        self._body = []
        if self._body_len >= _FIRST_BUF:
            large_answer()
        if self._fut is not None and not self._fut.done():
            self._fail(error)
        if self._stream is not None and not self._complete:
            self._stream._fail(error)
            self._end_stream()

    # -- httptools callbacks --------------------------------------------------
    def on_message_begin(self) -> None:
        if self._complete or (self._fut is None and self._on_end is None):
            self._poisoned = True
            raise _Poisoned()
        self._headers = {}
        self._header_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._max_headers:
            raise self._held(BadAnswer(f"answer head over max_answer_header_count ({self._max_headers})",
                                       kind=BadAnswer.TOO_LARGE))
        if self._in_body:
            return  # a trailer field: never merged into the head (RFC 9110 section 6.5.1)
        key = name.decode("latin-1").lower()
        if key == "transfer-encoding" and key in self._headers:
            # A second line could make "chunked" twice, or hide a coding (nginx refuses it too).
            raise self._held(BadAnswer("Transfer-Encoding given twice", kind=BadAnswer.FRAMING))
        self._headers[key] = value.decode("latin-1")

    def on_chunk_header(self) -> None:
        self._chunk_open = True
        self._chunk_at = self._body_len

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def on_headers_complete(self) -> None:
        status = self._status = self._parser.get_status_code()
        if status < 200:
            if status < 100:
                raise self._held(BadAnswer(f"status {status:03d} (a status is 100 to 599)",
                                           kind=BadAnswer.FRAMING))
            if status == 101:
                raise self._held(BadAnswer("a 101 (protocol switch) answer: the gateway asked for no upgrade",
                                           kind=BadAnswer.FRAMING))
            # Interim (RFC 9110 section 15.2): read and dropped; the final answer follows.
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise self._held(BadAnswer(f"more than {MAX_INTERIM} interim (1xx) answers",
                                           kind=BadAnswer.FRAMING))
            self._interim_now = True
            return
        self._in_body = True
        headers = self._headers
        length = headers.get("content-length", "")
        sized = length.isascii() and length.isdigit()  # not str.isdigit() alone: it takes "²"
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # Only chunked alone: another coding would reach the client still applied (the
            # gateway removes none), and one not ending in chunked would be read to the end
            # (RFC 9112 section 6.3 rule 4). nginx refuses both.
            raise self._held(BadAnswer(f"Transfer-Encoding {coding!r} (only chunked is read)",
                                       kind=BadAnswer.FRAMING))
        claim = int(length) if sized else 0
        if claim > self._max_body:
            raise self._held(BadAnswer(f"answer of {claim} bytes (Content-Length) over {self._limit_name()}",
                                       kind=BadAnswer.TOO_LARGE))
        self._eof_body = not sized and coding is None and status not in (204, 304)
        if (self._stream_min is not None and sized and claim >= self._stream_min) or \
                (self._stream_unsized and not sized):
            self._stream = BodyStream(self, claim if sized else None)
            fut = self._fut
            if fut is not None and not fut.done():
                fut.set_result(H1Response(status, headers, self._stream))
            return
        if claim > _FIRST_BUF:
            # One buffer filled as chunks arrive: no chunk list beside a joined copy (2x the
            # answer). It grows with what arrives (_grow), up to the claim at most.
            self._buf = bytearray(_FIRST_BUF)
            self._claim = claim
            self._pos = 0

    def _limit_name(self) -> str:
        key = "max_check_answer_bytes" if self._max_body < self._limits.max_body_bytes else "max_message_bytes"
        return f"the pool's {key} ({self._max_body})"

    def on_body(self, body: bytes) -> None:
        self._last_body = body
        self._body_len += len(body)
        if self._body_len > self._max_body:
            raise self._held(BadAnswer(f"answer body over {self._limit_name()}", kind=BadAnswer.TOO_LARGE))
        if self._stream is not None:
            self._body_got += len(body)
            self._stream._push(body)
        elif self._buf is not None:
            end = self._pos + len(body)
            if end > len(self._buf):
                self._grow(end)
            self._buf[self._pos : end] = body
            self._pos = end
        else:
            self._body.append(body)

    def _grow(self, need: int) -> None:
        buf = self._buf
        assert buf is not None
        bigger = bytearray(min(self._claim, max(need, len(buf) * _GROWTH)))
        bigger[: self._pos] = memoryview(buf)[: self._pos]
        self._buf = bigger

    def on_message_complete(self) -> None:
        if self._interim_now:
            self._interim_now = False
            return
        self._in_body = False
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive() and not self._eof_body
        status = self._status
        if self._stream is not None:
            if self._body_len >= _FIRST_BUF:
                large_answer()
            self._stream._finish()
            self._end_stream()
            return
        if self._buf is not None:
            buf = self._buf
            body: bytes | bytearray = buf[: self._pos] if self._pos != len(buf) else buf
            self._buf = None
            large_answer()
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body = []
        # Handed over once the parser has taken the whole read (data_received): bytes behind the
        # answer in the same read must poison the connection before anyone may reuse it.
        self._answer = H1Response(status, self._headers, body)

    def _deliver(self) -> None:
        answer, self._answer = self._answer, None
        fut = self._fut
        if answer is not None and fut is not None and not fut.done():
            fut.set_result(answer)

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
        if self._loop.time() + CLOCK_SLACK < deadline:  # an earlier exchange's time: not this one's
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
        clock = IdleClock(loop, task, idle_s)
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

    def _reset(self, fut: Any, stream_min: int | None, stream_unsized: bool, max_body: int | None) -> None:
        """A new exchange begins: ``fut`` gets its answer (a future, or the pool's ``Pending``)."""
        self._fut = fut
        self._answer = None
        self._refusal = None
        self._headers = {}
        self._body = []
        self._buf = None
        self._body_len = 0
        self._last_body = b""
        self._max_body = self._limits.max_body_bytes if max_body is None else min(max_body, self._limits.max_body_bytes)
        self._head_fed = 0
        self._header_count = 0
        self._interim = 0
        self._interim_now = False
        self._eof_body = False
        self._chunk_open = False
        self._tail_fed = 0
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

    def start(self, pending: Waiter, head: bytes, body: bytes | bytearray | memoryview,
              stream_min: int | None, max_body: int | None = None) -> None:
        """The request of a ``Pending`` exchange (pool.py), written at once (its answer reaches
        ``pending`` from this protocol's callbacks)."""
        assert self._transport is not None
        self._reset(pending, stream_min, False, max_body)
        if len(body) <= 65536 and not isinstance(body, memoryview):
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.writelines([head, body])

    async def exchange(self, head: bytes, body: bytes | bytearray | memoryview | None, timeout: float,
                       stream_min: int | None = None,
                       on_end: Callable[[Connection], None] | None = None,
                       stream_unsized: bool = False, max_body: int | None = None) -> H1Response:
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
        self._reset(fut, stream_min, stream_unsized, max_body)
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

    def _answered(self, on_end: Callable[[Connection], None] | None) -> None:
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
