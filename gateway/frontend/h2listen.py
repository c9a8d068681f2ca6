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
from typing import Any

import grpc

from ..config.security import Limits
from .h2calls import RELAY_LOW_WATER
from .h2head import Details
from .h2infer import InferNow
from .h2session import H2Connection

__all__ = ["H2Listener"]

log = logging.getLogger("oip_gateway.grpc")

SWEEP_S = 1.0


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
