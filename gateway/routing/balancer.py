"""Endpoint choice within a pool. Pure state, no I/O.

The pool hands the balancer the endpoints that may take the request now (live,
not ejected, the model ready: ``routing/readiness.py``); the balancer orders
them, the chosen one first. The caller retries on the next one only when an
attempt failed before any inference could have run.

Round robin rotates through the candidates. A request with an affinity key
(Triton's ``sequence_id``: every request of a stateful sequence must reach the
server holding its state) goes to the candidate that rendezvous hashing picks for
the key: when an endpoint leaves, only its own sequences move.

:class:`LeastRequest` puts the candidate with the fewest requests in flight first
(Envoy's LEAST_REQUEST, without sampling: pools are small), ties in round-robin
order — for pools whose servers answer at different speeds.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["HasLoad", "LeastRequest", "RoundRobin", "balancer"]


class HasLoad(Protocol):
    address: object

    @property
    def inflight(self) -> int: ...


E = TypeVar("E", bound=HasLoad)


class RoundRobin(Generic[E]):
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def order(self, candidates: Sequence[E], affinity: str | None = None) -> list[E]:
        """``candidates`` in the order to try them, the chosen one first."""
        n = len(candidates)
        if n <= 1:
            return list(candidates)
        if affinity is not None:
            return sorted(candidates, key=lambda e: _weight(affinity, e), reverse=True)
        start = self._next % n
        self._next = start + 1
        return [*candidates[start:], *candidates[:start]]


class LeastRequest(RoundRobin[E]):
    __slots__ = ()

    def order(self, candidates: Sequence[E], affinity: str | None = None) -> list[E]:
        rotated = super().order(candidates, affinity)
        if affinity is not None or len(rotated) <= 1:
            return rotated  # a sequence stays where its state is
        # sorted() is stable: equal loads keep the round-robin order.
        return sorted(rotated, key=lambda e: e.inflight)


def balancer(kind: str) -> RoundRobin:
    """The balancer a backend's ``balance`` names."""
    return LeastRequest() if kind == "least_request" else RoundRobin()


def _weight(key: str, endpoint: HasLoad) -> int:
    digest = hashlib.blake2b(f"{key}|{endpoint.address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
