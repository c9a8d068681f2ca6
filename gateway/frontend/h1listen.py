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

uvicorn has none of these (its ``limit_concurrency`` counts tasks too, and answers in
plain text). The subclass only adds timers around uvicorn's own parser callbacks.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config.security import Limits

__all__ = ["limited_protocol"]

log = logging.getLogger("oip_gateway.http")


def _answer(status: int, reason: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body))) + body


def limited_protocol(limits: Limits, on_refusal: Any = None) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``. ``on_refusal(reason)``
    is called for each connection refused or closed by a limit (metrics)."""
    busy = _answer(503, b"Service Unavailable",
                   f"too many connections: limits.max_connections ({limits.max_connections}) reached; retry later")
    slow_head = _answer(408, b"Request Timeout",
                        f"request head not received within limits.header_timeout_s ({limits.header_timeout_s:g} s)")
    slow_body = _answer(408, b"Request Timeout",
                        f"request body stalled for limits.body_timeout_s ({limits.body_timeout_s:g} s)")

    def count(reason: str) -> None:
        if on_refusal is not None:
            on_refusal(reason)

    class LimitedProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _in_head = False
        _body_at = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(busy)
                transport.close()
                count("max_connections")
                return
            self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _cancel(self) -> None:
            for timer in (self._head_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = None

        def _arm_head(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_expired)

        def _head_expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._in_head:  # a request began and its head is still incomplete: 408
                self.transport.write(slow_head)
            self.transport.close()  # else a connection that never sent a request
            count("header_timeout")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._arm_head()

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_headers_complete()
            if not self.transport.is_closing() and self.cycle is not None and self.cycle.more_body:
                self._arm_body()

        def _arm_body(self, after: float = limits.body_timeout_s) -> None:
            self._body_at = self.loop.time()
            self._body_timer = self.loop.call_later(after, self._body_expired)

        def _body_expired(self) -> None:
            self._body_timer = None
            if self.transport.is_closing():
                return
            if self.flow.read_paused:
                # Reading is paused because the gateway has not taken what came (its
                # backend is slow): the pause is ours, not the client's.
                self._arm_body()
                return
            quiet = self.loop.time() - self._body_at
            if quiet < limits.body_timeout_s:  # bytes came since: wait out the rest
                self._body_timer = self.loop.call_later(limits.body_timeout_s - quiet, self._body_expired)
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self.transport.write(slow_body)
            self.transport.close()
            count("body_timeout")

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._body_at = self.loop.time()  # one clock read per chunk; the timer checks it

        def on_message_complete(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Between requests only the keep-alive timeout (limits.idle_timeout_s) applies;
            # the next request's head is timed from its first byte (on_message_begin).
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    return LimitedProtocol
