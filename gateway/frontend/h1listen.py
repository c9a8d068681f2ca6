"""The HTTP listener's connection protocol: uvicorn's httptools protocol with the hard
limits a front door needs on its connections (config ``limits``).

- ``max_connections``: a connection past it gets a 503 JSON answer and is closed.
- ``header_timeout_s``: a request head must be complete this long after the connection
  opened or the request began (slowloris: a client trickling header bytes); and a new
  connection that sends nothing is closed after it too (uvicorn arms its keep-alive timer
  only after a first answer).
- ``body_timeout_s``: the longest pause while a request body is arriving; past it the
  client gets 408 (if nothing was answered yet) and the connection is closed, which ends
  the request's handling (the app sees the client gone).
- ``idle_timeout_s`` (uvicorn's keep-alive timeout): a connection idle this long after an
  answer is closed.

uvicorn has none of these (its ``limit_concurrency`` counts tasks too, and answers in
plain text). The subclass only notes times in uvicorn's own parser callbacks; one sweep per
listener, twice a second, ends the connections past a deadline.

It also serves the requests a ``direct`` router claims (the inference path) without ASGI:
``direct(method, path)`` returns a handler for a :class:`~.h1direct.DirectExchange`, which
takes the place of uvicorn's request cycle (h1direct.py says why). Everything else is
uvicorn's, unchanged.
"""
from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config.security import Limits
from ..rawbody import HEAD_READ, READ_SIZE, RawBody, new_buffer, plain_socket
from .h1direct import DirectExchange, DirectRoute

__all__ = ["SWEEP_S", "limited_protocol"]

SWEEP_S = 0.5


def _answer(status: int, reason: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body))) + body


Router = Callable[[str, str], DirectRoute | None]


class _Reader(asyncio.BufferedProtocol):
    """What the transport sees of a connection's protocol: reads land in ``buffer`` and go
    to the protocol's data_received as a view of it — or, while the protocol reads a large
    body past its parser (``raw``), into that body's own buffers; everything else is
    passed on. A read while no body is under way (a request head is awaited) takes at most
    HEAD_READ bytes (rawbody.py says why)."""

    __slots__ = ("_buffer", "_head", "_protocol")

    def __init__(self, protocol: Any, buffer: memoryview) -> None:
        self._protocol = protocol
        self._buffer = buffer
        self._head = buffer[:HEAD_READ]  # (the same memory: buffer_updated reads _buffer)

    def get_buffer(self, sizehint: int) -> memoryview:
        protocol = self._protocol
        raw = protocol.raw
        if raw is not None:
            return raw.buffer()
        return self._buffer if protocol._body_at is not None else self._head

    def buffer_updated(self, nbytes: int) -> None:
        protocol = self._protocol
        if protocol.raw is not None:
            protocol.raw_read(nbytes)
            return
        protocol.data_received(self._buffer[:nbytes])
        if protocol.raw_length:
            protocol.go_raw()

    def eof_received(self) -> None:
        self._protocol.eof_received()  # (uvicorn's returns None: the transport closes)

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()

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


