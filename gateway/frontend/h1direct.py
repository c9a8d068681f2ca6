"""A request the HTTP listener hands straight to its handler, without ASGI: the inference path.

Why: measured with real Triton behind, a bare Python HTTP/1.1 pass-through costs ~88 µs of
CPU per small request when its handler gets the request from an httptools protocol, and
~124 µs behind uvicorn's ASGI cycle (an asyncio.Event, message dicts, header regexes per
answer, the head and the body as two writes, every body chunk copied twice) —
benchmarks/http_floor.py measures both. The listener (``h1listen.py``) hands every other
request to the ASGI application (``h1asgi.py``); for a request its router claims it makes a
:class:`DirectExchange`, which answers through the connection the same way (in order, with
keep-alive, pipelining and shutdown handled by the connection).

Body: chunks are kept as the parser hands them over (no copy) — or, for a large body read past
the parser (h1conn.py ``go_raw``), as views of buffers nothing writes over again — until the
handler takes them; reading pauses while more than ``_HIGH`` bytes wait. Answer: a head built
once and written with the body in one ``writelines`` (one system call for a small answer).
"""
from __future__ import annotations

import asyncio
import http
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from ..dataplane import ClientDisconnected
from .answers import INTERNAL_ANSWER

__all__ = ["DirectExchange", "DirectRoute", "Handler", "Now", "status_line"]

log = logging.getLogger("oip_gateway.http")

# Bytes of request body waiting for the handler before the connection stops reading.
_HIGH = 1 << 20


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


_STATUS = {code: _status_line(code) for code in range(100, 600)}


def status_line(code: int) -> bytes:
    return _STATUS.get(code) or _status_line(code)


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL = INTERNAL_ANSWER


def _one(chunk: bytes | memoryview) -> bytes:
    # A body read whole by a handler, as bytes: what came through the parser is; a view (a
    # binary body read whole past the parser, handed to a task) is copied once.
    return chunk if type(chunk) is bytes else bytes(chunk)


