"""Token buckets for rate limits (per credential, per model), bounded in number.

Per process: with N workers a client may get N times the configured rate
(docs/config.md says so). No I/O, no asyncio; time is passed in.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable

from ..config.security import Rate

__all__ = ["Buckets", "TokenBucket"]


class TokenBucket:
    """``rate.burst`` tokens at most, refilled at ``rate.per_s`` per second; a request takes one."""

    __slots__ = ("_at", "_tokens", "rate")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate.burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.rate.burst), self._tokens + (now - self._at) * self.rate.per_s)
            self._at = now

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0.0: one is there now)."""
        self._refill(now)
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate.per_s

    def take(self) -> None:
        self._tokens -= 1.0


def retry_after(wait: float) -> int:
    """Retry-After is whole seconds (RFC 9110 section 10.2.3): rounded up, at least 1."""
    return max(1, math.ceil(wait))


class Buckets:
    """Buckets by key, at most ``limit`` of them: keys a client chooses (a token's subject, a
    model name under a glob route) cannot grow memory without bound. The least recently used
    bucket goes first — a full bucket is what a new one would be, so evicting idle ones
    forgets nothing that matters."""

    __slots__ = ("_items", "_limit")

    def __init__(self, limit: int = 10000) -> None:
        self._items: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self._limit = limit

    def get(self, key: Hashable, rate: Rate, now: float) -> TokenBucket:
        bucket = self._items.get(key)
        if bucket is None or bucket.rate != rate:
            bucket = TokenBucket(rate, now)
            self._items[key] = bucket
            if len(self._items) > self._limit:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return bucket

    def __len__(self) -> int:
        return len(self._items)
