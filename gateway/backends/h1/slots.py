"""How many exchanges one endpoint may have at once."""
from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Slots"]


class Slots:
    """The connection slots of one endpoint: at most ``limit`` exchanges at once; the rest
    wait in order within their timeout. (Not an asyncio.Semaphore: :meth:`H1ConnectionPool.
    request_now` must take a slot without awaiting, and a semaphore has no such call.)"""

    __slots__ = ("_waiters", "free", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def take(self, timeout: float) -> None:
        """A slot, waiting at most ``timeout`` seconds (TimeoutError)."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over just as the wait ended: passed on
            else:
                waiter.cancel()
            raise

    def give(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to the longest waiting, still taken
                return
        self.free += 1