class DirectExchange:
    """One request and its answer on an HTTP/1.1 connection; see the module text."""

    __slots__ = ("_chunked", "_chunks", "_continue", "_handler", "_head_out", "_now", "_protocol", "_queued", "_waiter",
                 "admitted", "checked", "deferred", "disconnected", "fields", "headers", "keep_alive", "method",
                 "more_body", "path", "plan", "query", "raw_path", "resent", "response_complete",
                 "response_started", "task", "transport")

    def __init__(self, protocol: Any, route: DirectRoute, method: str, path: str, raw_path: bytes, query: bytes,
                 headers: list[tuple[bytes, bytes]], keep_alive: bool, expect_continue: bool) -> None:
        self._protocol = protocol  # the listener's Connection (h1conn.py)
        self.transport: asyncio.Transport = protocol.transport
        self._handler, self._now = route
        # Held by the listener until the whole body is here, then served by ``now`` (or,
        # when that declines, by the handler's task): see serve().
        self.deferred = False
        self.resent = False  # handed back by ``now`` after it sent the request (run_later)
        # The head's checks passed in ``now`` (the handler must not run them again: a rate
        # limit would be charged twice).
        self.admitted = False
        # What the handler's first look found, kept for the task if it serves the request:
        # the head as a lower-cased mapping, the data plane's plan, whether the body passed
        # its checks (each is done once per request).
        self.fields: dict[str, str] | None = None
        self.plan: Any = None
        self.checked = False
        self.task: asyncio.Task[None] | None = None  # the task serving it, if one does
        self.method = method
        self.path = path  # %-decoded, as ASGI gives it to applications
        self.raw_path = raw_path
        self.query = query
        self.headers = headers  # (lower-case name, value) in order
        self.keep_alive = keep_alive
        self._continue = expect_continue
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self._chunks: deque[bytes | memoryview] = deque()
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._chunked = False
        self._head_out = b""  # a started answer's head, written with its first bytes

    # -- what the connection calls ------------------------------------------------------
    def set(self) -> None:
        """Wake the handler if it waits for body bytes (new bytes, the end, or a disconnect)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def feed(self, chunk: bytes | memoryview) -> None:
        # (a memoryview when the listener reads the body past the parser: RawBody)
        if self.response_complete:
            return  # an answer went out before the body was read (an early refusal): dropped
        self._chunks.append(chunk)
        self._queued += len(chunk)
        if self._queued > _HIGH:
            self._protocol.pause_reading()
        self.set()

    def finish(self) -> None:
        self.more_body = False
        self.set()

    def serve(self) -> None:
        """A deferred request whose body has all come: ``now`` serves it without a task if
        it can; else the handler runs as a task, as for any other request."""
        self.deferred = False
        try:
            if self._now is not None and self._now(self):
                return
        except Exception:
            log.exception("unhandled error serving %s %s", self.method, self.path)
            self.fail()
            return
        self.task = self._protocol.listener.start_task(self.run())

    def run_later(self, body: bytes | bytearray | memoryview) -> None:
        """``now`` took the body and then handed the request back (nothing was answered):
        the handler serves it in a task, with the body given back."""
        self.resent = True
        self._chunks.clear()
        self._chunks.append(body)  # type: ignore[arg-type]
        self.task = self._protocol.listener.start_task(self.run())

    def spawn(self, work: Awaitable[None]) -> None:
        """The rest of an answer ``now`` began (a streamed body) as a task of the server's."""
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("unhandled error serving %s %s", self.method, self.path)
                self.fail()

        self._protocol.listener.start_task(run())

    def cancel_if_gone(self) -> None:
        """The connection is gone before the answer began: the handler's task (if one serves
        the request) is cancelled, which cancels its backend call."""
        task = self.task
        if task is not None and not task.done() and not self.response_started:
            task.cancel()

    def fail(self) -> None:
        """Something broke while answering: a 500 if nothing went out yet, else the
        connection is cut (the client sees a truncated answer)."""
        if not self.response_started and not self.disconnected:
            self.respond(500, [(b"content-type", b"application/json")], (_INTERNAL,), close=True)
        elif not self.response_complete:
            self.abort()

    async def run(self) -> None:
        """The handler, as a task of the listener's."""
        try:
            await self._handler(self)
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            if isinstance(exc, asyncio.CancelledError) and self.disconnected:
                return  # the client left: the connection cancelled the handler (cancel_if_gone)
            log.exception("unhandled error serving %s %s", self.method, self.path)
            self.fail()
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            if not self.response_complete and not self.disconnected:
                log.error("handler for %s %s returned without completing its answer", self.method, self.path)
                if not self.response_started:
                    self.respond(500, [(b"content-type", b"application/json")], (_INTERNAL,), close=True)
                else:
                    self.abort()

    # -- request body -------------------------------------------------------------------
    def _taken(self) -> None:
        self._queued = 0
        if not self.transport.is_closing():
            self._protocol.resume_reading()

    async def _wait(self) -> None:
        if self._continue:
            # Expect: 100-continue (RFC 9110 section 10.1.1): the client waits for this
            # before it sends the body; sent only once the handler wants the body.
            self._continue = False
            if not self.transport.is_closing():
                self.transport.write(_CONTINUE)
        # (the connection's loop: get_running_loop() is a getpid() system call on 3.11)
        self._waiter = self._protocol.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def whole(self) -> bytes | memoryview:
        """The body, all of it here (a deferred request), kept until :meth:`taken`: bytes, or
        a view of the buffer a binary body was read into whole (h1sizes.py WHOLE_MAX)."""
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def parsed(self) -> bytes:
        """The body bytes the parser handed over so far, taken out (the listener reads the rest
        whole past the parser, after them)."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._queued = 0
        return data

    def taken(self) -> None:
        """The body went to ``now``'s request: dropped here."""
        self._chunks.clear()
        self._taken()

    async def body(self, limit: int, too_large: Callable[[], Exception]) -> bytes:
        """The whole body; ``too_large()`` is raised once more than ``limit`` bytes came."""
        size = 0
        parts: list[bytes | memoryview] = []
        while True:
            if self._chunks:
                for chunk in self._chunks:
                    size += len(chunk)
                    parts.append(chunk)
                self._chunks.clear()
                self._taken()
                if size > limit:
                    raise too_large()
            if not self.more_body:
                return _one(parts[0]) if len(parts) == 1 else b"".join(parts)
            if self.disconnected:
                raise ClientDisconnected
            await self._wait()

    def chunks(self) -> AsyncIterator[bytes | memoryview]:
        """The body chunk by chunk as it arrives."""
        return BodyChunks(self)

    # -- answer -------------------------------------------------------------------------
    def _head(self, status: int, headers: Sequence[tuple[bytes, bytes]], length: int | None, close: bool) -> bytes:
        lines = [status_line(status)]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        if length is not None:
            lines.append(b"content-length: %d\r\n" % length)
        if close or not self.keep_alive:
            self.keep_alive = False
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def respond(self, status: int, headers: Sequence[tuple[bytes, bytes]],
                parts: Sequence[bytes | bytearray | memoryview], close: bool = False) -> None:
        """A whole answer at once: the head and every part in one write (no joined copy of the
        parts; uvloop sends them with one writev)."""
        if self.disconnected or self.response_started:
            return
        if self.transport.is_closing():
            # Gone (a pipelined request's client: the protocol marks only its current
            # request disconnected); nothing can be written.
            self.disconnected = True
            return
        self.response_started = True
        if self._continue and self.more_body:
            # Refused before the client was told to send its body (Expect: 100-continue): it
            # may send it or not, so the connection cannot be read further (RFC 9110 10.1.1).
            close = True
        length = 0
        for part in parts:
            length += len(part)
        head = self._head(status, headers, length, close)
        if len(parts) == 1 and length <= 16384:
            self.transport.write(head + parts[0])
        else:
            self.transport.writelines([head, *parts])
        self._complete()

    def start(self, status: int, headers: Sequence[tuple[bytes, bytes]], length: int | None) -> None:
        """The head of an answer whose body follows in :meth:`send` calls (chunked when
        ``length`` is None)."""
        self.response_started = True
        self._chunked = length is None
        # Held for the first send: head and body's first bytes in one write.
        self._head_out = self._head(status, [*headers, (b"transfer-encoding", b"chunked")] if length is None
                                    else headers, length, False)

    async def send(self, parts: Sequence[bytes | bytearray | memoryview], more: bool) -> None:
        """Pieces of a started answer, in one write (uvloop: one writev, no joined copy); waits
        while the client is not reading."""
        conn = self._protocol
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        out: list[bytes | bytearray | memoryview] = []
        if self._head_out:
            out.append(self._head_out)
            self._head_out = b""
        if self._chunked:
            for part in parts:
                if part:
                    out += (b"%x\r\n" % len(part), part, b"\r\n")
            if not more:
                out.append(b"0\r\n\r\n")
        else:
            out += parts
        if len(out) == 1:
            self.transport.write(out[0])
        elif out:
            self.transport.writelines(out)
        if not more:
            self._complete()

    def abort(self) -> None:
        """A started answer cannot be finished: the connection is closed (the client sees it cut,
        after the head if that was all there was)."""
        if self._head_out and not self.disconnected:
            self.transport.write(self._head_out)
            self._head_out = b""
        self.transport.close()

    def _complete(self) -> None:
        self.response_complete = True
        self.set()
        if not self.keep_alive:
            self.transport.close()
        self._protocol.response_complete()


Handler = Callable[[DirectExchange], Awaitable[None]]
# Serves a request from callbacks alone if it can (True); False: the Handler serves it.
Now = Callable[[DirectExchange], bool]
DirectRoute = tuple[Handler, Now | None]


class BodyChunks:
    """:meth:`DirectExchange.chunks`: an iterator class, not an async generator, so that mypyc
    compiles it (a generator per body ran interpreted, once per chunk)."""

    __slots__ = ("_ex",)

    def __init__(self, ex: DirectExchange) -> None:
        self._ex = ex

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes | memoryview:
        ex = self._ex
        while True:
            chunks = ex._chunks
            if chunks:
                chunk = chunks.popleft()
                if not chunks:
                    ex._taken()
                return chunk
            if not ex.more_body:
                raise StopAsyncIteration
            if ex.disconnected:
                raise ClientDisconnected
            await ex._wait()
