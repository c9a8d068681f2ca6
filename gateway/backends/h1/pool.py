"""The connection pool of one backend endpoint: at most ``max_connections`` exchanges at once,
kept-alive connections reused, the keep-alive race retried, and exchanges that start without a
coroutine (:meth:`H1ConnectionPool.request_now`)."""
from __future__ import annotations

import asyncio
import ssl as ssl_module
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...rawbody import READ_SIZE
from .answer import H1Response
from .connection import Connection
from .errors import ConnectFailed, ConnectionDropped
from .limits import AnswerLimits
from .slots import Slots

__all__ = ["FRESH_S", "IDLE_S", "H1ConnectionPool", "Pending"]

# A streamed request body reuses a connection only if it was idle for less than this.
FRESH_S = 1.0
# A kept-alive connection idle for longer is closed rather than reused: it must go before the
# backend's own idle timeout would close it under a request (the keep-alive race). The
# shortest common one is uvicorn's 5 s (KServe's and MLServer's servers).
IDLE_S = 4.0


class Pending:
    """An exchange started by :meth:`H1ConnectionPool.request_now`: it stands where a
    future stands in :meth:`Connection.exchange` (the connection calls ``done``,
    ``set_result`` and ``set_exception`` on it), and hands the outcome to ``callback``
    from the connection's own callbacks — no task, no future, no coroutine."""

    __slots__ = ("_callback", "_conn", "_finished", "_pool", "request")

    def __init__(self, pool: H1ConnectionPool, conn: Connection,
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
        if isinstance(exc, ConnectionDropped) and exc.before_response and self.request[-1]:
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


# One read buffer per thread (so per event loop) for every backend connection: a read's bytes
# are parsed — and copied where they are kept — before the loop reads anything else
# (reader.py ``buffer_updated``), so no connection needs one of its own. One per pool cost
# READ_SIZE per endpoint: 150 MB at 300 endpoints, twice that with least_queue's pages.
_LOCAL = threading.local()


def read_buffer() -> memoryview:
    buf: memoryview | None = getattr(_LOCAL, "buf", None)
    if buf is None:
        buf = _LOCAL.buf = memoryview(bytearray(READ_SIZE))
    return buf


class H1ConnectionPool:
    """Keep-alive connections to one endpoint (host, port)."""

    def __init__(self, host: str, port: int, *, connect_timeout: float, max_idle: int = 256,
                 max_connections: int = 512, ssl: ssl_module.SSLContext | None = None,
                 server_name: str | None = None, limits: AnswerLimits | None = None) -> None:
        self.host = host
        self.port = port
        self.limits = limits or AnswerLimits()
        self._ssl = ssl
        self._server_name = server_name
        # At most this many exchanges (= open connections) at once; the rest wait for a
        # free one within their timeout, so a burst of clients cannot open thousands of
        # connections to one backend.
        self.max_connections = max_connections
        self._slots = Slots(max_connections)
        self._host_header = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("latin-1")
        self._connect_timeout = connect_timeout
        self._idle: list[Connection] = []
        self._max_idle = max_idle
        self._starts: dict[tuple[str, str], bytes] = {}
        self._again_tasks: set[asyncio.Task[None]] = set()
        self.closed = False  # closed pools keep no connection: those in use close when done

    @property
    def busy(self) -> int:
        """Exchanges holding a connection slot now (waiting ones not included)."""
        return self._slots.limit - self._slots.free

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(loop, read_buffer(), self.limits), self.host, self.port, ssl=self._ssl,
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
        max_body: int | None = None,
        resend: bool = True,
    ) -> H1Response:
        """One exchange; raises ConnectFailed, ConnectionDropped, BadAnswer or
        asyncio.TimeoutError. An answer with a Content-Length of at least ``stream_min``, or
        (``stream_unsized``) one without a Content-Length, comes back as a :class:`BodyStream`;
        its connection stays taken until the body has arrived. ``max_body``: a lower body limit
        than the pool's for this exchange (health checks). ``resend``: whether a request
        written on a reused connection that the backend closed before answering may go out
        again (the keep-alive race); False for a stateful request (a sequence's), which must
        never run twice."""
        if isinstance(body, list):
            # In place: the caller's list is the one the connection empties once a 2xx answer
            # began (link.py ``_parts``), letting the request's pieces go.
            body[:] = [b if isinstance(b, (bytes, bytearray)) else memoryview(b).cast("B") for b in body]
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
                                                   stream_unsized, max_body)
                    break
                except ConnectionDropped as exc:
                    if not exc.before_response:
                        raise
                    _unless_resendable(exc, body)
                    if fresh or not resend:
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
                    callback: Callable[[H1Response | Exception], None], resend: bool = True) -> bool:
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
        pending = Pending(self, conn, callback, (method, path, body, headers, timeout, stream_min, resend))
        conn.start(pending, head, body, stream_min)
        conn._arm(timeout)
        return True

    def _again(self, callback: Callable[[H1Response | Exception], None], method: str, path: str,
               body: bytes | bytearray | memoryview, headers: Mapping[str, str] | None, timeout: float,
               stream_min: int | None, resend: bool) -> None:
        async def again() -> None:
            try:
                response = await self.request(method, path, body=body, headers=headers, timeout=timeout,
                                              stream_min=stream_min, resend=resend)
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

    def _idle_connection(self, source: bool) -> Connection | None:
        """A kept-alive connection to reuse, or None for a fresh one. A streamed body
        (``source``) goes out on a fresh connection rather than risk the keep-alive race on
        one idle for long: once sent, its chunks cannot be sent again. Connections idle past
        ``IDLE_S`` are closed (the most recently used is taken first, so all the others are
        older), as is one found closed."""
        idle = self._idle
        if not idle:
            return None
        now = idle[-1]._loop.time()  # (not get_running_loop(): a getpid() system call per call in 3.11)
        if now - idle[-1].idle_since > IDLE_S:
            self.close_idle()
            return None
        while idle:
            if source and now - idle[-1].idle_since > FRESH_S:
                return None
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > IDLE_S or conn._transport is None or conn._transport.is_closing():
                conn.close()  # closed by the backend while idle; the loop has not said so yet
                continue
            return conn
        return None

    def _stream_ended(self, conn: Connection) -> None:
        self._release(conn)
        self._slots.give()

    def _settle(self, conn: Connection) -> bool:
        """Back to the pool now, unless a streamed body is still arriving (its end does it
        then): True while the exchange goes on."""
        if conn.streaming:
            return True
        self._release(conn)
        return False

    def _release(self, conn: Connection) -> None:
        if conn.closed or not conn.keep_alive or not conn.sent_all or self.closed:
            conn.close()
        elif len(self._idle) < self._max_idle:
            conn.idle_since = conn._loop.time()  # (not get_running_loop(): a getpid() system call per call in 3.11)
            self._idle.append(conn)
        else:
            conn.close()

    def close_idle(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def close(self) -> None:
        self.closed = True
        self.close_idle()
