"""A gRPC client channel to one backend endpoint on the gateway's own HTTP/2 (``gateway.h2._h2``,
docs/h2-design.md "Backend client"): what ``grpc.aio`` channels did, on the running event loop.

A :class:`Channel` holds up to ``max_connections`` connections to its address, opened lazily:
the first call connects (later calls wait for it), a call that finds every connection at the
server's MAX_CONCURRENT_STREAMS opens another, and past the cap waits for a free stream within
its deadline. A connection that received GOAWAY takes no new call and ends when its calls have;
one that fails to connect makes the next attempt wait 250 ms, doubling to 2 s, and calls fail at
once meanwhile (grpc's TRANSIENT_FAILURE). Each connection is a :class:`~.h2conn.ChannelConnection`
(an asyncio BufferedProtocol feeding a ``ClientConnection`` and writing what it flushes).

Every failure raises :class:`CallError`: a status the backend sent, or — with ``fault`` set — what
went wrong with the exchange, as a :class:`~.grpcfault.Fault` kind the backend maps to the error
of the party at fault (``grpc.py`` ``_mapped``). The rules are gRPC's "gRPC over HTTP2"
(doc/PROTOCOL-HTTP2.md in grpc/grpc); the framing is ``h2frames.py``'s, the calls ``h2stream.py``'s.
"""
from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from .. import __version__
from ..codec.grpc import parts_length
from ..config.schema import BackendTls, HostPort
from ..dataplane import AnswerSink, StreamedMessage
from ..h2 import _h2
from .grpcfault import Fault
from .h2frames import ACCEPT_ENCODING, CallError, fault_error, metadata_headers, prefix, timeout_value
from .h2conn import ChannelConnection
from .h2bidi import StreamCall
from .h2stream import SMALL_BODY, Gathered, Metadata, Relay, Settled, Unary

__all__ = ["CallError", "Channel", "ChannelLimits", "Metadata", "StreamCall"]

NO_ERROR, CANCEL = _h2.NO_ERROR, _h2.CANCEL


@dataclass(frozen=True, slots=True)
class ChannelLimits:
    """How a channel connects and keeps its connections (the grpc channel options they replace,
    ``grpc_endpoint.channel_options``)."""

    connect_timeout_s: float = 5.0
    max_connections: int = 8
    streams_per_connection: int = 1000  # below the server's MAX_CONCURRENT_STREAMS, if lower
    keepalive_s: float = 30.0  # a PING after this long without a read, while calls are open
    keepalive_timeout_s: float = 10.0  # no read this long after it: the connection is dropped
    backoff_s: float = 0.25  # after a failed connect; doubles per failure up to max_backoff_s
    max_backoff_s: float = 2.0


def _ssl_context(tls: BackendTls) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=tls.ca)
    if tls.cert is not None:
        ctx.load_cert_chain(tls.cert, tls.key)
    ctx.set_alpn_protocols(["h2"])  # PROTOCOL-HTTP2.md: gRPC over TLS negotiates h2 by ALPN
    return ctx


