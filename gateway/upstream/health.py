"""Background health and model-readiness checks (never per request).

Each round, for every endpoint of every pool:

1. server-live. A server that was down (or is new) and answers again is a new
   process: what was known of its models is forgotten (``EndpointHealth.set_live``);
2. its repository index, one call (Triton, MLServer): every model with its state;
3. where there is no index (OVMS; Triton with a restricted repository API and no
   ``check_headers``): per-model ready calls for the pool's exact routes. Their cost
   is bounded for large route tables: a model not ready is re-checked with
   exponential backoff (every round at first, then every 2, 4, … up to
   ``max_backoff_rounds``), and a rolling window of ``recheck_per_round`` ready ones
   is re-checked (to notice a model being unloaded). With 10,000 routes that is
   hundreds of calls per round, not 10,000 — the benchmark measured 10,000
   never-ready routes doubling gRPC CPU per request when each was probed every round.

The gateway is ready when every exact route has an endpoint with its model ready,
and never with no live backend. Results live on the endpoints (``ep.health``) and
in ``ready`` / ``not_ready``; the pools read them to choose endpoints.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..routing.readiness import Ready
from .pool import Endpoint, Pool

__all__ = ["HealthChecker"]

log = logging.getLogger("oip_gateway.health")

T = TypeVar("T")
# (model, version or None, backend[, group]): routes with the same group are one route's
# pools (a split's sides): it is ready when one of them is. Group -1: checked, never
# required (a mirror's shadow pool). Without a group, each entry is a route of its own.
Route = tuple[str, str | None, str] | tuple[str, str | None, str, int]


class _Schedule:
    """Per-model checks of one endpoint without an index: when each is due next."""

    __slots__ = ("backoff", "cursor", "due")

    def __init__(self) -> None:
        self.backoff: dict[tuple[str, str], int] = {}
        self.due: dict[tuple[str, str], int] = {}
        self.cursor = 0


class HealthChecker:
    def __init__(
        self,
        pools: Mapping[str, Pool[Any]],
        exact_routes: Sequence[Route],
        *,
        interval_s: float,
        timeout_s: float,
        on_round: Callable[[HealthChecker], None] | None = None,
        concurrency: int = 16,
        recheck_per_round: int = 256,
        max_backoff_rounds: int = 32,
    ) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.ready = False
        self.rounds = 0
        self.not_ready: list[str] = []
        # (route model, backend) -> some endpoint has it ready; for the route_ready metric.
        self.route_states: dict[tuple[str, str], bool] = {}
        self._on_round = on_round
        self._sem = asyncio.Semaphore(concurrency)
        self._recheck = recheck_per_round
        self._max_backoff = max_backoff_rounds
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._first = asyncio.Event()
        self._schedules: dict[int, _Schedule] = {}
        self.pools: Mapping[str, Pool[Any]] = {}
        self.exact_routes: list[tuple[str, str | None, str, int]] = []
        self._keys: dict[str, list[tuple[str, str]]] = {}
        self.reconfigure(pools, exact_routes)

    def reconfigure(self, pools: Mapping[str, Pool[Any]], exact_routes: Sequence[Route]) -> None:
        """New pools and routes (a config reload); endpoints keep their state. The next
        round comes at once."""
        self.pools = pools
        # (model, version or None, backend), deduplicated, in config order.
        self.exact_routes = list(dict.fromkeys(
            (r[0], r[1], r[2], r[3] if len(r) > 3 else -2 - i) for i, r in enumerate(exact_routes)))
        keys: dict[str, list[tuple[str, str]]] = {name: [] for name in pools}
        for model, version, backend, _ in self.exact_routes:
            if backend in keys:
                keys[backend].append((model, version or ""))
        self._keys = {name: list(dict.fromkeys(k)) for name, k in keys.items()}
        for name, pool in pools.items():
            pool.routed = frozenset(m for m, _ in self._keys[name])
            pool.on_new_endpoints = self.kick
        self.kick()

    def kick(self) -> None:
        """Run the next round now (new endpoints, a reload)."""
        self._kick.set()

    async def _bounded(self, coro: Awaitable[T]) -> T:
        async with self._sem:
            return await coro

    async def _check_endpoint(self, pool: Pool[Any], ep: Endpoint) -> bool:
        live = await self._bounded(pool.check_live(ep, self.timeout_s))
        ep.health.set_live(live)
        if not live:
            return False
        ep.health.readmit(time.monotonic())
        index = await self._bounded(pool.check_index(ep, self.timeout_s)) if pool.backend.repository_index else None
        # An empty index tells nothing a per-model call would not (a server whose index
        # covers only part of what it serves — another gateway in front of OVMS — answers
        # [] too): per-model calls decide then.
        if index:
            ep.health.set_index(index)
            return True
        ep.health.set_no_index()  # index gone (restricted, or never had one): per-model calls
        await self._check_models(pool, ep)
        ep.health.set_models_checked()
        return True

    async def _check_models(self, pool: Pool[Any], ep: Endpoint) -> None:
        keys = self._keys.get(pool.name, [])
        if not keys:
            return
        sched = self._schedules.setdefault(id(ep), _Schedule())
        known = ep.health.per_model
        todo = {k for k in keys if k not in known or (not known[k] and sched.due.get(k, 0) <= self.rounds)}
        window = min(self._recheck, len(keys))
        todo.update(keys[(sched.cursor + i) % len(keys)] for i in range(window))
        sched.cursor = (sched.cursor + window) % len(keys)

        async def one(key: tuple[str, str]) -> None:
            ok = await self._bounded(pool.check_model(ep, key[0], key[1], self.timeout_s))
            was = known.get(key)
            ep.health.set_model(key, ok)
            if ok:
                sched.backoff.pop(key, None)
                return
            backoff = 1 if was else min(sched.backoff.get(key, 1) * 2, self._max_backoff)
            sched.backoff[key] = backoff
            sched.due[key] = self.rounds + backoff

        await asyncio.gather(*(one(k) for k in todo))

    async def check_once(self) -> bool:
        pairs = [(pool, ep) for pool in self.pools.values() for ep in list(pool.endpoints.values())]
        live = await asyncio.gather(*(self._check_endpoint(p, ep) for p, ep in pairs))
        alive = {id(ep) for _, ep in pairs}
        for key in [k for k in self._schedules if k not in alive]:
            del self._schedules[key]

        not_ready = []
        states: dict[tuple[str, str], bool] = {}
        groups: dict[int, tuple[str, bool]] = {}  # group -> (what, some pool has it ready)
        for model, version, backend, group in self.exact_routes:
            pool = self.pools.get(backend)
            eps = pool.endpoints.values() if pool is not None else ()
            ok = any(ep.health.usable() and ep.health.ready_for(model, version or "") == Ready.YES for ep in eps)
            if group != -1:
                what = model + (f"/{version}" if version else "")
                groups[group] = (what, groups.get(group, (what, False))[1] or ok)
            states[(model, backend)] = states.get((model, backend), True) and ok
        not_ready = [what for what, ok in groups.values() if not ok]
        self.not_ready = not_ready
        self.route_states = states
        self.ready = any(live) and not not_ready
        self.rounds += 1
        self._first.set()
        if self._on_round is not None:
            self._on_round(self)
        return self.ready

    async def _run(self) -> None:
        while True:
            self._kick.clear()
            try:
                await self.check_once()
            except Exception:
                log.exception("health round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def first_round(self, timeout: float) -> None:
        """Wait (bounded) for the first round: requests then go only where models are ready."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first.wait(), timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
