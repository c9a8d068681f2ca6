"""Background health and model-readiness checks (never per request).

Each round, for every endpoint of every backend:

1. server-live. A server that was down (or is new) and answers again is a new
   process: what was known of its models is forgotten (``EndpointHealth.set_live``);
2. its repository index, one call (Triton, MLServer): every model with its state;
3. where there is no index (OVMS; Triton with a restricted repository API and no
   ``check_headers``): per-model ready calls for the backend's exact routes, their cost
   bounded for large route tables (backoff, a rolling re-check window, a budget per
   backend and round: :class:`~gateway.backends.modelchecks.ModelChecks`).

An index answer is read only when its bytes differ from the endpoint's last one, and once
for all endpoints that answered the same bytes (``_index``: they share one parsed
:class:`~gateway.routing.readiness.Index`). The gateway's readiness is recomputed only when a
backend's generation moved, with set operations over the distinct indexes
(``_ready_in``) — at 300 endpoints × 10,000 routes a round that changes nothing costs
the answers' bytes compared, not 3,000,000 lookups.

What a check's outcome does (Envoy's active health checking): liveness goes through
the thresholds (``EndpointHealth.checked``) — a live endpoint goes down after
``unhealthy_threshold`` failed checks in a row, a down one comes up after
``healthy_threshold`` good ones, a new one is decided by its first check. A failed
check is a not-live answer, a refused or broken connection, or no answer at all
within ``timeout_s + interval_s``. A slow answer that arrives is not a failure: a
round waits ``timeout_s`` for each call, then goes on without it (the other
endpoints are not held up); the call is *late*, not failed — its answer is taken
when it arrives (and the gateway's readiness recomputed then), and the endpoint is
not asked again until it has ended. Meanwhile the endpoint keeps what is known of it.
The first check of a new endpoint is the exception: late is down, at once (a late
answer then counts as a good check). An index that does not come keeps the last one
known for ``unhealthy_threshold`` rounds (``EndpointHealth.index_missing``).

The gateway is ready when every exact route has an endpoint with its model ready,
and never with no live backend. Results live on the endpoints (``ep.health``) and
in ``ready`` / ``not_ready``; the backends read them to choose endpoints.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..config.schema import Health
from ..errors import GatewayError
from ..routing.readiness import EndpointHealth, Index, Ready
from .base import Backend
from .endpoints import Endpoint
from .fanout import gather_in_slices
from .modelchecks import ModelChecks

__all__ = ["HealthChecker"]

log = logging.getLogger("oip_gateway.health")

T = TypeVar("T")
# (model, version or None, backend[, group]): routes with the same group are one route's
# backends (a split's sides): it is ready when one of them is. Group -1: checked, never
# required (a mirror's shadow backend). Without a group, each entry is a route of its own.
Route = tuple[str, str | None, str] | tuple[str, str | None, str, int]


_DEFAULTS = Health()


class HealthChecker:
    def __init__(
        self,
        backends: Mapping[str, Backend[Any]],
        exact_routes: Sequence[Route],
        *,
        interval_s: float,
        timeout_s: float,
        on_round: Callable[[HealthChecker], None] | None = None,
        concurrency: int = 16,
        index_concurrency: int = 8,
        recheck_per_round: int = 256,
        fallback_per_round: int = 4096,
        max_backoff_rounds: int = 32,
        unhealthy_threshold: int = _DEFAULTS.unhealthy_threshold,
        healthy_threshold: int = _DEFAULTS.healthy_threshold,
    ) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.unhealthy_threshold = unhealthy_threshold
        self.healthy_threshold = healthy_threshold
        self.ready = False
        self.rounds = 0
        self.not_ready: list[str] = []
        # (route model, backend) -> some endpoint has it ready; for the route_ready metric.
        self.route_states: dict[tuple[str, str], bool] = {}
        self._on_round = on_round
        self._sem = asyncio.Semaphore(concurrency)
        # Repository-index calls in flight, within ``concurrency``: each answer is large (690 KB
        # for 10,000 models) and the loop reads every socket with data once a turn, so 16 answers
        # arriving at once made turns of 2-3 ms of reading (300 endpoints, loopback). Not fewer:
        # a round must still reach every endpoint within interval_s when indexes come slowly
        # (300 endpoints at 8 in flight and 30 ms an index: ~1.1 s).
        self._index_sem = asyncio.Semaphore(index_concurrency)
        # Per-model calls of the endpoints without an index: what is due, each backend's budget.
        self._models = ModelChecks(self._ask, lambda: self.rounds, recheck_per_round=recheck_per_round,
                                   fallback_per_round=fallback_per_round, max_backoff_rounds=max_backoff_rounds)
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._first = asyncio.Event()
        # id(endpoint) -> its late calls still running (the endpoint is skipped until they end).
        self._late: dict[int, set[asyncio.Future[Any]]] = {}
        self.backends: Mapping[str, Backend[Any]] = {}
        self.exact_routes: list[tuple[str, str | None, str, int]] = []
        self._keys: dict[str, list[tuple[str, str]]] = {}
        # Per backend: (models routed without a version, (model, version) routed with one).
        self._wanted: dict[str, tuple[frozenset[str], frozenset[tuple[str, str]]]] = {}
        # The backends' generations at the last summary (None: recompute).
        self._stamp: tuple[int, ...] | None = None
        # Repository indexes by the bytes they were read from, shared by the endpoints that
        # answered those bytes (``_index``).
        self._indexes: dict[bytes, Index] = {}
        self.reconfigure(backends, exact_routes)

    def reconfigure(self, backends: Mapping[str, Backend[Any]], exact_routes: Sequence[Route]) -> None:
        """New backends and routes (a config reload); endpoints keep their state. The next
        round comes at once."""
        self.backends = backends
        # (model, version or None, backend), deduplicated, in config order.
        self.exact_routes = list(dict.fromkeys(
            (r[0], r[1], r[2], r[3] if len(r) > 3 else -2 - i) for i, r in enumerate(exact_routes)))
        keys: dict[str, list[tuple[str, str]]] = {name: [] for name in backends}
        for model, version, name, _ in self.exact_routes:
            if name in keys:
                keys[name].append((model, version or ""))
        self._keys = {name: list(dict.fromkeys(k)) for name, k in keys.items()}
        self._wanted = {name: (frozenset(m for m, v in k if not v), frozenset((m, v) for m, v in k if v))
                        for name, k in self._keys.items()}
        self._stamp = None  # (the routes changed: the next summary recomputes)
        for name, backend in backends.items():
            backend.routed = frozenset(m for m, _ in self._keys[name])
            backend.on_new_endpoints = self.kick
        self.kick()

    def late_calls(self) -> int:
        """Check calls still running past their round (their answers not taken yet)."""
        return sum(len(tasks) for tasks in self._late.values())

    def kick(self) -> None:
        """Run the next round now (new endpoints, a reload)."""
        self._kick.set()

    async def _ask(self, ep: Endpoint, call: Callable[[float], Awaitable[T]],
                   apply: Callable[[T], None]) -> bool:
        """One check call (``call(transport timeout)``), within the concurrency bound, and
        ``apply`` on its answer. True: it ended within ``timeout_s`` (applied). False: it is
        late — the round goes on without it; it runs on (out of the bound: a slow endpoint
        does not hold the others' checks up) until it ends, within ``timeout_s + interval_s``,
        and its answer is applied then."""
        async with self._sem:
            task = asyncio.ensure_future(call(self.timeout_s + self.interval_s))
            try:
                done, _ = await asyncio.wait((task,), timeout=self.timeout_s)
            except asyncio.CancelledError:
                # Kept with the late calls, which stop() awaits: cancelled, the call must still
                # run to its end (else, the loop closing first, its coroutine is never awaited).
                task.cancel()
                self._late.setdefault(id(ep), set()).add(task)
                task.add_done_callback(functools.partial(self._arrived, id(ep), apply))
                raise
        if done:
            apply(task.result())
            return True
        self._late.setdefault(id(ep), set()).add(task)
        task.add_done_callback(functools.partial(self._arrived, id(ep), apply))
        return False

    def _arrived(self, key: int, apply: Callable[[Any], None], task: asyncio.Future[Any]) -> None:
        """A late call ended: its answer counts now, and the gateway's readiness follows."""
        late = self._late.get(key)
        if late is not None:
            late.discard(task)
            if not late:
                del self._late[key]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("late health check failed", exc_info=exc)
            return
        try:
            apply(task.result())
            if self.rounds:
                self._summarise()
        except Exception:
            log.exception("applying a late health check failed")

    def _live(self, ep: Endpoint) -> Callable[[bool], None]:
        def apply(ok: bool) -> None:
            ep.health.checked(ok, self.unhealthy_threshold, self.healthy_threshold)
            if ok and ep.health.live:
                ep.health.readmit(time.monotonic())
        return apply

    async def _check_endpoint(self, backend: Backend[Any], ep: Endpoint) -> None:
        if id(ep) in self._late:
            return  # a call of an earlier round still running: its answer decides when it comes
        health = ep.health
        answered: list[Any] = []

        def live(ok: bool) -> None:
            answered.append(ok)
            self._live(ep)(ok)

        if not await self._ask(ep, lambda t: backend.check_live(ep, t), live):
            if health.live is None:
                health.checked(False, self.unhealthy_threshold, self.healthy_threshold)  # the first check decides
            return
        if not answered[0] or not health.live:
            return  # a failed check (below the threshold, what is known stays) or down
        if backend.spec.repository_index:

            asked: list[float] = []

            def index_call(timeout: float) -> Awaitable[bytes | bytearray | None]:
                asked.append(time.monotonic())  # (what the gateway placed after this, the answer cannot undo)
                return backend.check_index_raw(ep, timeout)

            def got(raw: bytes | bytearray | None) -> None:
                index = self._index(backend, health, raw)
                answered.append(index)
                if index is not None and index.names and health.live:  # (late: only while still up)
                    health.set_index_state(index, asked[0])

            async with self._index_sem:
                in_time = await self._ask(ep, index_call, got)
            if not in_time:
                return  # late: the index known stays until the answer comes
            index = answered[1]
            if index is not None and index.names:
                return
            # An empty index tells nothing a per-model call would not (a server whose index
            # covers only part of what it serves — another gateway in front of OVMS — answers
            # [] too): per-model calls decide then. No index at all (no answer, refused, not
            # readable) keeps the last one for unhealthy_threshold rounds.
            if index is None and health.index_missing(self.unhealthy_threshold):
                return
        health.set_no_index()  # index gone (restricted, or never had one): per-model calls
        if await self._models.check(backend, ep, self._keys.get(backend.name, [])):
            health.set_models_checked()

    def _index(self, backend: Backend[Any], health: EndpointHealth, raw: bytes | bytearray | None) -> Index | None:
        """The index an answer says: the endpoint's own if the bytes are the same as last
        time (a comparison, no parse), else the one another endpoint answered with the same
        bytes, else a new one. None: no answer, or one that does not read as an index."""
        if raw is None:
            return None
        now = health.index
        if now is not None and now.raw == raw:
            return now
        key = bytes(raw)
        index = self._indexes.get(key)
        if index is None:
            try:
                entries = backend.parse_index(key)
            except GatewayError as err:
                # (Not cached: asked again next round. Debug, not warning: one line per endpoint
                # per round would flood the log; the endpoint falls back to per-model checks.)
                log.debug("backend '%s': a repository index that does not read: %s", backend.name, err.message)
                return None
            index = self._indexes[key] = Index(key, entries)
        return index

    async def check_once(self) -> bool:
        self._models.new_round()
        pairs = [(backend, ep) for backend in self.backends.values() for ep in list(backend.endpoints.values())]
        await gather_in_slices(self._check_endpoint(p, ep) for p, ep in pairs)
        self._models.forget({id(ep) for _, ep in pairs})
        held = {id(ep.health.index) for _, ep in pairs}
        for raw in [k for k, index in self._indexes.items() if id(index) not in held]:
            del self._indexes[raw]  # no endpoint answers with these bytes any more
        self.rounds += 1
        self._summarise()
        self._first.set()
        return self.ready

    def _summarise(self) -> None:
        """The gateway's readiness from the endpoints' decided state (after a round, and when
        a late answer arrives) — recomputed only when something that decides it moved."""
        stamp = tuple(backend.generation for backend in self.backends.values())
        if stamp != self._stamp:
            self._stamp = stamp
            self._compute()
        if self._on_round is not None:
            self._on_round(self)

    def _compute(self) -> None:
        ready: dict[str, tuple[frozenset[str], frozenset[tuple[str, str]]]] = {}
        for name, backend in self.backends.items():
            ready[name] = self._ready_in(backend)
        states: dict[tuple[str, str], bool] = {}
        groups: dict[int, tuple[str, bool]] = {}  # group -> (what, some backend has it ready)
        for model, version, name, group in self.exact_routes:
            plain, versioned = ready.get(name, (frozenset(), frozenset()))
            ok = (model, version) in versioned if version else model in plain
            if group != -1:
                what = model + (f"/{version}" if version else "")
                groups[group] = (what, groups.get(group, (what, False))[1] or ok)
            states[(model, name)] = states.get((model, name), True) and ok
        live = any(ep.health.live is True for backend in self.backends.values() for ep in backend.endpoints.values())
        self.not_ready = [what for what, ok in groups.values() if not ok]
        self.route_states = states
        self.ready = live and not self.not_ready

    def _ready_in(self, backend: Backend[Any]) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
        """(models routed without a version, (model, version) routed) ready on some usable
        endpoint of ``backend``. Endpoints that share an index are looked at once, with set
        operations: a fleet of identical pods costs one index's worth, not one per pod."""
        plain, versioned = self._wanted.get(backend.name, (frozenset(), frozenset()))
        usable = [ep.health for ep in backend.endpoints.values() if ep.health.usable()]
        shared = {id(h.index): h.index for h in usable if h.index is not None}
        plain_ok: set[str] = set()
        versioned_ok: set[tuple[str, str]] = set()
        for index in shared.values():
            plain_ok |= plain & index.ready_names
            versioned_ok |= versioned & index.ready
        for h in usable:
            if h.index is None:  # per-model checks (no index): each model asked of each endpoint
                plain_ok.update(m for m in plain - plain_ok if h.ready_for(m, "") == Ready.YES)
                versioned_ok.update(k for k in versioned - versioned_ok if h.ready_for(*k) == Ready.YES)
        return frozenset(plain_ok), frozenset(versioned_ok)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            began = loop.time()
            try:
                await self.check_once()
            except Exception:
                log.exception("health round failed")
            # Rounds begin every interval_s, however long one took (an endpoint is re-checked
            # every interval_s, not every interval_s plus a round); a round longer than that is
            # followed by a pause of a tenth of it, never by the next at once.
            pause = max(self.interval_s - (loop.time() - began), self.interval_s / 10)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), pause)

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
        late = [task for tasks in self._late.values() for task in tasks]
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        self._late.clear()
