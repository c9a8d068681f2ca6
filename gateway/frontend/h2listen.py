"""The gRPC listener on the gateway's own HTTP/2 (gateway/h2, libnghttp2): its connections, their
calls, its limits and a graceful stop. Replaces grpc.aio's server where the extension is built
(``gateway.h2.native("server")``); the handlers are the same (frontend/h2calls.py).

Python sees each connection's reads once (``ServerConnection.feed``) and writes once per loop
turn (``flush`` → ``writelines``); frames, HPACK, flow control and the flood limits are C.

Limits (config ``limits``, docs/config.md): ``max_grpc_streams`` is SETTINGS_MAX_CONCURRENT_STREAMS
(RFC 9113 section 6.5.2; nghttp2 refuses the excess with RST_STREAM REFUSED_STREAM),
``max_connections`` closes a connection past it at once, ``idle_timeout_s`` closes (GOAWAY) a
connection with no call for that long, and ``body_timeout_s`` ends a unary call whose request
stops arriving (DEADLINE_EXCEEDED) — a stream that never sends its end holds nothing longer.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import grpc

from ..codec.grpcframe import MessageReader, frame
from ..config.security import Limits
from ..errors import RequestTimeout
from ..h2 import _h2
from .grpcunary import ANSWER_SINK, CALL_METADATA
from .h2calls import RELAY_LOW_WATER, Call, Context, Details, read_head, stream_requests
from .h2infer import InferNow
from .h2upload import Compressed, Upload

__all__ = ["H2Connection", "H2Listener"]

log = logging.getLogger("oip_gateway.grpc")

SWEEP_S = 1.0
FLUSH_MAX = 256 * 1024  # bytes of frames copied out per flush() (see H2Connection.flush)
_DRAIN_PING = 0x6F69702D64726169  # "oip-drai": the PING whose answer ends a drain's first step
_HEAD, _DATA, _TRAILERS, _CLOSE = _h2.HEAD, _h2.DATA, _h2.TRAILERS, _h2.CLOSE
_WRITABLE, _DEAD, _PING_ACK = _h2.WRITABLE, _h2.DEAD, _h2.PING_ACK


class H2Listener:
    """One listening socket serving gRPC: ``handlers`` are grpc generic handlers, asked in order."""

    def __init__(self, handlers: Sequence[grpc.GenericRpcHandler], *, limits: Limits, max_message_bytes: int,
                 max_metadata_bytes: int = 32768, max_header_count: int = 100,
                 context: ssl.SSLContext | None = None, on_refusal: Callable[[str], None] | None = None,
                 streamed: frozenset[str] = frozenset(), now: Mapping[str, InferNow] | None = None) -> None:
        self.handlers = tuple(handlers)
        # Methods served from callbacks when they can be (h2infer.py): a whole, uncompressed request.
        self.now: Mapping[str, InferNow] = now or {}
        self.found: dict[str, grpc.RpcMethodHandler] = {}
        # Methods whose handler takes a dataplane.StreamedMessage for its request (the gateway's
        # ModelInfer): a large one streams in (h2upload.Upload), a compressed one goes on as it came.
        self.streamed = streamed
        self.limits = limits
        self.max_message_bytes = max_message_bytes
        self.context = context
        # What the unary requests of one connection may hold at once (their windows reopen while
        # under it; past it only the oldest call still receiving reads on, so it completes): with
        # HTTP/2's connection window on top, a connection holds at most this, one message and
        # the window — not max_grpc_streams whole messages.
        self.request_budget = max(2 * max_message_bytes, 16 << 20)
        self.h2_limits: dict[str, int] = {
            "max_concurrent_streams": limits.max_grpc_streams,
            "max_header_list_size": max_metadata_bytes,
            "max_header_fields": max(max_header_count, 16),
            # A streaming call carries any number of messages: each one is bounded instead
            # (MessageReader's limit), not the stream.
            "max_stream_data": 0,
            # A relayed answer waits while more than this is queued on its stream (h2calls.py).
            "write_low_water": RELAY_LOW_WATER,
        }
        self.connections: set[H2Connection] = set()
        self._on_refusal = on_refusal
        self._server: asyncio.AbstractServer | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._idle: asyncio.Event | None = None
        self.stopping = False

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: H2Connection(self, loop), sock=sock, ssl=self.context,
                                                backlog=2048)

    def find(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> grpc.RpcMethodHandler | None:
        """The handler of ``method``. The gateway's generic handlers answer by the method alone
        (as grpc's ``method_handlers_generic_handler`` does), so a method found once is found
        again without asking them; a method none serves is asked each time (no entry is kept
        for a name a client made up: the memo holds at most the handlers' methods)."""
        found = self.found.get(method)
        if found is None:
            details = Details(method, metadata)
            for h in self.handlers:
                found = h.service(details)
                if found is not None:
                    self.found[method] = found
                    break
        return found

    def refused(self, reason: str) -> None:
        if self._on_refusal is not None:
            self._on_refusal(reason)

    def opened(self, conn: H2Connection, loop: asyncio.AbstractEventLoop) -> bool:
        if self.stopping or len(self.connections) >= self.limits.max_connections:
            self.refused("max_connections")
            return False
        self.connections.add(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(SWEEP_S, self._sweep_all, loop)
        return True

    def closed(self, conn: H2Connection) -> None:
        self.connections.discard(conn)
        if self._idle is not None and not self.connections:
            self._idle.set()

    def _sweep_all(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in list(self.connections):
            conn.check(now)
        self._sweep = loop.call_later(SWEEP_S, self._sweep_all, loop) if self.connections else None

    async def stop(self, grace: float) -> None:
        """Stops accepting; every connection is sent GOAWAY (calls in flight finish); after
        ``grace`` seconds what is left is cancelled and cut."""
        if self._server is None:
            return
        self.stopping = True
        self._server.close()
        self._idle = asyncio.Event()
        if not self.connections:
            self._idle.set()
        for conn in list(self.connections):
            conn.drain()
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            left = sum(len(c.calls) for c in self.connections)
            log.error("gRPC listener stopped with %d call(s) unfinished after %g s", left, grace)
            for conn in list(self.connections):
                conn.abort()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._server = None


class H2Connection(asyncio.Protocol):
    """One client connection: its nghttp2 session and its calls by stream id."""

    def __init__(self, listener: H2Listener, loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.loop = loop
        self.h2 = _h2.ServerConnection(**listener.h2_limits)
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self.paused = False
        self.pending = False  # a flush is scheduled
        self.draining = False
        self.counted = False  # taken by the listener (not refused for max_connections)
        self.held = 0  # bytes of unary requests given back to the client's window (Call.held)
        self.stalled: list[Call] = []  # unary calls waiting for the budget, oldest first
        self.last_active = loop.time()

    # -- asyncio protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no asyncio.Transport subclass)
        if not self.listener.opened(self, self.loop):
            self.refuse()
            return
        self.counted = True
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() not in (None, "h2"):
            transport.close()  # TLS without h2: not a gRPC client
            return
        self.flush()  # our SETTINGS

    def refuse(self) -> None:
        """Past max_connections: the client reads the end of the stream before a byte (as from
        grpc-core); what it sent meanwhile is read and dropped so the close is no reset."""
        transport = self.transport
        self.transport = None
        assert transport is not None
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(1.0, transport.abort)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.counted:
            return  # refused
        try:
            events = self.h2.feed(data)
        except _h2.H2Error:
            self.flush()
            self.close()
            return
        self.last_active = self.loop.time()
        for event in events:
            self.event(event)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.counted:
            return  # refused: never counted
        calls = list(self.calls.values())
        self.calls.clear()
        for call in calls:
            call.answered = True
            self.stop_call(call)
        self.transport = None
        self.listener.closed(self)

    def pause_writing(self) -> None:
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None:
            self.transport.resume_reading()
        self.flush()

    # -- events ---------------------------------------------------------------------------
    def event(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == _DATA:
            sid = event[1]
            call = self.calls.get(sid)
            if call is None or call.answered:
                self.h2.consume(sid, len(event[2]))  # a call already over: its bytes are dropped
                return
            call.last = self.loop.time()
            error = call.data(event[2], event[3])
            if error is not None:
                self.fail(call, error.code, error.message)
            elif call.upload is not None and call.task is None:
                self.stream(call, call.upload)
            elif event[3]:
                self.ended(call)
        elif kind == _HEAD:
            self.head(event[1], event[2], event[3])
        elif kind == _TRAILERS:
            call = self.calls.get(event[1])
            if call is not None and not call.answered:
                truncated = call.truncated()
                if call.upload is not None:
                    call.upload.ended()
                elif truncated is not None:
                    self.fail(call, truncated.code, truncated.message)
                elif call.requests is not None:
                    call.requests.end()
                else:
                    self.ended(call)
        elif kind == _CLOSE:
            call = self.calls.pop(event[1], None)
            if call is not None:  # reset by the client (or refused): nothing more to answer
                call.answered = True
                self.stop_call(call)
        elif kind == _WRITABLE:
            call = self.calls.get(event[1])
            if call is not None:
                call.woken()
        elif kind == _PING_ACK:
            if event[1] == _DRAIN_PING and self.draining:
                self.h2.goaway(0)
        elif kind == _DEAD:
            log.warning("gRPC connection closed: the client exceeded the %s frame limit", event[1])
            self.listener.refused(f"flood_{event[1]}")

    def head(self, sid: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        path, content_type, encoding, timeout, metadata, refusal = read_head(headers)
        if not content_type.startswith(b"application/grpc"):
            # PROTOCOL-HTTP2.md: "If Content-Type does not begin with "application/grpc", gRPC
            # servers SHOULD respond with HTTP status of 415 (Unsupported Media Type)."
            self.h2.respond(sid, [(b":status", b"415"), (b"content-type", b"text/plain")],
                            b"gRPC requests need content-type application/grpc\n")
            return
        deadline = self.loop.time() + timeout if timeout is not None else None
        context = Context(metadata, deadline, self.loop, path)
        handler = self.listener.find(path, metadata)
        call = Call(self, sid, handler, context, MessageReader(self.listener.max_message_bytes, encoding),
                    self.loop.time())
        call.relayable = path in self.listener.streamed
        self.calls[sid] = call
        if refusal is not None:
            self.fail(call, "INTERNAL", refusal)
            return
        if handler is None:
            self.fail(call, "UNIMPLEMENTED", "Method not found!")
            return
        if deadline is not None:
            call.timer = self.loop.call_at(deadline, call.expired)
        if handler.request_streaming and handler.response_streaming:
            stream_requests(call)
            CALL_METADATA.set(metadata)
            call.task = self.loop.create_task(call.run_stream())
            if end:
                assert call.requests is not None
                call.requests.end()
        elif handler.request_streaming or handler.response_streaming:
            self.fail(call, "UNIMPLEMENTED", "the gateway serves unary and bidirectional streaming calls only")
        elif end:
            self.ended(call)

    def ended(self, call: Call) -> None:
        """A unary call's request is complete: run its handler."""
        if call.requests is not None or call.task is not None:
            return
        truncated = call.truncated()
        if truncated is not None:
            self.fail(call, truncated.code, truncated.message)
            return
        if len(call.messages) != 1:
            self.fail(call, "INTERNAL" if call.messages else "UNIMPLEMENTED",
                      f"a unary call carries one request message; this one carried {len(call.messages)}")
            return
        message = call.messages.pop()
        wire = call.reader.wire
        # (set for a call served from callbacks too: its guard reads the metadata from here)
        CALL_METADATA.set(call.context.invocation_metadata())
        if wire is None and self.listener.now:
            now = self.listener.now.get(call.context.method)
            if now is not None:
                now.serve(call, message)
                return
        ANSWER_SINK.set(call)
        call.task = self.loop.create_task(call.run_unary(
            message if wire is None or not call.relayable else Compressed(message, wire, call.reader.encoding)))

    def stream(self, call: Call, upload: Upload) -> None:
        """A large unary request whose head is here: its handler starts while the rest comes."""
        CALL_METADATA.set(call.context.invocation_metadata())
        ANSWER_SINK.set(call)
        call.task = self.loop.create_task(call.run_unary(upload))

    def fail(self, call: Call, code: str, message: str) -> None:
        """End ``call`` with a status of the gateway's own (the request could not be read)."""
        if call.task is not None:
            call.task.cancel()
        call.finish(grpc.StatusCode[code], message, (), call.started)
        self.done(call)

    def stop_call(self, call: Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.requests is not None:
            call.requests.end(asyncio.CancelledError())
        if call.writable is not None and not call.writable.done():
            call.writable.cancel()

    def may_hold(self, call: Call, n: int) -> bool:
        """Whether ``call`` may take ``n`` more request bytes (and the client its window back):
        under the connection's budget, or the oldest unary call still receiving."""
        if self.held + n > self.listener.request_budget and call is not self.oldest_receiving():
            if call not in self.stalled:
                self.stalled.append(call)
            return False
        self.held += n
        call.held += n
        return True

    def keep(self, call: Call, n: int) -> bool:
        """Whether a streamed request may keep ``n`` more bytes of what went on, to send it again
        (h2upload.Upload): within the connection's budget, never past it."""
        if self.held + n > self.listener.request_budget:
            return False
        self.held += n
        call.held += n
        return True

    def release(self, call: Call, n: int) -> None:
        """``call`` no longer keeps ``n`` bytes it was counted for (keep)."""
        self.held -= n
        call.held -= n

    def oldest_receiving(self) -> Call | None:
        for c in self.calls.values():
            if c.requests is None and not c.answered and (
                    c.task is None or (c.upload is not None and c.upload.receiving_whole)):
                return c
        return None

    def done(self, call: Call) -> None:
        """``call`` is over on our side."""
        if self.calls.get(call.sid) is call:
            del self.calls[call.sid]
            self.held -= call.held
            call.held = 0
            if call.upload is not None:
                call.upload.kept = 0  # (counted in call.held, released just now)
            if call.unconsumed:  # (a stream still open keeps the connection's window otherwise)
                self.h2.consume(call.sid, call.unconsumed)
                call.unconsumed = 0
            if call in self.stalled:
                self.stalled.remove(call)
            if self.stalled:
                for waiting in list(self.stalled):  # the budget freed up: the oldest read on
                    self.stalled.remove(waiting)
                    waiting.taken()
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        # The task's coroutine holds the call: let go of the task so the pair is not a cycle
        # left to the collector (one per call, ~13 objects; measured 7 µs a call at c=16).
        call.task = None
        self.later()

    # -- writing --------------------------------------------------------------------------
    def later(self) -> None:
        if not self.pending:
            self.pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.pending = False
        transport = self.transport
        if transport is None or self.paused:
            return
        # At most FLUSH_MAX a time, until the socket's buffer fills (pause_writing comes inside
        # writelines): what nghttp2 would copy out at once is every window's worth of every
        # stream, held twice (our bytes and the transport's copy) while the socket drains.
        out = self.h2.flush(FLUSH_MAX)
        while out:
            transport.writelines(out)
            out = None if self.paused else self.h2.flush(FLUSH_MAX)
        if self.h2.has_events:
            for event in self.h2.poll():
                self.event(event)
            self.later()
        if not self.h2.want_read and not self.h2.want_write:
            self.close()

    def respond(self, sid: int, headers: Any, body: Any = None, trailers: Any = None) -> None:
        self.h2.respond(sid, headers, body, trailers)
        self.later()

    def send_headers(self, sid: int, headers: Any) -> None:
        self.h2.send_headers(sid, headers)
        self.later()

    def send_data(self, sid: int, data: bytes | memoryview) -> bool:
        if not self.h2.send_data(sid, data):
            return False
        self.later()
        return True

    def send_message(self, sid: int, body: bytes) -> bool:
        if not self.h2.send_data(sid, frame(len(body))):
            return False
        self.h2.send_data(sid, body)
        self.later()
        return True

    def send_trailers(self, sid: int, trailers: Any) -> None:
        self.h2.send_trailers(sid, trailers)
        self.later()

    def consume(self, sid: int, n: int) -> None:
        self.h2.consume(sid, n)
        self.later()

    def buffered(self, sid: int) -> int:
        return self.h2.buffered(sid)

    # -- lifetime -------------------------------------------------------------------------
    def check(self, now: float) -> None:
        """The sweep: an idle connection goes; a unary request that stopped arriving ends."""
        limits = self.listener.limits
        if not self.calls and now - self.last_active > limits.idle_timeout_s:
            self.h2.goaway(0)
            self.flush()
            self.close()
            return
        for call in list(self.calls.values()):
            upload = call.upload
            if upload is not None:
                if upload.stalled() and now - call.last > limits.body_timeout_s:
                    self.listener.refused("body_timeout")
                    upload.fail(RequestTimeout(f"request message stalled for limits.body_timeout_s "
                                               f"({limits.body_timeout_s:g} s)"))
                continue
            if (call.task is None and not call.answered and call.requests is None
                    and now - call.last > limits.body_timeout_s):
                self.listener.refused("body_timeout")
                self.fail(call, "DEADLINE_EXCEEDED",
                          f"request message stalled for limits.body_timeout_s ({limits.body_timeout_s:g} s)")
                self.flush()  # the status goes out before the reset that stops the client sending
                self.h2.reset(call.sid, _h2.NO_ERROR)
                self.later()

    def drain(self) -> None:
        """A graceful GOAWAY in two steps (RFC 9113 section 6.8): first the notice, then, a round
        trip later (our PING answered), the real last stream id; calls in flight finish."""
        self.draining = True
        self.h2.shutdown_notice()
        self.h2.ping(_DRAIN_PING)
        self.flush()
        self.loop.call_later(1.0, self._drain_late)

    def _drain_late(self) -> None:
        if self.transport is not None:
            self.h2.goaway(0)
            self.flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
