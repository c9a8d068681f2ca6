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
"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httptools

__all__ = ["ConnectFailed", "ConnectionDropped", "H1ConnectionPool", "H1Response"]


class ConnectFailed(Exception):
    """No TCP connection could be made (refused, unreachable, connect timeout)."""


class ConnectionDropped(Exception):
    """The connection closed or broke before a complete answer arrived."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


@dataclass(frozen=True, slots=True)
class H1Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_buf",
        "_complete",
        "_fut",
        "_got_bytes",
        "_headers",
        "_loop",
        "_parser",
        "_pos",
        "_transport",
        "closed",
        "keep_alive",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._fut: asyncio.Future[H1Response] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._buf: memoryview | None = None
        self._pos = 0
        self._got_bytes = False
        self._complete = False
        self.keep_alive = True
        self.closed = False

    # -- asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._fut is None:
            # Bytes nobody asked for (a server talking out of turn): this connection is unusable.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionDropped(f"malformed HTTP response: {exc}", before_response=False))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._fut is not None and not self._fut.done():
            self._fail(ConnectionDropped(
                f"connection closed by the backend{': ' + str(exc) if exc else ''}",
                before_response=not self._got_bytes,
            ))

    # -- httptools callbacks --------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > 1 << 20:
            # One buffer of the announced size, filled as chunks arrive: no chunk list
            # beside a joined copy (2x the answer), no second set of fresh pages.
            self._buf = memoryview(bytearray(int(length)))
            self._pos = 0

    def on_body(self, body: bytes) -> None:
        if self._buf is not None:
            end = self._pos + len(body)
            self._buf[self._pos : end] = body
            self._pos = end
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._buf is not None:
            body = self._buf.obj[: self._pos] if self._pos != len(self._buf) else self._buf.obj
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
        if self._transport is not None:
            self._transport.close()

    def _timed_out(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(TimeoutError())

    async def exchange(self, head: bytes, body: bytes | memoryview | None, timeout: float) -> H1Response:
        """Send one request and wait for its answer. A timer (not ``asyncio.wait_for``,
        which costs a task per call in Python 3.11) bounds the whole exchange."""
        assert self._transport is not None
        self._fut = self._loop.create_future()
        timer = self._loop.call_later(timeout, self._timed_out)
        self._headers = {}
        self._body = []
        self._buf = None
        self._got_bytes = False
        self._complete = False
        if isinstance(body, list):
            self._transport.writelines([head, *body])  # each part as it is: no joined copy
        elif body is not None and len(body) <= 65536:
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.write(head)
            if body is not None:
                self._transport.write(body)
        try:
            return await self._fut
        finally:
            timer.cancel()
            self._fut = None
            if not self._complete or not self.keep_alive:
                self.close()


class H1ConnectionPool:
    """Keep-alive connections to one endpoint (host, port)."""

    def __init__(self, host: str, port: int, *, connect_timeout: float, max_idle: int = 256,
                 max_connections: int = 512) -> None:
        self.host = host
        self.port = port
        # At most this many exchanges (= open connections) at once; the rest wait for a
        # free one within their timeout, so a burst of clients cannot open thousands of
        # connections to one backend.
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._host_header = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("latin-1")
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._max_idle = max_idle

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self.host, self.port), self._connect_timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(f"{exc.__class__.__name__}: {exc}") from exc
        return conn

    def _head(self, method: str, path: str, headers: Mapping[str, str] | None, length: int | None) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode("latin-1"), b"Host: " + self._host_header]
        if length is not None:
            lines.append(b"Content-Length: %d" % length)
        if headers:
            for k, v in headers.items():
                lines.append(f"{k}: {v}".encode("latin-1"))
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | memoryview | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
    ) -> H1Response:
        """One exchange; raises ConnectFailed, ConnectionDropped or asyncio.TimeoutError."""
        if isinstance(body, list):
            body = [b if isinstance(b, (bytes, bytearray)) else memoryview(b).cast("B") for b in body]
            length: int | None = sum(len(b) for b in body)
        else:
            length = len(body) if body is not None else None
        head = self._head(method, path, headers, length)
        if self._slots.locked():
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"all {self.max_connections} connections to {self.host}:{self.port} stayed busy") from None
        else:
            await self._slots.acquire()  # free slot: returns at once, no task, no timer
        try:
            return await self._exchange(head, body, timeout)
        finally:
            self._slots.release()

    async def _exchange(self, head: bytes, body: Any, timeout: float) -> H1Response:
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                response = await conn.exchange(head, body, timeout)
            except ConnectionDropped as exc:
                if exc.before_response:
                    continue  # the keep-alive race: retry on another (or a fresh) connection
                raise
            self._release(conn)
            return response
        conn = await self._connect()
        response = await conn.exchange(head, body, timeout)
        self._release(conn)
        return response

    def _release(self, conn: _Connection) -> None:
        if conn.closed or not conn.keep_alive:
            conn.close()
        elif len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
