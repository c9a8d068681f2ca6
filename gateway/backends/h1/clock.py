"""The clocks of an exchange on a backend connection: how early a libuv timer may fire, and the
idle bound of a request body streamed out (:class:`IdleClock`)."""
from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CLOCK_SLACK", "IdleClock"]

# libuv timers count whole milliseconds: one that fires this much before its deadline is on time.
CLOCK_SLACK = 0.001


class IdleClock:
    """The idle bound of a streamed request body (``Connection._pump``): one timer for the whole
    body, not one per wait. It fires ``idle_s`` after the last progress (a chunk came, or the
    backend took what was written) and, if there was progress since it was armed, re-arms itself
    for ``idle_s`` after that (a timer armed and cancelled per chunk cost ~5 µs a chunk, hundreds
    of chunks per large body). On a stall it records what was awaited and cancels the pump.

    A class, not a closure: compiled by mypyc, a nested function and its enclosing environment
    refer to each other — a reference cycle per streamed request, left to the cyclic GC
    (at 64 concurrent 1 MiB requests its collections cost ~20 µs per request)."""

    __slots__ = ("_handle", "_loop", "_task", "idle_s", "progress", "stalled", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], idle_s: float) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = task
        self.idle_s = idle_s
        self.progress = loop.time()
        self.waiting = "client"
        self.stalled: str | None = None
        self._handle = loop.call_at(self.progress + idle_s, self._check)

    def _check(self) -> None:
        due = self.progress + self.idle_s
        if self._loop.time() + CLOCK_SLACK < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.stalled = self.waiting
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()
        self._task = None
