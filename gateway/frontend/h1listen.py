"""The HTTP listener: the gateway's own HTTP/1.1 server on httptools (llhttp), with the hard
limits a front door needs on its connections (config ``limits``).

One :class:`HttpListener` per listening socket; one :class:`Connection` per client connection.
A request the listener's ``direct(method, path)`` router claims (the inference path) is served
without ASGI by a :class:`~.h1direct.DirectExchange`; every other request goes to an ASGI
application (Starlette: metadata, health, control, v1, generate; prometheus-client's metrics app)
through a plain ASGI 3 hand-off (:class:`~.h1asgi.AsgiExchange`). Why not uvicorn: it has no public
interface for a request served outside ASGI, and going through ASGI cost ~124 µs of CPU per small
pass-through against ~88 µs from an httptools protocol (benchmarks/http_floor.py) — the gateway's
inference path would have had to lean on uvicorn's private members, which break between releases.

Limits (uvicorn had none of these; its ``limit_concurrency`` counted tasks and answered in text):
- ``max_connections``: a connection past it gets a 503 JSON answer and is closed.
- ``header_timeout_s``: a request head must be complete this long after the connection opened
  or the request began (slowloris); a new connection that sends nothing is closed after it too.
- ``body_timeout_s``: the longest pause while a request body is arriving; past it the client gets
  408 (if nothing was answered yet) and the connection is closed, which ends the request's
  handling (the handler sees the client gone).
- ``idle_timeout_s``: a keep-alive connection idle this long after an answer is closed.
A head is also bounded in bytes while it arrives (``head_limit``): llhttp itself bounds nothing.
One sweep per listener, twice a second, ends the connections past a deadline: arming and
cancelling two timers per request cost more than the rest of the module together.

Requests on one connection are answered in order (RFC 9112 section 9.3.2): one pipelined behind an
answer still going out waits, and the connection stops reading until its turn. A request that asks
to switch protocols is answered as a plain request and the connection closed after it (the gateway
offers no upgrade; RFC 9110 section 7.8 lets a server ignore Upgrade).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import httptools
import orjson

from ..config.schema import Tls
from ..config.security import Limits
from ..rawbody import HEAD_READ, READ_SIZE, RawBody, new_buffer, plain_socket
from .h1asgi import AsgiApp, AsgiExchange
from .h1direct import DirectExchange, DirectRoute

__all__ = ["DEFER_MAX", "SWEEP_S", "WHOLE_MAX", "WHOLE_MIN", "HttpListener", "server_context"]

log = logging.getLogger("oip_gateway.http")

SWEEP_S = 0.5

# A request served directly whose declared body is at most this long is held until its
# body is all here, then served from callbacks if it can be (h1direct.DirectExchange.serve).
# The front end reads bodies up to the same size whole before anything else happens to them
# (frontend/http.py _LARGE); larger ones stream through from their first bytes.
DEFER_MAX = 1 << 20
# A binary-extension request body (Inference-Header-Content-Length, not compressed) of more
# than WHOLE_MIN and at most WHOLE_MAX bytes is read past the parser into one buffer of its
# exact size (the part that came with the head first), then served as a deferred request
# (from callbacks, as a small one: frontend/http.py infer_now). Streamed instead, a 1 MiB
# request took a task, the coroutine chain through proxy, pool and connection, and a future
# per chunk: benchmarks/instructions.py counted ~490 k instructions per 1 MiB request against
# ~170 k for a small one. Through the parser it would be copied twice (httptools' chunks, then
# joined). A/B (4 rounds), 1 MiB pass-through: CPU per request −11 / −8 / −9 % at c=1 / 16 / 64,
# p50 unchanged on loopback. The price is store-and-forward: the backend gets the body once it
# is all here — at 2 MiB, ~1.7 ms on a 10 Gb/s link — as behind nginx, which buffers request
# bodies by default. (Answers the same way were tried: c=1 +4 %, c=64 −1 %; not kept.)
WHOLE_MIN = 64 * 1024
WHOLE_MAX = 2 << 20
# Cached request targets (method, URL) per listener: clients choose URLs, so bounded.
_TARGETS_MAX = 4096
_TARGET_URL_MAX = 1024


def _answer(status: int, reason: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body))) + body


def server_context(tls: Tls) -> ssl.SSLContext:
    """The HTTP listener's TLS context from the files as they are now (certs.py swaps a fresh one
    in for new handshakes when they change)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls.client_ca)
    context.set_alpn_protocols(["http/1.1"])
    return context


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


