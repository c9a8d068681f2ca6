"""Endpoint choice within a pool. Pure state, no I/O.

Round robin over the endpoints currently believed healthy; when none is,
round robin over all of them (a pool never refuses to try — the health state
may be stale, and the upstream call reports the real failure).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["HasHealth", "RoundRobin"]


class HasHealth(Protocol):
    healthy: bool


E = TypeVar("E", bound=HasHealth)


class RoundRobin(Generic[E]):
    __slots__ = ("_endpoints", "_next")

    def __init__(self, endpoints: Sequence[E]) -> None:
        if not endpoints:
            raise ValueError("a pool needs at least one endpoint")
        self._endpoints = tuple(endpoints)
        self._next = 0

    def order(self) -> list[E]:
        """All endpoints, the chosen one first, healthy ones before unhealthy ones.

        The caller tries them in this order when an attempt fails to connect.
        """
        n = len(self._endpoints)
        start = self._next
        self._next = (start + 1) % n
        rotated = self._endpoints[start:] + self._endpoints[:start]
        if n == 1:
            return list(rotated)
        healthy = [e for e in rotated if e.healthy]
        if len(healthy) == n:
            return list(rotated)
        return healthy + [e for e in rotated if not e.healthy]
