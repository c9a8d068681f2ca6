"""Many coroutines gathered without holding the event loop: ``gather_in_slices`` starts them a
slice per turn of the loop. The health checker's rounds use it for every endpoint's checks
(``health.py``) and for per-model ready calls by the thousand (``modelchecks.py``)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["SLICE", "gather_in_slices"]

T = TypeVar("T")

# Tasks started per turn of the event loop (``gather_in_slices``).
SLICE = 32


async def gather_in_slices(coros: Iterable[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` of ``coros``, started ``SLICE`` a turn of the loop: starting 300
    endpoints' checks at once held the loop ~2.6 ms (creating the tasks, then their first steps
    in one turn; uvloop), a few thousand per-model calls proportionally longer. Order kept."""
    tasks: list[asyncio.Future[T]] = []
    try:
        for coro in coros:
            if tasks and not len(tasks) % SLICE:
                await asyncio.sleep(0)
            tasks.append(asyncio.ensure_future(coro))
    except BaseException:  # (cancelled between slices: those started are not left running)
        for task in tasks:
            task.cancel()
        raise
    return await asyncio.gather(*tasks)
