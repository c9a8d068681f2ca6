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
from collections.abc import Callable
from typing import Any

import httptools
import orjson

from ..config.schema import Tls
from ..config.security import Limits
from ..rawbody import READ_SIZE
from .h1asgi import AsgiApp
from .h1conn import Connection
from .h1direct import DirectRoute

__all__ = ["SWEEP_S", "HttpListener", "Router", "server_context"]

log = logging.getLogger("oip_gateway.http")

SWEEP_S = 0.5

# Cached request targets (method, URL) per listener: clients choose URLs, so bounded.
_TARGETS_MAX = 4096
_TARGET_URL_MAX = 1024


def _answer(status: int, reason: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body))) + body


def server_context(tls: Tls, alpn: str = "http/1.1") -> ssl.SSLContext:
    """A listener's TLS context from the files as they are now (certs.py swaps a fresh one in
    for new handshakes when they change); ``alpn``: the one protocol it offers ("h2": gRPC)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls.client_ca)
    context.set_alpn_protocols([alpn])
    return context


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
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its tasks run on
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
            parsed: Any = httptools.parse_url(url)  # (its stubs say bytes where it gives None: no check)
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

    def start_task(self, work: Any) -> asyncio.Task[None]:
        """Runs ``work`` as a task of this listener's (a graceful stop waits for it)."""
        loop = self._loop
        if loop is None:  # (kept: get_running_loop() is a getpid() system call on 3.11)
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

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
