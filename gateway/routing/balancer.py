"""Endpoint choice within a backend. Pure state, no I/O.

The backend hands the balancer the endpoints that may take the request now (live,
not ejected, the model ready: ``routing/readiness.py``); the balancer orders
them, the chosen one first. The caller retries on the next one only when an
attempt failed before any inference could have run.

Round robin rotates through the candidates. A request with an affinity key
(Triton's ``sequence_id``: every request of a stateful sequence must reach the
server holding its state) goes to the candidate that rendezvous hashing picks for
the key: when an endpoint leaves, only its own sequences move.

:class:`LeastRequest` puts the candidate with the fewest requests in flight first
(Envoy's LEAST_REQUEST, without sampling: backends are small), ties in round-robin
order — for backends whose servers answer at different speeds. :class:`LeastQueue` adds
each endpoint's Triton queue for the model (scraped: ``backends/queue.py``) and
samples two (power of two choices).
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["HasLoad", "LeastQueue", "LeastRequest", "RoundRobin", "balancer"]


class HasLoad(Protocol):
    address: object
    # Triton's pending requests per (model, version) / (model, ""), or None (least_queue).
    queue: dict[tuple[str, str], float] | None

    @property
    def inflight(self) -> int: ...


E = TypeVar("E", bound=HasLoad)


class RoundRobin(Generic[E]):
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def order(self, candidates: Sequence[E], affinity: str | None = None,
              model: tuple[str, str] = ("", "")) -> list[E]:
        """``candidates`` in the order to try them, the chosen one first (``model``: the
        request's (model, version), for balancers that look at per-model load)."""
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

    def order(self, candidates: Sequence[E], affinity: str | None = None,
              model: tuple[str, str] = ("", "")) -> list[E]:
        rotated = super().order(candidates, affinity)
        if affinity is not None or len(rotated) <= 1:
            return rotated  # a sequence stays where its state is
        # sorted() is stable: equal loads keep the round-robin order.
        return sorted(rotated, key=lambda e: e.inflight)


class LeastQueue(RoundRobin[E]):
    """Power of two choices on each endpoint's backlog for the model: Triton's own queue
    (``nv_inference_pending_request_count``, scraped: ``backends/queue.py``) or the
    gateway's requests in flight there, whichever is larger (see ``_score``). An endpoint
    whose metrics cannot be read counts its in-flight requests only (least-request). Two
    random candidates, the lower score first (ties: the first drawn), then the rest in round-robin order for retries —
    sampling two, not sorting all, keeps a burst from piling onto one endpoint between
    two scrapes (Mitzenmacher's power of two choices)."""

    __slots__ = ("_random",)

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self._random = random.Random(seed)

    def order(self, candidates: Sequence[E], affinity: str | None = None,
              model: tuple[str, str] = ("", "")) -> list[E]:
        rotated = super().order(candidates, affinity)
        if affinity is not None or len(rotated) <= 1:
            return rotated  # a sequence stays where its state is
        i, j = self._random.sample(range(len(rotated)), 2)
        a, b = rotated[i], rotated[j]
        best = a if _score(a, model) <= _score(b, model) else b
        return [best, *(e for e in rotated if e is not best)]


def _score(e: HasLoad, model: tuple[str, str]) -> float:
    """The endpoint's backlog: Triton's pending count already includes the gateway's own
    requests waiting there, so the two are not added (that would count ours twice and other
    clients' half): the larger of the two — Triton's when others load it, ours (fresher
    than the last scrape) when we are its main client."""
    queue = e.queue
    pending = queue.get(model, 0.0) if queue is not None else 0.0
    return max(float(e.inflight), pending)


def balancer(kind: str) -> RoundRobin:
    """The balancer a backend's ``balance`` names."""
    if kind == "least_queue":
        return LeastQueue()
    return LeastRequest() if kind == "least_request" else RoundRobin()


def _weight(key: str, endpoint: HasLoad) -> int:
    digest = hashlib.blake2b(f"{key}|{endpoint.address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
