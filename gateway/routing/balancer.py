"""Endpoint choice within a pool. Pure state, no I/O.

Round robin over the endpoints currently believed healthy; when none is,
round robin over all of them (a pool never refuses to try — the health state
may be stale, and the upstream call reports the real failure).

A request with an affinity key (Triton's ``sequence_id``: every request of a
stateful sequence must reach the server holding its state) goes to the
endpoint that rendezvous hashing picks for the key. When that endpoint is
unhealthy only its own sequences move; the others keep their endpoint.

:class:`LeastRequest` puts the healthy endpoint with the fewest requests in
flight first (Envoy's LEAST_REQUEST, without sampling: pools are small), ties
in round-robin order — for pools whose servers answer at different speeds.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["HasHealth", "LeastRequest", "RoundRobin", "balancer"]


class HasHealth(Protocol):
    healthy: bool
    address: object

    @property
    def inflight(self) -> int: ...


E = TypeVar("E", bound=HasHealth)


class RoundRobin(Generic[E]):
    __slots__ = ("_endpoints", "_next")

    def __init__(self, endpoints: Sequence[E]) -> None:
        if not endpoints:
            raise ValueError("a pool needs at least one endpoint")
        self._endpoints = tuple(endpoints)
        self._next = 0

    def order(self, affinity: str | None = None) -> list[E]:
        """All endpoints, the chosen one first, healthy ones before unhealthy ones.

        The caller tries them in this order when an attempt fails to connect.
        """
        if affinity is not None and len(self._endpoints) > 1:
            ranked = sorted(self._endpoints, key=lambda e: _weight(affinity, e), reverse=True)
            return [e for e in ranked if e.healthy] + [e for e in ranked if not e.healthy]
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


class LeastRequest(RoundRobin[E]):
    __slots__ = ()

    def order(self, affinity: str | None = None) -> list[E]:
        rotated = super().order(affinity)
        if affinity is not None or len(rotated) == 1:
            return rotated  # a sequence stays where its state is
        # sorted() is stable: equal loads keep the round-robin order.
        return sorted(rotated, key=lambda e: (not e.healthy, e.inflight))


def balancer(kind: str, endpoints: Sequence[E]) -> RoundRobin[E]:
    """The balancer a backend's ``balance`` names."""
    return LeastRequest(endpoints) if kind == "least_request" else RoundRobin(endpoints)


def _weight(key: str, endpoint: HasHealth) -> int:
    digest = hashlib.blake2b(f"{key}|{endpoint.address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
