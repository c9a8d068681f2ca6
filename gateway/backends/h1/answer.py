"""What an exchange hands back: the answer (:class:`H1Response`), its body whole or, for a large
or unsized one, as a :class:`BodyStream` fed by the connection as it arrives."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from .errors import ConnectionDropped

__all__ = ["BodyStream", "H1Response", "Reading"]


class Reading(Protocol):
    """The connection a stream's bytes come from (connection.Connection), as the stream
    steers it: backpressure and abandoning."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def abandon(self) -> None: ...


class BodyStream:
    """A large answer's body, chunk by chunk as it arrives (``async for``); ``length``
    is its Content-Length, None for a chunked answer (its length is known at its end).

    Backpressure: above ``_HIGH`` queued bytes the connection stops reading
    from the socket (the backend's TCP window closes), below ``_LOW`` it reads
    again, so a slow client never makes the gateway hold the whole answer.
    ``close()`` abandons it (the connection is closed if the body is unfinished).
    Errors surface from the iteration: ConnectionDropped or TimeoutError, passed
    through ``map_error`` (set by the HTTP backend to the gateway's error tree).
    """

    _HIGH: ClassVar[int] = 4 << 20  # (ClassVar: class constants, also when mypyc compiles this module)
    _LOW: ClassVar[int] = 1 << 20

    __slots__ = ("_chunks", "_conn", "_error", "_finished", "_loop", "_paused", "_queued", "_waiter", "length",
                 "map_error")

    def __init__(self, conn: Reading, length: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self.length = length
        self._loop = loop
        self.map_error: Callable[[Exception], Exception] = lambda exc: exc
        self._conn: Reading | None = conn
        # bytes from the parser, or (a body read raw) views of buffers nothing else writes to
        self._chunks: deque[bytes | memoryview] = deque()
        self._queued = 0
        self._finished = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- producer side (the connection) --------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, chunk: bytes | memoryview) -> None:
        self._chunks.append(chunk)
        self._queued += len(chunk)
        if self._queued > self._HIGH and not self._paused and self._conn is not None:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._finished = True
        if self._paused and self._conn is not None:
            # The chunk that crossed the high mark also ended the answer: the connection
            # goes back to its pool and must read again (its next answer would never arrive).
            self._conn.resume_reading()
        self._paused = False
        self._conn = None
        self._wake()

    def _fail(self, exc: Exception) -> None:
        if not self._finished and self._error is None:
            self._error = exc
            self._conn = None
            self._wake()

    # -- consumer side -------------------------------------------------------
    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes | memoryview:
        while not self._chunks:
            if self._error is not None:
                raise self.map_error(self._error)
            if self._finished:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()  # (get_running_loop(): a getpid() on 3.11)
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._queued -= len(chunk)
        self._taken()
        return chunk

    def ready(self) -> list[bytes | memoryview]:
        """Every chunk queued now, taken: the reads of one pass of the loop (a large answer
        comes in a few reads at once), to be sent on in one write."""
        chunks = list(self._chunks)
        self._chunks.clear()
        self._queued = 0
        self._taken()
        return chunks

    def _taken(self) -> None:
        if self._paused and self._queued < self._LOW:
            self._paused = False
            if self._conn is not None:
                self._conn.resume_reading()

    def close(self) -> None:
        """Stop reading: an unfinished body closes its connection (it cannot be reused)."""
        self._chunks.clear()
        self._queued = 0
        conn, self._conn = self._conn, None
        if conn is not None and not self._finished:
            self._error = self._error or ConnectionDropped("answer abandoned", before_response=False)
            conn.abandon()


# Not frozen: made for every answer, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~3 x the cost). Nothing writes to one after it is made.
@dataclass(slots=True)
class H1Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes | bytearray | BodyStream
