"""A request the HTTP listener hands to an ASGI application (everything but inference:
metadata, health, control, v1, generate, the metrics page): the ``http`` scope of the ASGI 3
specification (asgiref, spec_version 2.3) over one of the listener's connections.

``receive`` gives the body as it arrives (``http.request`` messages; reading pauses while more
than ``HIGH`` bytes wait), then ``http.disconnect`` once the client is gone or the answer is
complete. ``send`` writes the head (with a ``date`` header: RFC 9110 section 6.6.1) and the
body; an answer without Content-Length is sent chunked, and one that says ``connection: close``
(or follows an HTTP/1.0 request) closes the connection after it.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from typing import Any

from .answers import INTERNAL_ANSWER
from .h1direct import status_line

__all__ = ["HIGH", "AsgiApp", "AsgiExchange", "asgi_address", "asgi_scope"]

log = logging.getLogger("oip_gateway.http")

Message = MutableMapping[str, Any]
AsgiApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]

HIGH = 1 << 20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# An application's header must not split the head (RFC 9110 section 5.5: no CR, LF or NUL in a
# field value; a name is a token).
_BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")

_date: list[Any] = [0, b""]


def _date_header() -> bytes:
    """``date: <IMF-fixdate>\\r\\n``, made once a second."""
    now = int(time.time())
    if _date[0] != now:
        _date[0] = now
        _date[1] = b"date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
    return _date[1]


class AsgiExchange:
    """One request and its answer through an ASGI application."""

    __slots__ = ("_chunked", "_chunks", "_conn", "_continue", "_ended", "_head", "_left", "_queued", "_waiter",
                 "app", "disconnected", "keep_alive", "more_body", "response_complete", "response_started", "scope")

    def __init__(self, conn: Any, app: AsgiApp, scope: dict[str, Any], keep_alive: bool,
                 expect_continue: bool) -> None:
        self._conn = conn
        self.app = app
        self.scope = scope
        self.keep_alive = keep_alive
        self._continue = expect_continue
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self._chunks: list[bytes] = []
        self._queued = 0
        self._ended = False  # the last http.request message went out
        self._waiter: asyncio.Future[None] | None = None
        self._chunked = False
        self._head = scope["method"] == "HEAD"
        self._left = -1  # Content-Length still to send (-1: none declared)

    # -- what the connection calls ----------------------------------------------------------
    def set(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def feed(self, chunk: bytes | memoryview) -> None:
        if self.response_complete:
            return
        self._chunks.append(bytes(chunk))
        self._queued += len(chunk)
        if self._queued > HIGH:
            self._conn.pause_reading()
        self.set()

    def finish(self) -> None:
        self.more_body = False
        self.set()

    async def run(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, (asyncio.CancelledError, SystemExit, KeyboardInterrupt)):
                log.exception("unhandled error serving %s %s", self.scope["method"], self.scope["path"])
            self._fail()
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.response_complete and not self.disconnected:
                log.error("ASGI application returned without completing its answer to %s %s",
                          self.scope["method"], self.scope["path"])
                self._fail()

    def _fail(self) -> None:
        transport = self._conn.transport
        if not self.response_started and not self.disconnected and not transport.is_closing():
            self.response_started = True
            transport.write(status_line(500) + b"content-type: application/json\r\ncontent-length: %d\r\n"
                            b"connection: close\r\n\r\n" % len(INTERNAL_ANSWER) + INTERNAL_ANSWER)
        if not self.response_complete:
            self.keep_alive = False
            transport.close()

    # -- ASGI ------------------------------------------------------------------------------
    async def receive(self) -> Message:
        conn = self._conn
        if self._continue:
            # Expect: 100-continue (RFC 9110 section 10.1.1): the client waits for this before
            # it sends the body; sent once the application asks for the body.
            self._continue = False
            if not conn.transport.is_closing() and not self.response_started:
                conn.transport.write(_CONTINUE)
        while True:
            if self.disconnected or self.response_complete:
                return {"type": "http.disconnect"}
            if self._chunks or (not self.more_body and not self._ended):
                body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks = []
                self._queued = 0
                if not self.more_body:
                    self._ended = True
                conn.resume_reading()
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            conn.resume_reading()
            self._waiter = conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def send(self, message: Message) -> None:
        conn = self._conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(int(message["status"]), message.get("headers") or [])
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
            self._body(message.get("body", b""), bool(message.get("more_body", False)))
        else:
            raise RuntimeError(f"ASGI message {kind!r} after the answer was complete")

    def _start(self, status: int, headers: Any) -> None:
        self.response_started = True
        self._continue = False
        lines = [status_line(status), _date_header()]
        close = False
        for name, value in headers:
            name = bytes(name).lower()
            value = bytes(value)
            if _BAD_NAME.search(name) or _BAD_VALUE.search(value):
                raise RuntimeError(f"invalid answer header {name!r}")
            if name == b"content-length":
                self._left = int(value)
            elif name == b"transfer-encoding":
                continue  # framing is the server's: chunked below when no length is given
            elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                close = True
            lines += (name, b": ", value, b"\r\n")
        if close:
            self.keep_alive = False
        elif not self.keep_alive:
            lines.append(b"connection: close\r\n")
        if self._left < 0 and not self._head and status not in (204, 304) and status >= 200:
            self._chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        self._conn.transport.write(b"".join(lines))

    def _body(self, body: bytes, more: bool) -> None:
        transport = self._conn.transport
        if self._head:
            pass
        elif self._chunked:
            if body:
                transport.writelines([b"%x\r\n" % len(body), body, b"\r\n"])
            if not more:
                transport.write(b"0\r\n\r\n")
        elif body:
            if self._left >= 0:
                if len(body) > self._left:
                    raise RuntimeError("answer body longer than its Content-Length")
                self._left -= len(body)
            transport.write(body)
        if not more:
            if self._left > 0 and not self._head:
                raise RuntimeError("answer body shorter than its Content-Length")
            self.response_complete = True
            self.set()
            if not self.keep_alive:
                transport.close()
            self._conn.response_complete()


def asgi_address(value: Any) -> tuple[str, int] | None:
    """A socket address as an ASGI scope's ``client`` / ``server`` (host, port); None for a
    Unix socket or an unknown peer."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def asgi_scope(version: str, method: str, path: str, raw_path: bytes, query: bytes, *,
               server: tuple[str, int] | None, client: tuple[str, int] | None, scheme: str,
               headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ASGI HTTP connection scope (asgiref's specification, version 3, spec_version 2.3)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": version,
        "server": server,
        "client": client,
        "scheme": scheme,
        "root_path": "",
        "method": method,
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
    }
