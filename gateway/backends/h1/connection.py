"""One kept-alive HTTP/1.1 connection to a backend: its exchanges — a request written out (a
streamed body bounded while idle), its answer awaited or handed to a callback, the one timer
that bounds them. Reading the answers is ``reader``'s (the framing rules are in its docstring),
the connection's state and transport ``link``'s."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .answer import H1Response
from .clock import CLOCK_SLACK, IdleClock
from .errors import ConnectionDropped, SourceStalled
from .link import Waiter
from .reader import AnswerReader

__all__ = ["Connection"]


class Connection(AnswerReader):
    """One kept-alive HTTP/1.1 connection: an asyncio buffered protocol (``reader``) over the
    state of ``link``, and what the pool asks of it (:meth:`exchange`, :meth:`start`)."""

    __slots__ = ()

    def _arm(self, timeout: float) -> None:
        """The exchange must be over ``timeout`` seconds from now.

        One timer per connection, armed lazily rather than a timer per exchange: arming and
        cancelling a libuv timer costs ~2.7 µs, about a tenth of the gateway's Python on a
        small request. The timer is left running when an exchange ends; when it fires it
        compares the time with the deadline of the exchange then under way (if any), and
        re-arms itself for it. A connection in steady use thus sees one timer event per
        ``timeout``; it is re-armed early only when a deadline comes before the armed one."""
        deadline = self._loop.time() + timeout
        self._deadline = deadline
        clock = self._clock
        if clock is None or self._clock_at > deadline:
            if clock is not None:
                clock.cancel()
            self._clock = self._loop.call_at(deadline, self._tick)
            self._clock_at = deadline

    def _tick(self) -> None:
        self._clock = None
        deadline = self._deadline
        if not deadline or self.closed:
            return
        if self._loop.time() + CLOCK_SLACK < deadline:  # an earlier exchange's time: not this one's
            self._clock = self._loop.call_at(deadline, self._tick)
            self._clock_at = deadline
            return
        self._deadline = 0.0
        self._timed_out()

    def _timed_out(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(TimeoutError())
        elif self._stream is not None and not self._complete:
            # The head came in time, the rest of the body did not.
            self._stream._fail(TimeoutError())
            self.close()
            self._end_stream()

    async def _pump(self, head: bytes, source: Any, idle_s: float) -> None:
        """Write a streamed request body as it arrives, pausing while the socket's
        write buffer is full. Stops early if the answer (or a failure) comes first:
        the connection then cannot carry another request.

        The request's ``head`` goes out with the first chunk (one write).

        Each wait — for the client's next chunk, or for the backend to take what was
        written — is bounded by ``idle_s`` (nginx's client_body_timeout, by analogy):
        a stalled client raises SourceStalled, a backend that stopped reading TimeoutError.
        """
        fut = self._fut
        assert isinstance(fut, asyncio.Future) and self._transport is not None
        fut.add_done_callback(self._wake_drain)
        task = asyncio.current_task()
        assert task is not None
        loop = self._loop
        clock = IdleClock(loop, task, idle_s)
        chunks = source.__aiter__()
        try:
            while True:
                clock.waiting = "client"
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    if head and not (self.closed or self._transport.is_closing()):
                        self._transport.write(head)  # (an empty body)
                    return
                clock.progress = loop.time()
                if fut.done() or self.closed or self._transport.is_closing():
                    self.sent_all = False
                    return
                if head:
                    self._transport.writelines([head, chunk])
                    head = b""
                else:
                    self._transport.write(chunk)
                if self.write_paused:
                    clock.waiting = "backend"
                    try:
                        while self.write_paused and not fut.done() and not self.closed:
                            self._drain = loop.create_future()
                            await self._drain
                    finally:
                        self._drain = None
                    clock.progress = loop.time()
        except asyncio.CancelledError:
            stalled = clock.stalled
            if stalled is None:
                raise
            task.uncancel()
            if stalled == "client":
                raise SourceStalled(f"the request body stalled: no bytes from the client for {idle_s}s") from None
            raise TimeoutError(f"the backend took no request body bytes for {idle_s}s") from None
        finally:
            clock.stop()

    def _reset(self, fut: Any, stream_min: int | None, stream_unsized: bool, max_body: int | None) -> None:
        """A new exchange begins: ``fut`` gets its answer (a future, or the pool's ``Pending``)."""
        self._fut = fut
        self._answer = None
        self._refusal = None
        self._headers = {}
        self._body = []
        self._buf = None
        self._whole = None
        self._parts = None
        self._body_len = 0
        self._last_body = b""
        self._max_body = self._limits.max_body_bytes if max_body is None else min(max_body, self._limits.max_body_bytes)
        self._head_fed = 0
        self._header_count = 0
        self._interim = 0
        self._interim_now = False
        self._eof_body = False
        self._chunk_open = False
        self._tail_fed = 0
        self._stream = None
        self._stream_min = stream_min
        self._stream_unsized = stream_unsized
        self._got_bytes = False
        self._in_body = False
        self._complete = False
        self.sent_all = True
        if self._raw is not None:
            self._raw.done()
        self._raw = None
        self._body_got = 0

    def start(self, pending: Waiter, head: bytes, body: bytes | bytearray | memoryview,
              stream_min: int | None, max_body: int | None = None) -> None:
        """The request of a ``Pending`` exchange (pool.py), written at once (its answer reaches
        ``pending`` from this protocol's callbacks)."""
        assert self._transport is not None
        self._reset(pending, stream_min, False, max_body)
        if len(body) <= 65536 and not isinstance(body, memoryview):
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.writelines([head, body])

    async def exchange(self, head: bytes, body: bytes | bytearray | memoryview | None, timeout: float,
                       stream_min: int | None = None,
                       on_end: Callable[[Connection], None] | None = None,
                       stream_unsized: bool = False, max_body: int | None = None) -> H1Response:
        """Send one request and wait for its answer. A timer (not ``asyncio.wait_for``,
        which costs a task per call in Python 3.11) bounds the exchange from the end of
        the request (as Envoy's route timeout) to the end of the answer, a streamed
        answer included; while a streamed request body goes out, each wait is bounded by
        ``timeout`` instead. When the answer is streamed and not yet complete, ``on_end``
        is called once it ends; otherwise the exchange is over on return."""
        assert self._transport is not None
        if self._transport.is_closing():
            # The peer closed this idle connection and the loop has not told us yet
            # (uvloop refuses the write): nothing was sent, so it is the keep-alive race.
            self.closed = True
            raise ConnectionDropped("connection closed by the backend", before_response=True)
        fut: asyncio.Future[H1Response] = self._loop.create_future()
        self._reset(fut, stream_min, stream_unsized, max_body)
        if hasattr(body, "__aiter__"):
            # The pump is a task of its own: each of its waits (the client's next chunk, the
            # backend taking what was written) then resumes only the pump, not the caller's
            # chain of coroutines (front end, proxy, retries, pool), which is resumed once,
            # when the body is sent. Awaiting the task passes a cancellation of the caller on
            # to it.
            pump = self._loop.create_task(self._pump(head, body, timeout))
            try:
                await pump
            except BaseException:
                if not pump.done():
                    pump.cancel()
                self._fut = None
                self.close()
                raise
        elif isinstance(body, list):
            self._transport.writelines([head, *body])  # each part as it is: no joined copy
            self._parts = body
        elif body is not None and len(body) <= 65536:
            self._transport.write(head + body)  # one segment for small requests
        else:
            self._transport.write(head)
            if body is not None:
                self._transport.write(body)
        self._arm(timeout)
        try:
            response = await fut
        except BaseException:
            self._parts = None
            self._broken()
            raise
        self._parts = None
        self._answered(on_end)
        return response

    def _answered(self, on_end: Callable[[Connection], None] | None) -> None:
        """The answer, or the head of a streamed one, has come. A streamed body goes on: the
        deadline keeps bounding it and ``on_end`` is called at its end. Otherwise the exchange
        is over, and the connection closed unless it can carry another."""
        self._fut = None
        if self._stream is not None and not self._complete and not self.closed:
            self._on_end = on_end
            return
        self._deadline = 0.0
        if not self._complete or not self.keep_alive or not self.sent_all:
            self.close()

    def _broken(self) -> None:
        """The exchange failed: the connection cannot carry another."""
        self._fut = None
        self.close()
