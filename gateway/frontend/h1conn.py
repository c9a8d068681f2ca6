"""One client connection of the HTTP listener (h1listen.py): llhttp (httptools) parses; each
request becomes an exchange — a DirectExchange (h1direct.py) for one the router claims, an
AsgiExchange (h1asgi.py) for the rest — that answers through this connection, in order. Large
bodies of directly served requests are read past the parser (rawbody.py).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import httptools

from ..rawbody import HEAD_READ, RawBody, new_buffer, plain_socket
from .h1asgi import AsgiExchange, asgi_address, asgi_scope
from .h1direct import DirectExchange
from .h1sizes import DEFER_MAX, WHOLE_MAX, WHOLE_MIN, declared_body

if TYPE_CHECKING:
    from .h1listen import HttpListener

__all__ = ["LINGER_BYTES", "LINGER_S", "Connection", "Exchange"]

# A refused connection is read and its bytes dropped this long, or this much, before it
# closes (``Connection._refuse``).
LINGER_S = 2.0
LINGER_BYTES = 16 << 20


class Exchange(Protocol):
    """What a connection needs of a request it hands on (DirectExchange, AsgiExchange)."""

    response_started: bool
    response_complete: bool
    disconnected: bool
    keep_alive: bool
    more_body: bool

    def feed(self, chunk: bytes | memoryview) -> None: ...
    def finish(self) -> None: ...
    def set(self) -> None: ...
    async def run(self) -> None: ...



class Connection(asyncio.BufferedProtocol):
    """One client connection: llhttp parses; each request becomes an exchange (direct or ASGI)
    that answers through this connection, in order."""

    def __init__(self, listener: HttpListener, loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.fd = -1
        self.parser: Any = httptools.HttpRequestParser(self)
        self.exchange: Exchange | None = None
        self.pipeline: deque[Exchange] = deque()  # waiting for the answers ahead of them
        self.read_paused = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._head = listener.read_buffer[:HEAD_READ]  # (the same memory as read_buffer)
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.scheme = "http"
        # Per request, while its head arrives.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._continue = False
        # loop.time() when the current request head began (or the connection opened with
        # nothing yet); None once a head is complete. The time of the last body bytes while a
        # body is arriving, else None. When the last answer completed with nothing after it.
        self._head_since: float | None = None
        self._body_at: float | None = None
        self._in_head = False
        self._idle_since: float | None = None
        # A request served directly with a declared body over DEFER_MAX (streamed through) or
        # of WHOLE_MIN..WHOLE_MAX binary bytes (read whole): its length, the body bytes the
        # parser handed over, and once its body is read past the parser (go_raw), the rest.
        self.raw_length = 0
        self._body_got = 0
        self.raw: RawBody | None = None
        self.raw_whole = False
        self.whole_body: memoryview | None = None
        self._upgraded = False
        # A refused connection's reading end (lingering close): what still comes is read and
        # dropped until this time (loop.time()) or LINGER_BYTES, then the connection closes.
        self._linger_until: float | None = None
        self._lingered = 0

    # -- transport events ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # (uvloop's transports are not asyncio.Transport subclasses)
        self.fd = plain_socket(transport)  # for a raw body's low-water mark (rawbody.py)
        listener = self.listener
        listener.opened(self, self.loop)
        if len(listener.connections) > listener.limits.max_connections:
            transport.write(listener.busy)
            transport.close()
            listener.refused("max_connections")
            return
        self.client = asgi_address(transport.get_extra_info("peername"))
        self.server = asgi_address(transport.get_extra_info("sockname"))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self._head_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.closed(self)
        exchange = self.exchange
        if exchange is not None:
            if not exchange.response_complete:
                exchange.disconnected = True
            exchange.set()
            if isinstance(exchange, DirectExchange):
                exchange.cancel_if_gone()
        self.pipeline.clear()
        self.write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)
        if self.raw is not None:
            self.raw.closed()
            self.raw = None
        self.parser = None

    def eof_received(self) -> bool | None:
        return None  # the transport closes (a half-closed client is gone)

    def get_buffer(self, sizehint: int) -> memoryview:
        raw = self.raw
        if raw is not None:
            return raw.buffer()
        # A read while no body is under way (a head is awaited) takes at most HEAD_READ
        # bytes (rawbody.py says why).
        return self.listener.read_buffer if self._body_at is not None else self._head

    def buffer_updated(self, nbytes: int) -> None:
        if self.raw is not None:
            self.raw_read(nbytes)
            return
        self.data_received(self.listener.read_buffer[:nbytes])
        if self.raw_length:
            self.go_raw()

    def data_received(self, data: bytes | memoryview) -> None:
        if self._linger_until is not None:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
            return
        if self._upgraded or self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request that asked to switch was handed on as a plain one (it closes the
            # connection after its answer); whatever follows it is not HTTP/1.1 to us.
            self._upgraded = True
        except httptools.HttpParserError:
            self._refuse(self.listener.bad_request)

    def _refuse(self, answer: bytes) -> None:
        """A request that cannot be parsed or is over a limit: answered if nothing is being
        answered on this connection, then closed (the stream cannot be resynchronised) — by a
        lingering close: closed while the client is still sending, the kernel would answer its
        bytes with a reset, which can destroy the refusal before the client reads it (RFC 9112
        section 9.6). The gateway's side is shut for writing and what comes is dropped for up
        to LINGER_S seconds or LINGER_BYTES bytes (nginx's lingering_close does the same)."""
        exchange = self.exchange
        transport = self.transport
        if transport.is_closing() or self._linger_until is not None:
            return
        if exchange is not None and exchange.response_started and not exchange.response_complete:
            transport.close()  # an answer is half-written: nothing more can go out, cut it
            return
        if exchange is None or exchange.response_complete or not exchange.response_started:
            if exchange is not None and not exchange.response_complete:
                exchange.disconnected = True
                exchange.set()
            transport.write(answer)
        if transport.can_write_eof():
            self.pipeline.clear()
            self._head_since = self._body_at = self._idle_since = None
            self._linger_until = self.loop.time() + LINGER_S
            transport.write_eof()
            self.resume_reading()
        else:
            transport.close()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Waits while the transport's write buffer is over its high-water mark."""
        if not self.write_paused or self.transport.is_closing():
            return
        drained = self._drained = self.loop.create_future()
        try:
            await drained
        finally:
            self._drained = None

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # -- limits ------------------------------------------------------------------------
    def check(self, now: float) -> None:
        """The sweep's look at this connection: a head or a body past its time ends it."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._linger_until is not None:
            if now > self._linger_until:
                transport.close()
            return
        limits = self.listener.limits
        if self._head_since is not None and now - self._head_since > limits.header_timeout_s:
            if self._in_head:  # a request began and its head is still incomplete: 408
                transport.write(self.listener.slow_head)
            transport.close()  # else a connection that never sent a request
            self.listener.refused("header_timeout")
        elif self._body_at is not None and now - self._body_at > limits.body_timeout_s:
            raw = self.raw
            if self.read_paused or (raw is not None and raw.arrived()):
                # Reading is paused because the gateway has not taken what came (its backend
                # is slow): the pause is ours, not the client's. Or the client's bytes are
                # arriving below the read's low-water mark (rawbody.py): not a pause.
                self._body_at = now
                return
            exchange = self.exchange
            if exchange is not None and not exchange.response_started:
                transport.write(self.listener.slow_body)
            transport.close()
            self.listener.refused("body_timeout")
        elif self._idle_since is not None and now - self._idle_since > limits.idle_timeout_s:
            transport.close()

    def shutdown(self) -> None:
        """The listener stops: an idle connection closes now, a busy one after its answer."""
        exchange = self.exchange
        if exchange is None or exchange.response_complete:
            self.transport.close()
        else:
            exchange.keep_alive = False

    def abort(self) -> None:
        self.transport.abort()

    # -- parser callbacks (llhttp) --------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self._head_bytes = 0
        self._continue = False
        self.raw_length = self._body_got = 0
        self.raw_whole = False
        self.whole_body = None
        self._in_head = True
        self._idle_since = None
        self._head_since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._head_bytes += len(url)
        if self._head_bytes > self.listener.head_limit:
            self._too_big()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._continue = True
        self.headers.append((name, value))
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.listener.head_limit:
            self._too_big()

    def _too_big(self) -> None:
        self._in_head = False
        self._refuse(self.listener.big_head)
        raise httptools.HttpParserError("request head too large")  # stops the parser

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_since = None
        parser = self.parser
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive()
        upgrade = parser.should_upgrade()
        if upgrade:
            keep_alive = False
        route, method, path, raw_path, query = self.listener.target(parser.get_method(), self.url)
        exchange: Exchange
        deferred = False
        if route is not None and not upgrade:
            direct = DirectExchange(self, route, method, path, raw_path, query, self.headers, keep_alive,
                                    self._continue)
            exchange = direct
            declared, binary = declared_body(self.headers)
            deferrable = route[1] is not None and not self._continue and declared is not None
            if deferrable and binary and declared is not None and WHOLE_MIN < declared <= WHOLE_MAX:
                self.raw_length = declared  # read whole past the parser after this read (go_raw)
                self.raw_whole = True
            elif declared is not None and declared > DEFER_MAX:
                self.raw_length = declared  # read past the parser after this read (go_raw)
            deferred = deferrable and declared is not None and (declared <= DEFER_MAX or self.raw_whole)
        else:
            scope = asgi_scope(version, method, path, raw_path, query, server=self.server, client=self.client,
                               scheme=self.scheme, headers=self.headers)
            exchange = AsgiExchange(self, self.listener.app, scope, keep_alive, self._continue)
        previous = self.exchange
        self.exchange = exchange
        if previous is None or previous.response_complete:
            if deferred:
                direct.deferred = True  # served once its body is here (on_message_complete)
            else:
                self._start(exchange)
        else:
            # Pipelined behind an answer still going out: it waits, and so does reading.
            self.pause_reading()
            self.pipeline.appendleft(exchange)
        self._body_at = self.loop.time()

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is not None:
            self._body_got += len(body)
            exchange.feed(body)
        self._body_at = self.loop.time()

    def on_message_complete(self) -> None:
        self._body_at = None
        exchange = self.exchange
        if exchange is None:
            return
        exchange.finish()
        if isinstance(exchange, DirectExchange) and exchange.deferred and not exchange.disconnected:
            exchange.serve()

    # -- a large body read past the parser ------------------------------------------------
    def go_raw(self) -> None:
        """After a read: if the body of a request served directly and streamed through is
        under way, the rest of it is counted, not parsed — the loop reads it straight into
        buffers of this connection's own, and each read goes to the exchange as one chunk (a
        view nothing writes over again). httptools would hand every chunk over as a new bytes
        object: one copy of every byte of every large request. The parser takes every byte of
        a read (it stops only at an error, which ends the connection), so the body's remaining
        length is known; a new parser takes the next request."""
        exchange = self.exchange
        if not isinstance(exchange, DirectExchange) or not exchange.more_body or self.transport.is_closing():
            return
        left = self.raw_length - self._body_got
        if left > 0:
            into = None
            if self.raw_whole:
                whole = self.whole_body = new_buffer(self.raw_length)
                got = self._body_got
                if got:
                    whole[:got] = exchange.parsed()  # (what came with the head: at most HEAD_READ)
                into = whole[got:]
            self.raw = RawBody(left, self.fd, into)

    def raw_read(self, nbytes: int) -> None:
        raw = self.raw
        assert raw is not None
        chunk = raw.take(nbytes)
        self._body_at = self.loop.time()
        exchange = self.exchange
        assert isinstance(exchange, DirectExchange)
        whole = self.whole_body
        if whole is None:
            exchange.feed(chunk)  # (a view: the exchange keeps it as it is)
        if not raw.left:
            if whole is not None:
                self.whole_body = None
                exchange.feed(whole)  # the body as one chunk
            raw.done()
            self.raw = None
            self.raw_length = 0
            self.parser = httptools.HttpRequestParser(self)  # (the old one stopped mid-body)
            self.on_message_complete()

    def _start(self, exchange: Exchange) -> None:
        task = self.listener.start_task(exchange.run())
        if isinstance(exchange, DirectExchange):
            exchange.task = task

    # -- answers -----------------------------------------------------------------------------
    def response_complete(self) -> None:
        """An exchange wrote the end of its answer: the next request in line starts, or the
        connection is idle."""
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            self._start(self.pipeline.pop())
        elif not self._in_head:
            self._idle_since = self.loop.time()
