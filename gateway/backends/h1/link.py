"""A backend connection's state and its transport: what one connection holds between and during
exchanges, closing it, flow control both ways, and the end of a streamed exchange. The base of
:class:`~.connection.Connection`: reading answers is ``reader``'s, the exchanges ``connection``'s."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol, Self

import httptools

from ...rawbody import HEAD_READ, RawBody, plain_socket
from .answer import BodyStream, H1Response
from .errors import BadAnswer
from .limits import AnswerLimits

__all__ = ["Link", "Waiter"]


class Waiter(Protocol):
    """Where an exchange's answer goes: the future :meth:`Connection.exchange` awaits, or the
    pool's ``Pending`` (an exchange answered from callbacks, pool.py)."""

    def done(self) -> bool: ...

    def set_result(self, response: H1Response, /) -> None: ...

    def set_exception(self, exc: Exception, /) -> None: ...


class Link(asyncio.BufferedProtocol):
    """What one kept-alive HTTP/1.1 connection holds (every slot of it), and its transport."""

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
        "_fd",
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
        "_parts",
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
        "_whole",
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
        self._fd = -1  # the socket's descriptor for a raw body's low-water mark (rawbody.plain_socket)
        self._fut: Waiter | None = None
        self._answer: H1Response | None = None  # a complete answer not yet handed over (_deliver)
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._buf: bytearray | None = None
        self._claim = 0  # the Content-Length of a whole body read into _buf
        self._whole: bytes | None = None  # a whole body's final bytes, filled as they come (_fill.c)
        # A request body in pieces (a converted gRPC message's views), emptied once a 2xx answer's
        # head comes: the backend ran the request, it is not sent again, and the client's message
        # can go before the answer is read in beside it.
        self._parts: list[bytes | memoryview] | None = None
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
        # A streamed answer's body read past the parser (reader.AnswerReader): the rest of it,
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
        self._on_end: Callable[[Self], None] | None = None
        self.keep_alive = True
        self.closed = False
        self.sent_all = True  # False when an answer came before the whole request went out
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.idle_since = 0.0

    # -- asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._fd = plain_socket(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drain()

    def _wake_drain(self, *_: object) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

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

    def _end_stream(self: Self) -> None:
        """A streamed exchange is over: no deadline any more, the connection goes back (once)."""
        self._deadline = 0.0
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            if not self._complete:
                self.close()
            on_end(self)
