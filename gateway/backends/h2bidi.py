"""A bidirectional streaming call of a gRPC client channel (``h2channel.py``; ModelStreamInfer):
one stream, the request messages written as the caller's iterator yields them, the answer's
messages handed over as they come, with flow control both ways (gRPC's doc/PROTOCOL-HTTP2.md).
The unary calls and what every call shares are ``h2stream.py``'s."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..h2 import _h2
from .h2frames import CallError, prefix
from .h2stream import SMALL_BODY, WRITE_MARK, Call, Metadata

if TYPE_CHECKING:
    from .h2channel import Channel
    from .h2conn import ChannelConnection

__all__ = ["StreamCall"]

CANCEL = _h2.CANCEL


class StreamCall(Call):
    """A bidirectional streaming call: an async iterator of the answer's messages (the call
    starts at the first ``__anext__``; the request messages are written as the request iterator
    yields them, then the request ends). The backend's status, when not OK, is raised as
    CallError after the messages that came before it; ``cancel()`` resets the stream."""

    __slots__ = ("channel", "error", "held", "messages", "metadata", "method", "requests", "started", "timeout",
                 "waiter", "writable", "writer")

    def __init__(self, channel: Channel, method: str, requests: AsyncIterator[bytes], timeout: float | None,
                 metadata: Metadata | None) -> None:
        super().__init__(channel.max_message_bytes)
        self.channel = channel
        self.method = method
        self.requests = requests
        self.timeout = timeout
        self.metadata = metadata
        self.messages: deque[bytes] = deque()
        self.held = 0  # DATA bytes not acknowledged while messages wait for the consumer
        self.error: BaseException | None = None
        self.started = False
        self.waiter: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.writer: asyncio.Task[None] | None = None

    def __aiter__(self) -> StreamCall:
        return self

    async def __anext__(self) -> bytes:
        if not self.started:
            await self._start()
        while True:
            if self.messages:
                message = self.messages.popleft()
                if not self.messages and self.held:
                    # The consumer took what waited: the backend may send more (flow control).
                    assert self.conn is not None
                    self.conn.h2.consume(self.sid, self.held)
                    self.held = 0
                    self.conn.schedule_flush()
                return message
            if self.error is not None:
                raise self.error
            if self.done:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter

    def cancel(self) -> bool:
        """Stop the call (a no-op once it ended): RST_STREAM(CANCEL) to the backend."""
        if self.done:
            return False
        if not self.started:
            self.started = self.done = True
            self.error = asyncio.CancelledError()
            return True
        self.close(asyncio.CancelledError(), CANCEL)
        return True

    async def _start(self) -> None:
        self.started = True
        channel = self.channel
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        try:
            conn = channel.usable() or await channel.acquire(loop, deadline)
        except CallError as exc:
            self.done = True
            self.error = exc
            raise
        sid = conn.h2.request(channel.head(self.method, self.timeout, self.metadata), None, end=False)
        self.conn, self.sid = conn, sid
        conn.calls[sid] = self
        conn.schedule_flush()
        if deadline is not None:
            self.timer = loop.call_at(deadline, self.expire)
        self.writer = loop.create_task(self._write(conn, sid))

    async def _write(self, conn: ChannelConnection, sid: int) -> None:
        h2 = conn.h2
        limit = self.limit
        try:
            async for message in self.requests:
                if self.done:
                    return
                n = len(message)
                if n > limit:
                    self.close(CallError("RESOURCE_EXHAUSTED", f"Sent message larger than max ({n} vs. {limit})"),
                               CANCEL)
                    return
                if not h2.send_data(sid, prefix(n) + message if n <= SMALL_BODY else prefix(n)) or \
                        (n > SMALL_BODY and not h2.send_data(sid, message)):
                    return  # the stream is gone: its end is the reader's to report
                conn.schedule_flush()
                if h2.buffered(sid) > WRITE_MARK:
                    self.writable = asyncio.get_running_loop().create_future()
                    await self.writable
                    if self.done:
                        return
            if not self.done:
                h2.send_data(sid, b"", True)
                conn.schedule_flush()
        except _h2.H2Error:
            return  # the connection failed: its loss ends the call
        except Exception as exc:  # the request iterator failed: the call cannot go on
            self.close(exc, CANCEL)

    def on_writable(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def taken(self, n: int) -> None:
        if self.messages:
            self.held += n
        else:
            Call.taken(self, n)

    def deliver(self, messages: list[bytes]) -> None:
        self.messages.extend(messages)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def settle(self, error: BaseException | None) -> None:
        self.error = error
        writer = self.writer
        if writer is not None and not writer.done() and writer is not asyncio.current_task():
            writer.cancel()
        for future in (self.waiter, self.writable):
            if future is not None and not future.done():
                future.set_result(None)
