"""Per-model ready checks of endpoints without a repository index: which models to ask each
round, and what an answer means for the rounds after.

Without an index (OVMS; Triton with a restricted repository API and no ``check_headers``) an
endpoint is asked model by model, for its backend's exact routes. Their cost is bounded for large
route tables: a model not ready is re-checked with exponential backoff (every round at first, then
every 2, 4, … up to ``max_backoff_rounds``), and a rolling window of ``recheck_per_round`` ready
ones is re-checked (to notice a model being unloaded). With 10,000 routes that is hundreds of
calls per round, not 10,000 — the benchmark measured 10,000 never-ready routes doubling gRPC CPU
per request when each was probed every round. All of a backend's endpoints together make at most
``fallback_per_round`` such calls a round (never-asked models first); the rest are asked in the
rounds after.

The calls go through the health checker's ``ask`` (its concurrency bound, its deadline, its late
calls), and the round count is the checker's: :class:`ModelChecks` holds only the schedules and
the per-round budget, so the checker (``health.py``) keeps one place for calls and rounds.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Container, Sequence
from typing import Any

from .base import Backend
from .endpoints import Endpoint
from .fanout import gather_in_slices

__all__ = ["Ask", "ModelChecks"]

# The health checker's check call: ``ask(ep, call, apply)`` runs ``call(transport timeout)`` within
# its bounds and ``apply`` on the answer. True: it ended in time (applied); False: it is late, and
# ``apply`` runs when it ends.
Ask = Callable[[Endpoint, Callable[[float], Awaitable[bool | None]], Callable[[bool | None], None]], Awaitable[bool]]


class _Schedule:
    """Per-model checks of one endpoint without an index: when each is due next."""

    __slots__ = ("backoff", "cursor", "due")

    def __init__(self) -> None:
        self.backoff: dict[tuple[str, str], int] = {}
        self.due: dict[tuple[str, str], int] = {}
        self.cursor = 0


class ModelChecks:
    """The per-model checks of every endpoint without an index (schedules by ``id(endpoint)``),
    within each backend's budget of calls for the round."""

    def __init__(self, ask: Ask, rounds: Callable[[], int], *, recheck_per_round: int,
                 fallback_per_round: int, max_backoff_rounds: int) -> None:
        self._ask = ask
        # The checker's rounds so far: read when a check is planned and when its answer comes
        # (a late answer schedules from the round it arrives in).
        self._rounds = rounds
        self._recheck = recheck_per_round
        # Per-model calls (endpoints without an index) per backend and round, all endpoints
        # together: 300 endpoints × 10,000 routes whose index failed at once would otherwise be
        # 3,000,000 calls in one round.
        self._fallback_budget = fallback_per_round
        self._fallback_left: dict[str, int] = {}
        self._max_backoff = max_backoff_rounds
        self._schedules: dict[int, _Schedule] = {}

    def new_round(self) -> None:
        """A round begins: every backend has its whole budget of calls again."""
        self._fallback_left.clear()

    def forget(self, alive: Container[int]) -> None:
        """Drop the schedules of endpoints that are gone (``alive``: the ids of those still there)."""
        for key in [k for k in self._schedules if k not in alive]:
            del self._schedules[key]

    async def check(self, backend: Backend[Any], ep: Endpoint, keys: Sequence[tuple[str, str]]) -> bool:
        """Per-model ready calls for ``keys`` (the backend's routed (model, version or "")); True
        when every one answered in time (the models are then checked: a model not asked is no
        longer "not checked since the server came up")."""
        if not keys:
            return True
        sched = self._schedules.setdefault(id(ep), _Schedule())
        health = ep.health
        known = health.per_model
        left = self._fallback_left.get(backend.name, self._fallback_budget)
        rounds = self._rounds()
        # Never asked first, then not-ready ones due again, then the rolling window of ready ones.
        todo = list(dict.fromkeys(
            [k for k in keys if k not in known]
            + [k for k in keys if k in known and not known[k] and sched.due.get(k, 0) <= rounds]))
        window = min(self._recheck, len(keys))
        todo = list(dict.fromkeys(todo + [keys[(sched.cursor + i) % len(keys)] for i in range(window)]))
        complete = len(todo) <= left
        if not complete:
            # The backend's calls this round are spent: the rest waits for the next rounds (an
            # endpoint whose models are not all asked takes no traffic for those not asked).
            todo = todo[:left]
        self._fallback_left[backend.name] = left - len(todo)
        sched.cursor = (sched.cursor + window) % len(keys)

        def answer(key: tuple[str, str], asked: list[float]) -> Callable[[bool | None], None]:
            def apply(ok: bool | None) -> None:
                # A late answer counts only while the endpoint is still up: the checker does
                # not ask it again before this call ends, so "up" is the same process.
                if not health.live:
                    return
                was = known.get(key)
                if ok is None:  # no answer (a backend that tells it from "not ready"): keep what is known
                    if was is not None:
                        return
                    ok = False
                health.set_model(key, ok, asked[0])
                if ok:
                    sched.backoff.pop(key, None)
                    return
                backoff = 1 if was else min(sched.backoff.get(key, 1) * 2, self._max_backoff)
                sched.backoff[key] = backoff
                sched.due[key] = self._rounds() + backoff
            return apply

        async def one(key: tuple[str, str]) -> bool:
            asked: list[float] = []

            def call(timeout: float) -> Awaitable[bool | None]:
                asked.append(time.monotonic())
                return backend.check_model(ep, key[0], key[1], timeout)

            return await self._ask(ep, call, answer(key, asked))

        return all(await gather_in_slices(one(k) for k in todo)) and complete