# -- the channel -------------------------------------------------------------------------------
class Channel:
    """gRPC calls to one endpoint: ``Channel(address, tls, max_message_bytes)``; answers over
    ``max_message_bytes`` fail (TOO_LARGE) before a byte of them is kept."""

    def __init__(self, address: HostPort, tls: BackendTls | None, max_message_bytes: int,
                 limits: ChannelLimits | None = None) -> None:
        self.address = address
        self.max_message_bytes = max_message_bytes
        self.limits = limits or ChannelLimits()
        self.tls = None if tls is None else _ssl_context(tls)
        self.server_name = None if tls is None else (tls.server_name or address.host)
        authority = str(address) if tls is None or tls.server_name is None else f"{tls.server_name}:{address.port}"
        self.fixed = ((b":method", b"POST"), (b":scheme", b"http" if tls is None else b"https"),
                      (b":authority", authority.encode("idna")))
        self.heads: dict[str, tuple[tuple[bytes, bytes], ...]] = {}
        self.conns: list[ChannelConnection] = []  # those that take new calls
        self.draining: set[ChannelConnection] = set()  # those that received GOAWAY, until they end
        self.connecting: asyncio.Task[None] | None = None
        self.waiters: deque[asyncio.Future[CallError | None]] = deque()
        self.failures = 0  # connect attempts failed in a row
        self.retry_at = 0.0
        self.last_error = ""
        self.closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timeout_for = -1.0  # the last call's timeout and its grpc-timeout field
        self.timeout_field = (b"grpc-timeout", b"")

    # -- calls --
    def head(self, method: str, timeout: float | None, metadata: Metadata | None) -> list[tuple[bytes, bytes]]:
        fixed = self.heads.get(method)
        if fixed is None:
            fixed = self.fixed + ((b":path", method.encode("ascii")), (b"content-type", b"application/grpc"),
                                  (b"te", b"trailers"), (b"user-agent", b"oip-gateway/" + __version__.encode()),
                                  (b"grpc-accept-encoding", ACCEPT_ENCODING))
            self.heads[method] = fixed
        head = list(fixed)
        if timeout is not None:
            if timeout != self.timeout_for:
                # (round() to 6 digits goes through float-to-text and back: ~3 µs a call, where
                # a call without a client deadline always has the backend's timeout_s)
                self.timeout_for = timeout
                self.timeout_field = (b"grpc-timeout", timeout_value(timeout))
            head.append(self.timeout_field)
        if metadata:
            head += metadata_headers(metadata)
        return head

    async def unary(self, method: str,
                    request: bytes | bytearray | memoryview | list[bytes | memoryview] | StreamedMessage,
                    timeout: float | None = None, metadata: Metadata | None = None,
                    sink: AnswerSink | None = None, gather: int = 0) -> bytes | memoryview:
        """One unary call: ``request`` is the request message (sent without a copy), the result
        the answer's message — or, with a ``sink``, a large answer streamed there and b"" (h2stream
        ``Relay``), and a StreamedMessage request sent on as it arrives. ``gather``: an answer of at
        least that many bytes (0: none) is gathered into one buffer as it arrives and comes as a
        memoryview of it (h2stream ``Gathered``, for an answer read whole to be converted; a
        request in pieces is then emptied at the answer's first DATA: never sent again); else
        the answer is bytes. Raises CallError (or a streamed request's own error); CancelledError
        resets the stream (CANCEL)."""
        parts: list[bytes | memoryview] | None = None
        if isinstance(request, list):  # a message in pieces (grpc.encode_request_parts): each sent as it is
            parts = request
            n = parts_length(parts)
        else:
            n = len(request) if not isinstance(request, memoryview) else request.nbytes
        if n > self.max_message_bytes:
            raise CallError("RESOURCE_EXHAUSTED", f"Sent message larger than max ({n} vs. {self.max_message_bytes})",
                            never_sent=True)
        streamed: StreamedMessage | None = None
        body: bytes | bytearray | memoryview = b""
        if isinstance(request, (bytes, bytearray, memoryview)):
            body = request
        elif isinstance(request, list):
            pass
        elif sink is None:
            body = await request.read()
        else:
            streamed = request
        loop = self.loop or self.bind()
        began = loop.time()
        deadline = None if timeout is None else began + timeout
        retry = True
        while True:
            conn = self.usable() or await self.acquire(loop, deadline)
            call: Unary
            future: asyncio.Future[bytes | memoryview] = loop.create_future()
            if sink is not None:
                call = Relay(self.max_message_bytes, future, sink)
            elif gather:
                call = Gathered(self.max_message_bytes, future, gather, parts)
            else:
                call = Unary(self.max_message_bytes, future)
            # (the loop's clock stands still within one pass of the loop: a call sent in the pass
            # it was made in has all of ``timeout`` left, and the same float keeps head()'s cache)
            now = loop.time()
            head = self.head(method, None if deadline is None else timeout if now == began else deadline - now,
                             metadata)
            h2 = conn.h2
            if streamed is not None and streamed.encoding:
                head.append((b"grpc-encoding", streamed.encoding))  # (relayed compressed, as it came)
            if streamed is None and parts is None:
                self.send_whole(conn, call, head, body, n)
            else:
                if streamed is not None:
                    sid = h2.request(head, None, end=False)  # (its bytes, length prefix first, come from attach)
                else:
                    assert parts is not None
                    sid = h2.request(head, prefix(n), end=False)
                    last = len(parts) - 1
                    for i, part in enumerate(parts):
                        h2.send_data(sid, part, i == last)
                call.conn, call.sid = conn, sid
                conn.calls[sid] = call
                conn.schedule_flush()
            if streamed is not None:
                assert isinstance(call, Relay)
                call.upload = streamed
                try:
                    if not streamed.attach(call):
                        # (GrpcBackend._call makes a refusal of a request past its resendable part final.)
                        raise RuntimeError("a streamed request past what is kept of it was to be sent again")
                except BaseException:
                    call.close(None, CANCEL)  # the client's message broke a rule before it went on
                    raise
            if deadline is not None:
                call.timer = loop.call_at(deadline, call.expire)
            try:
                return await future
            except asyncio.CancelledError:
                call.close(None, CANCEL)
                raise
            except CallError as exc:
                # RST_STREAM(REFUSED_STREAM): the server did not process the stream (RFC 9113
                # section 8.7), so it is sent again, as gRPC's transparent retry does. A server
                # counts a stream against its MAX_CONCURRENT_STREAMS until it has released the
                # call, a while after the client saw it end: a client that reuses the slot at once
                # meets this refusal (grpc-core's servers do it).
                if not retry or exc.fault is None or exc.fault[0] != Fault.REFUSED_STREAM or \
                        (streamed is not None and not streamed.resendable) or (parts is not None and not parts):
                    raise  # (empty parts: an answer had begun, Gathered let the request go)
                retry = False
                if conn.calls:
                    # Other calls are in flight there: sent once one of them ends, by when the server
                    # has likely released the streams it still counted (a loaded one refuses an
                    # immediate retry too). With none in flight, at once.
                    error = await self.wait(loop, deadline)
                    if error is not None:
                        raise error from None

    def unary_now(self, method: str, request: bytes, timeout: float | None, metadata: Metadata | None,
                  sink: AnswerSink | None, then: Callable[[bytes | memoryview | BaseException], None]) -> Unary | None:
        """:meth:`unary` of a whole request from callbacks, when a connection has a stream free
        now: the call's end — its answer, its CallError, or CancelledError after the call's own
        ``cancel()`` — goes to ``then`` from the connection's events (never before this returns).
        None: nothing was sent (no stream free now, the message over the limit, the channel
        closed): :meth:`unary` serves it, waiting or refusing as it does."""
        n = len(request)
        if n > self.max_message_bytes or self.closed:
            return None
        conn = self.usable()
        if conn is None:
            return None
        loop = self.loop or self.bind()
        settled = Settled(then)
        call = Unary(self.max_message_bytes, settled) if sink is None else Relay(self.max_message_bytes, settled, sink)
        self.send_whole(conn, call, self.head(method, timeout, metadata), request, n)
        if timeout is not None:
            call.timer = loop.call_at(loop.time() + timeout, call.expire)
        return call

    def send_whole(self, conn: ChannelConnection, call: Unary, head: list[tuple[bytes, bytes]],
                   body: bytes | bytearray | memoryview, n: int) -> None:
        """``call`` opened on ``conn`` with its whole message (a small one joined to its prefix)."""
        h2 = conn.h2
        if n <= SMALL_BODY:
            sid = h2.request(head, prefix(n) + body)
        else:
            sid = h2.request(head, prefix(n), end=False)
            h2.send_data(sid, body, True)
        call.conn, call.sid = conn, sid
        calls = conn.calls
        calls[sid] = call
        if len(calls) > 1:
            conn.schedule_batch()
        else:
            conn.schedule_flush()

    def stream(self, method: str, requests: AsyncIterator[bytes], timeout: float | None = None,
               metadata: Metadata | None = None) -> StreamCall:
        """A bidirectional streaming call (see StreamCall); ``timeout`` bounds all of it."""
        return StreamCall(self, method, requests, timeout, metadata)

    # -- connections --
    def bind(self) -> asyncio.AbstractEventLoop:
        self.loop = asyncio.get_running_loop()
        return self.loop

    def usable(self) -> ChannelConnection | None:
        """A connection with a free stream, if any."""
        for conn in self.conns:
            if conn.h2.can_request():
                return conn
        return None

    async def acquire(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> ChannelConnection:
        """A connection with a free stream: once one connects, or a stream frees up."""
        while True:
            if self.closed:
                raise fault_error(Fault.TRANSPORT, "the channel to the endpoint is closed", True)
            conn = self.usable()
            if conn is not None:
                return conn
            if self.connecting is None and len(self.conns) < self.limits.max_connections:
                if loop.time() >= self.retry_at:
                    self.connecting = loop.create_task(self.connect(loop))
                elif not self.conns:
                    raise fault_error(Fault.TRANSPORT, self.last_error, True)  # grpc's TRANSIENT_FAILURE: at once
            error = await self.wait(loop, deadline)
            if error is not None:
                raise error

    async def wait(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> CallError | None:
        """Until a call's stream ends or a connection comes or goes (``wake``): the error that
        ended the channel's connections, else None. Past ``deadline``: raises TIMEOUT."""
        waiter: asyncio.Future[CallError | None] = loop.create_future()
        self.waiters.append(waiter)
        try:
            if deadline is None:
                return await waiter
            async with asyncio.timeout_at(deadline):
                return await waiter
        except TimeoutError:
            raise fault_error(Fault.TIMEOUT, "did not answer in time", True) from None
        finally:
            if not waiter.done():
                self.waiters.remove(waiter)

    def wake(self, error: CallError | None, n: int = 0) -> None:
        """Wake ``n`` waiters (0: all) with ``error``, or to look for a connection again."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(error)
                n -= 1
                if n == 0:
                    return

    async def connect(self, loop: asyncio.AbstractEventLoop) -> None:
        limits = self.limits
        conn: ChannelConnection | None = None
        try:
            try:
                async with asyncio.timeout(limits.connect_timeout_s):
                    transport, conn = await loop.create_connection(
                        lambda: ChannelConnection(self, loop), self.address.host, self.address.port, ssl=self.tls,
                        server_hostname=self.server_name)
                    if self.tls is not None:
                        tls = transport.get_extra_info("ssl_object")
                        if tls is None or tls.selected_alpn_protocol() != "h2":
                            raise ConnectionError("TLS without HTTP/2: the server did not select ALPN h2")
                    why = await conn.ready
                    if why is not None:
                        raise ConnectionError(why)
            except TimeoutError:
                raise ConnectionError(f"timed out after {limits.connect_timeout_s:g} s") from None
        except (OSError, ssl.SSLError) as exc:  # (ConnectionError is an OSError)
            if conn is not None and conn.transport is not None:
                conn.transport.abort()
            self.failures += 1
            self.retry_at = loop.time() + min(limits.backoff_s * 2 ** (self.failures - 1), limits.max_backoff_s)
            self.last_error = f"failed to connect ({getattr(exc, 'strerror', None) or exc})"
            self.connecting = None
            self.wake(None if self.conns else fault_error(Fault.TRANSPORT, self.last_error, True))
            return
        except asyncio.CancelledError:
            if conn is not None and conn.transport is not None:
                conn.transport.abort()
            raise
        finally:
            self.connecting = None
        self.failures = 0
        if self.closed:
            conn.fail(Fault.TRANSPORT, "the channel to the endpoint is closed")
            return
        self.conns.append(conn)
        self.wake(None)

    def retire(self, conn: ChannelConnection) -> None:
        """``conn`` takes no new call (GOAWAY): its calls finish, then it ends."""
        if conn in self.conns:
            self.conns.remove(conn)
            self.draining.add(conn)
        if self.waiters:
            self.wake(None)

    def lost(self, conn: ChannelConnection) -> None:
        if conn in self.conns:
            self.conns.remove(conn)
        self.draining.discard(conn)
        if self.waiters:
            self.wake(None)

    async def close(self, grace: float = 0.0) -> None:
        """GOAWAY on every connection; those whose calls have not ended within ``grace`` seconds
        are closed under them (their calls fail). New calls fail at once from now on."""
        self.closed = True
        if self.connecting is not None:
            self.connecting.cancel()
        self.wake(fault_error(Fault.TRANSPORT, "the channel to the endpoint is closed", True))
        conns = [*self.conns, *self.draining]
        for conn in conns:
            if not conn.lost:
                try:
                    conn.h2.goaway(NO_ERROR)
                except _h2.H2Error:
                    continue  # (a connection already failed: it is closing)
                conn.flush()
        pending = [conn.gone for conn in conns if not conn.gone.done()]
        if pending and grace > 0:
            await asyncio.wait(pending, timeout=grace)
        for conn in conns:
            if not conn.lost:
                conn.fail(Fault.RESET, "was closed by the gateway (the endpoint left the backend) with the call "
                                       "in flight")