Router = Callable[[str, str], DirectRoute | None]
# What a request target (method, URL) means, worked out once: the route the router gives it,
# and its parts as ASGI gives them (a request line repeats).
Target = tuple[DirectRoute | None, str, str, bytes, bytes]


class HttpListener:
    """One listening socket: its connections, the tasks serving their requests, the limits'
    sweep; :meth:`start` and a graceful :meth:`stop`."""

    def __init__(self, app: AsgiApp, *, limits: Limits, direct: Router | None = None,
                 on_refusal: Callable[[str], None] | None = None, context: ssl.SSLContext | None = None,
                 head_limit: int = 1 << 20) -> None:
        self.app = app
        self.limits = limits
        self.direct = direct
        self.context = context
        self.head_limit = head_limit
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.targets: dict[tuple[bytes, bytes], Target] = {}
        self._on_refusal = on_refusal
        self._server: asyncio.Server | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._stopping = False
        self._idle: asyncio.Event | None = None
        # The loop reads every connection of this listener into one buffer: a plain protocol
        # gets each read as a new bytes object, one more copy of every byte of every request
        # body. One buffer is enough: the loop reads one socket at a time, and the parser is
        # done with the bytes (it copies what it hands on) before buffer_updated returns.
        self.read_buffer = memoryview(bytearray(READ_SIZE))
        self.busy = _answer(503, b"Service Unavailable", f"too many connections: limits.max_connections "
                                                         f"({limits.max_connections}) reached; retry later")
        self.slow_head = _answer(408, b"Request Timeout", "request head not received within "
                                                          f"limits.header_timeout_s ({limits.header_timeout_s:g} s)")
        self.slow_body = _answer(408, b"Request Timeout",
                                 f"request body stalled for limits.body_timeout_s ({limits.body_timeout_s:g} s)")
        self.big_head = _answer(431, b"Request Header Fields Too Large",
                                f"request head over {head_limit} bytes")
        self.bad_request = _answer(400, b"Bad Request", "invalid HTTP/1.1 request")

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self, loop), sock=sock, ssl=self.context,
                                                backlog=2048)

    def refused(self, reason: str) -> None:
        if self._on_refusal is not None:
            self._on_refusal(reason)

    def target(self, method: bytes, url: bytes) -> Target:
        key = (method, url)
        found = self.targets.get(key)
        if found is None:
            parsed = httptools.parse_url(url)
            raw_path = parsed.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            name = method.decode("ascii")
            route = self.direct(name, path) if self.direct is not None else None
            found = (route, name, path, raw_path, parsed.query or b"")
            if len(url) <= _TARGET_URL_MAX:
                if len(self.targets) >= _TARGETS_MAX:
                    self.targets.clear()
                self.targets[key] = found
        return found

    def start_task(self, work: Any) -> None:
        """Runs ``work`` as a task of this listener's (a graceful stop waits for it)."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._check_idle()

    def opened(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.connections.add(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(SWEEP_S, self._sweep_all, loop)

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._check_idle()

    def _check_idle(self) -> None:
        if self._idle is not None and not self.connections and not self.tasks:
            self._idle.set()

    def _sweep_all(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in list(self.connections):
            conn.check(now)
        self._sweep = loop.call_later(SWEEP_S, self._sweep_all, loop) if self.connections else None

    async def stop(self, grace: float) -> None:
        """Stops accepting; idle connections close at once, busy ones after their answer; after
        ``grace`` seconds what is left is cancelled and cut."""
        if self._server is None:
            return
        self._server.close()
        self._idle = asyncio.Event()
        for conn in list(self.connections):
            conn.shutdown()
        self._check_idle()
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except asyncio.TimeoutError:
            log.error("HTTP listener stopped with %d request(s) unfinished after %g s", len(self.tasks), grace)
            for task in list(self.tasks):
                task.cancel()
            for conn in list(self.connections):
                conn.abort()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._server = None


class Connection(asyncio.BufferedProtocol):
    """One client connection: llhttp parses; each request becomes an exchange (direct or ASGI)
    that answers through this connection, in order."""

    def __init__(self, listener: HttpListener, loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
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

    # -- transport events ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # (uvloop's transports are not asyncio.Transport subclasses)
        listener = self.listener
        listener.opened(self, self.loop)
        if len(listener.connections) > listener.limits.max_connections:
            transport.write(listener.busy)
            transport.close()
            listener.refused("max_connections")
            return
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))
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
        self.pipeline.clear()
        self.write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)
        if self.raw is not None:
            self.raw.done()
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
        answered on this connection, then closed (the stream cannot be resynchronised)."""
        exchange = self.exchange
        if not self.transport.is_closing():
            if exchange is None or exchange.response_complete or not exchange.response_started:
                if exchange is not None and not exchange.response_complete:
                    exchange.disconnected = True
                    exchange.set()
                self.transport.write(answer)
            self.transport.close()

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
            declared, binary = self._declared()
            deferrable = route[1] is not None and not self._continue and declared is not None
            if deferrable and binary and declared is not None and WHOLE_MIN < declared <= WHOLE_MAX:
                self.raw_length = declared  # read whole past the parser after this read (go_raw)
                self.raw_whole = True
            elif declared is not None and declared > DEFER_MAX:
                self.raw_length = declared  # read past the parser after this read (go_raw)
            deferred = deferrable and declared is not None and (declared <= DEFER_MAX or self.raw_whole)
        else:
            exchange = AsgiExchange(self, self.listener.app, _scope(self, version, method, path, raw_path, query),
                                    keep_alive, self._continue)
        previous = self.exchange
        self.exchange = exchange
        if previous is None or previous.response_complete:
            if deferred:
                direct.deferred = True  # served once its body is here (on_message_complete)
            else:
                self.listener.start_task(exchange.run())
        else:
            # Pipelined behind an answer still going out: it waits, and so does reading.
            self.pause_reading()
            self.pipeline.appendleft(exchange)
        self._body_at = self.loop.time()

    def _declared(self) -> tuple[int | None, bool]:
        """The body's Content-Length (the parser refused a request with two, or with one
        beside Transfer-Encoding), None when chunked or absent; and whether the body is a
        binary-extension one, not compressed (it may be read whole past the parser)."""
        declared = None
        binary = encoded = False
        for name, value in self.headers:
            if name == b"content-length":
                declared = int(value) if value.isdigit() and len(value) <= 18 else None
            elif name == b"inference-header-content-length":
                binary = True
            elif name == b"content-encoding":
                encoded = True
        return declared, binary and not encoded

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
            self.raw = RawBody(left, plain_socket(self.transport), into)

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

    # -- answers -----------------------------------------------------------------------------
    def response_complete(self) -> None:
        """An exchange wrote the end of its answer: the next request in line starts, or the
        connection is idle."""
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            exchange = self.pipeline.pop()
            self.listener.start_task(exchange.run())
        elif not self._in_head:
            self._idle_since = self.loop.time()


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def _scope(conn: Connection, version: str, method: str, path: str, raw_path: bytes, query: bytes) -> dict[str, Any]:
    """The ASGI HTTP connection scope (asgiref's specification, version 3, spec_version 2.3)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": version,
        "server": conn.server,
        "client": conn.client,
        "scheme": conn.scheme,
        "root_path": "",
        "method": method,
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": conn.headers,
    }