def limited_protocol(limits: Limits, on_refusal: Any = None, direct: Router | None = None) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``. ``on_refusal(reason)``
    is called for each connection refused or closed by a limit (metrics). ``direct(method, path)``
    picks the requests served without ASGI (None: all go to the ASGI app)."""
    busy = _answer(503, b"Service Unavailable",
                   f"too many connections: limits.max_connections ({limits.max_connections}) reached; retry later")
    slow_head = _answer(408, b"Request Timeout",
                        f"request head not received within limits.header_timeout_s ({limits.header_timeout_s:g} s)")
    slow_body = _answer(408, b"Request Timeout",
                        f"request body stalled for limits.body_timeout_s ({limits.body_timeout_s:g} s)")

    def count(reason: str) -> None:
        if on_refusal is not None:
            on_refusal(reason)

    # One sweep per listener (its connections), twice a second, instead of a timer per request:
    # arming and cancelling two libuv timers per request cost more than the rest of this
    # module together. A deadline is thus met within half a second.
    sweeping: dict[int, asyncio.TimerHandle] = {}

    def sweep(connections: set[Any], loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in list(connections):
            if isinstance(conn, LimitedProtocol):
                conn.check(now)
        if connections:
            sweeping[id(connections)] = loop.call_later(SWEEP_S, sweep, connections, loop)
        else:
            sweeping.pop(id(connections), None)

    # What each request target (method, URL) means, worked out once: the route the router
    # gives it, and its parts as uvicorn would give them to ASGI (a request line repeats).
    Target = tuple[DirectRoute | None, str, str, bytes, bytes]
    targets: dict[tuple[bytes, bytes], Target] = {}

    def _target(key: tuple[bytes, bytes]) -> Target:
        assert direct is not None
        method = key[0].decode("ascii")
        parsed = httptools.parse_url(key[1])
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)  # as uvicorn decodes it for ASGI
        return direct(method, path), method, path, raw_path, parsed.query or b""

    # The loop reads every connection of this listener into one buffer (_Reader): a plain
    # protocol gets each read as a new bytes object, one more copy of every byte of every
    # request body. One buffer is enough: the loop reads one socket at a time, and the
    # parser is done with the bytes (it copies what it hands on) before buffer_updated returns.
    read_buffer = memoryview(bytearray(READ_SIZE))

    class LimitedProtocol(HttpToolsProtocol):
        # loop.time() when the current request head began (or the connection opened with
        # nothing yet); None once a head is complete. The time of the last body bytes while
        # a body is arriving, else None.
        _head_since: float | None = None
        _body_at: float | None = None
        _in_head = False
        # loop.time() when the last answer completed with nothing after it: keep-alive,
        # closed by the sweep past idle_timeout_s (uvicorn arms a timer per answer instead).
        _idle_since: float | None = None
        # A request served directly with a declared body over DEFER_MAX (streamed through):
        # its length, the body bytes the parser handed over, and once its body is read past
        # the parser (go_raw), the rest of it.
        raw_length = 0
        _body_got = 0
        raw: RawBody | None = None
        # A body read whole past the parser (WHOLE_MIN..WHOLE_MAX): its buffer, the exchange's
        # one chunk once it is full.
        raw_whole = False
        whole_body: memoryview | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # uvloop reads into a buffer only for a protocol that is not an asyncio.Protocol
            # (uvicorn's is one): the transport talks to a _Reader standing in front of it.
            transport.set_protocol(_Reader(self, read_buffer))
            if len(self.connections) > limits.max_connections:
                transport.write(busy)
                transport.close()
                count("max_connections")
                return
            self._head_since = self.loop.time()
            key = id(self.connections)
            if key not in sweeping:
                sweeping[key] = self.loop.call_later(SWEEP_S, sweep, self.connections, self.loop)

        def check(self, now: float) -> None:
            """The sweep's look at this connection: a head or a body past its time ends it."""
            if self.transport.is_closing():
                return
            if self._head_since is not None and now - self._head_since > limits.header_timeout_s:
                if self._in_head:  # a request began and its head is still incomplete: 408
                    self.transport.write(slow_head)
                self.transport.close()  # else a connection that never sent a request
                count("header_timeout")
            elif self._body_at is not None and now - self._body_at > limits.body_timeout_s:
                raw = self.raw
                if self.flow.read_paused or (raw is not None and raw.arrived()):
                    # Reading is paused because the gateway has not taken what came (its
                    # backend is slow): the pause is ours, not the client's. Or the client's
                    # bytes are arriving below the read's low-water mark (rawbody.py): not a pause.
                    self._body_at = now
                    return
                cycle = self.cycle
                if cycle is not None and not cycle.response_started:
                    self.transport.write(slow_body)
                self.transport.close()
                count("body_timeout")
            elif self._idle_since is not None and now - self._idle_since > self.timeout_keep_alive:
                self.transport.close()

        def on_message_begin(self) -> None:
            # uvicorn builds the ASGI scope here; it is built only for requests that go to
            # the ASGI app (on_headers_complete), not for those served directly.
            self.raw_length = self._body_got = 0
            self.raw_whole = False
            self.whole_body = None
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self._in_head = True
            self._idle_since = None
            self._head_since = self.loop.time()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_since = None
            if direct is None or not self._direct():
                headers, url, expect = self.headers, self.url, self.expect_100_continue
                super().on_message_begin()  # the scope, as uvicorn makes it
                self.headers, self.url, self.expect_100_continue = headers, url, expect
                self.scope["headers"] = headers
                super().on_headers_complete()
            if self.cycle is not None and self.cycle.more_body:
                self._body_at = self.loop.time()

        def _direct(self) -> bool:
            """Serve the request without ASGI if the router claims it (see h1direct.py)."""
            assert direct is not None
            parser = self.parser
            if parser.should_upgrade():
                return False
            key = (parser.get_method(), self.url)
            target = targets.get(key)
            if target is None:
                target = _target(key)
                if len(key[1]) <= 1024:  # (bounded in count and size: clients choose URLs)
                    if len(targets) >= 4096:
                        targets.clear()
                    targets[key] = target
            route, method, path, raw_path, query = target
            if route is None:
                return False
            previous = self.cycle
            self.cycle = exchange = DirectExchange(  # type: ignore[assignment]
                self, route, method, path, raw_path, query, self.headers,
                parser.get_http_version() != "1.0" and parser.should_keep_alive(), self.expect_100_continue)
            declared, binary = self._declared()
            deferrable = route[1] is not None and not self.expect_100_continue and declared is not None
            if deferrable and binary and declared is not None and WHOLE_MIN < declared <= WHOLE_MAX:
                self.raw_length = declared  # read whole past the parser after this read (go_raw)
                self.raw_whole = True
            elif declared is not None and declared > DEFER_MAX:
                self.raw_length = declared  # read past the parser after this read (go_raw)
            if previous is None or previous.response_complete:
                if deferrable and declared is not None and (declared <= DEFER_MAX or self.raw_whole):
                    exchange.deferred = True  # served once its body is here (on_message_complete)
                else:
                    self._start_asgi_task(exchange, self.app)  # type: ignore[arg-type]
            else:
                # Pipelined behind an answer still going out: queued, as uvicorn queues its own.
                self.flow.pause_reading()
                self.pipeline.appendleft((exchange, self.app))  # type: ignore[arg-type]
            return True

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

        # -- a large body read past the parser ----------------------------------------
        def go_raw(self) -> None:
            """After a read: if the body of a request served directly and streamed through is
            under way, the rest of it is counted, not parsed — the loop reads it straight into
            buffers of this connection's own, and each read goes to the exchange as one chunk
            (a view nothing writes over again). httptools would hand every chunk over as a
            new bytes object: one copy of every byte of every large request. The parser takes
            every byte of a read (it stops only at an error, which ends the connection), so
            the body's remaining length is known; a new parser takes the next request."""
            cycle = self.cycle
            if not isinstance(cycle, DirectExchange) or not cycle.more_body or self.transport.is_closing():
                return
            left = self.raw_length - self._body_got
            if left > 0:
                into = None
                if self.raw_whole:
                    whole = self.whole_body = new_buffer(self.raw_length)
                    got = self._body_got
                    if got:
                        whole[:got] = cycle.parsed()  # (what came with the head: at most HEAD_READ)
                    into = whole[got:]
                self.raw = RawBody(left, plain_socket(self.transport), into)

        def raw_read(self, nbytes: int) -> None:
            raw = self.raw
            assert raw is not None
            chunk = raw.take(nbytes)
            self._body_at = self.loop.time()
            cycle = self.cycle
            assert isinstance(cycle, DirectExchange)
            whole = self.whole_body
            if whole is None:
                cycle.feed(chunk)  # (a view: the exchange keeps it as it is)
            if not raw.left:
                if whole is not None:
                    self.whole_body = None
                    cycle.feed(whole)  # the body as one chunk
                raw.done()
                self.raw = None
                self.raw_length = 0
                self.parser = httptools.HttpRequestParser(self)  # (the old one stopped mid-body)
                self.on_message_complete()

        def _start_task(self, work: Any) -> None:
            """A task of this connection's server (graceful shutdown waits for it)."""
            task = self.loop.create_task(work)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def on_response_complete(self) -> None:
            # uvicorn's, except that an idle connection is left to the sweep (no timer).
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif not self._in_head:
                self._idle_since = self.loop.time()

        def on_body(self, body: bytes) -> None:
            cycle = self.cycle
            if isinstance(cycle, DirectExchange):
                self._body_got += len(body)
                cycle.feed(body)
            else:
                super().on_body(body)
            self._body_at = self.loop.time()

        def on_message_complete(self) -> None:
            self._body_at = None
            cycle = self.cycle
            if isinstance(cycle, DirectExchange):
                cycle.finish()
                if cycle.deferred and not cycle.disconnected:
                    cycle.serve()
            else:
                super().on_message_complete()

    return LimitedProtocol
