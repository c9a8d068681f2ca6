"""Requests for a model that is ready nowhere yet: held (``Holds``, every backend whose routes set
``hold_s``) and, in a placement pool (``Placer``, config ``placement``), loaded on demand.

Placement (docs/placement.md): the backend's endpoints are Triton servers in explicit
model-control mode sharing one repository. A request for a model ready on no endpoint waits in a
bounded queue for that model while one task places it on the first endpoint of the model's
rendezvous order (``routing/rendezvous.py``) that has room or can make it — an endpoint holds at
most ``capacity_models`` models, counting every model its index shows ready, loading or unloading
(whoever loaded it) and the loads issued here that its index does not show yet; a full one evicts
first: the least recently used by Triton's own
``last_inference`` (statistics), never a pinned model, one with requests in flight through this
process, one loaded or used within ``min_residency_s``, nor one no route of this backend sends to
it (someone else's). One decision per endpoint at a time (a lock per endpoint): two models never
take the same free place. The unload is sent, then the load at once (Triton answers an unload at
once and frees the memory ~1 s later: the overshoot is one unload long). Triton answers the load
when the model is ready; the endpoint is marked ready for it then, and the waiting requests go.

Copies follow demand (``maintain``, once per health round): a model whose requests (in flight and
waiting) per copy stay above ``scale_up_per_copy`` for ``scale_up_after_s`` gets a copy on the
next endpoint of its order, up to ``max_copies``; an extra copy without inference for
``copy_idle_s`` (Triton's ``last_inference``) is unloaded. Pinned models are loaded at start.

Never sent: a load to an endpoint where the model is ready (Triton would reload it when anything
in its directory changed — another Triton's ``__pycache__`` in a shared repository is enough).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..config.schema import Placement
from ..errors import GatewayError, ModelNotReady, UpstreamError, UpstreamTimeout
from ..routing.readiness import Ready
from ..routing.rendezvous import rank
from .base import Backend, Refused
from .capacity import Room, Usage
from .holds import Holds, NoRoom, PlacementEvents, not_ready

__all__ = ["Decider", "Placer"]

log = logging.getLogger("oip_gateway.placement")

# How long a load this process issued counts against an endpoint whose index does not show it
# (yet): an index read before the load began may arrive after it ended.
_LOAD_GRACE_S = 10.0
# An unload sent here frees its place at once (the overshoot of one unload); after this long the
# index alone says whether the model still takes room (an unload that never ends).
_UNLOAD_GRACE_S = 10.0
_STATS_TIMEOUT_S = 5.0
# A load the server refused (a model its repository lacks) is answered from memory this long.
_FAILED_S = 5.0
# How often a load that found no room looks again (a model's residency ends, a request leaves).
_ROOM_POLL_S = 0.25
# A model this pool loaded and no inference has used since is not evicted for this long, whatever
# min_residency_s says: the requests it was loaded for — waiting here, or at a replica or worker
# that asked for it — run first (an eviction right after the load would make them load it again).
_FRESH_S = 2.0


class Decider(Protocol):
    """Who decides a pool's placement (gateway/peers.py ``PeerSet``): None from ``decider`` means
    this process; ``ask`` has the decider place a model (None: this process decides after all)."""

    def decider(self, pool: str) -> str | None: ...
    def ask(self, pool: str, model: str, copies: int, timeout: float) -> Awaitable[list[str] | None]: ...


class _Endpoint:
    """What this process did on one endpoint that its index may not show yet."""

    __slots__ = ("loading", "lock", "unloading")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        # model -> None while its load is in progress, then the monotonic time it ended.
        self.loading: dict[str, float | None] = {}
        self.unloading: dict[str, float] = {}  # model -> monotonic time the unload was sent


class Placer:
    """On-demand placement for one backend (see the module's docstring)."""

    def __init__(self, backend: Backend[Any], spec: Placement, holds: Holds, events: PlacementEvents,
                 owns: Callable[[str], bool]) -> None:
        self.backend = backend
        self.spec = spec
        self.holds = holds
        self.events = events
        # Whether a route sends ``model`` to this backend: only such models are ever unloaded.
        self.owns = owns
        self.pinned = frozenset(spec.pinned)
        self.room = Room(spec.capacity_models, spec.capacity_bytes)
        self.inflight = holds.inflight
        self.loaded_at: dict[tuple[str, str], float] = {}  # (endpoint, model) -> wall time of our load
        self._eps: dict[str, _Endpoint] = {}
        self._placing: dict[str, asyncio.Task[None]] = {}  # deciding here
        self._asking: dict[str, asyncio.Task[None]] = {}  # asking the pool's decider
        self._failed: dict[str, tuple[float, GatewayError]] = {}  # model -> (when, the server's refusal)
        self._hot_since: dict[str, float] = {}
        self._maintaining: asyncio.Task[None] | None = None
        # Set by the gateway when replicas coordinate (config ``peers``); None: this process decides.
        self.peers: Decider | None = None

    # -- request side ----------------------------------------------------------------------
    async def ensure(self, model: str, version: str, route: str) -> None:
        """Return once ``model`` is ready on some endpoint, loading it if it is nowhere; raises
        ModelNotReady (Retry-After) past the queue's bound or ``load_timeout_s``, and the
        endpoint's own error when the load is refused (a model the repository lacks)."""
        holds = self.holds
        failed = self._failed.get(model)
        if failed is not None:
            if time.monotonic() - failed[0] < _FAILED_S:
                raise failed[1]  # (a model the repository lacks is not asked for again at once)
            del self._failed[model]
        if model not in self._placing and model not in self._asking:
            self._start(model, self.spec.copies)
        await holds.wait(model, version, route, self.spec.load_timeout_s, " (loading it)")

    async def place_here(self, model: str, copies: int) -> list[str]:
        """Another replica asks this one, its pool's decider, to place ``model``: the endpoints
        it is ready on once it is (at most ``max_copies``); none for a model no repository lists
        that found no room (the asking replica's request goes on to the server's own answer)."""
        copies = max(1, min(copies, self.spec.max_copies))
        if self.copies(model) < copies:
            task = self._placing.get(model) or self._start(model, copies, here=True)
            try:
                await asyncio.wait_for(asyncio.shield(task), self.spec.load_timeout_s)
            except TimeoutError:
                raise not_ready(f"model '{model}' was not ready on any endpoint of backend '{self.backend.name}' "
                                 f"within {self.spec.load_timeout_s:g} s (loading it); retry later",
                                 max(1, round(self.spec.load_timeout_s))) from None
        usable = self._usable()
        ready = [str(ep.address) for ep in usable if ep.health.ready_for(model, "") == Ready.YES]
        if not ready:
            if usable and not any(ep.health.knows(model) for ep in usable):
                # No repository lists it and there was no room to try it: the asking replica's
                # request goes on and the server answers it itself (as here, ``_place``).
                return []
            raise not_ready(f"model '{model}' is not ready on backend '{self.backend.name}'; retry later", 2)
        return ready

    def _start(self, model: str, copies: int, here: bool = False) -> asyncio.Task[None]:
        """One task per model: deciding here (``_placing``), or asking the decider (``_asking``)."""
        here = here or self.peers is None
        coro = self._place(model, copies) if here else self._ask(model, copies)
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._placing if here else self._asking
        tasks[model] = task

        def done(t: asyncio.Task[None]) -> None:
            if tasks.get(model) is t:
                del tasks[model]
            error = None if t.cancelled() else t.exception()
            if isinstance(error, UpstreamTimeout):
                error = not_ready(f"model '{model}' did not load on backend '{self.backend.name}' in time "
                                   f"({error.message}); retry later", max(1, round(self.spec.load_timeout_s)))
            if error is not None and not isinstance(error, GatewayError):
                log.error("backend '%s': placing '%s' failed: %r", self.backend.name, model, error)
                error = ModelNotReady(f"model '{model}' could not be placed on backend '{self.backend.name}'")
            if isinstance(error, UpstreamError):  # the server's own refusal (no such model): kept a while
                if len(self._failed) >= 4096:
                    self._failed.clear()
                self._failed[model] = (time.monotonic(), error)
            self.holds.wake(model, error)

        task.add_done_callback(done)
        return task

    async def _ask(self, model: str, copies: int) -> None:
        """Have the pool's decider place ``model`` (or decide here when it is this process)."""
        assert self.peers is not None
        ready = await self.peers.ask(self.backend.name, model, copies, self.spec.load_timeout_s + 5)
        if ready is None:  # this process decides (the others did not answer): one placing task
            await asyncio.shield(self._placing.get(model) or self._start(model, copies, here=True))
            return
        by_address = {str(ep.address): ep for ep in self.backend.endpoints.values()}
        for address in ready:
            ep = by_address.get(address)
            if ep is not None:
                ep.health.placed(model, time.monotonic())  # (the decider saw it ready; checks follow)
        self.holds.wake(model)

    # -- deciding ------------------------------------------------------------------------
    def _state(self, address: str) -> _Endpoint:
        st = self._eps.get(address)
        if st is None:
            st = self._eps[address] = _Endpoint()
        return st

    def _occupied(self, ep: Any, st: _Endpoint, now: float) -> set[str]:
        """The models that count against ``ep``'s capacity now."""
        index = ep.health.index
        held = set(index.held) if index is not None else set()
        for model, t in list(st.unloading.items()):
            # Decided: its place is taken by the load that evicted it — for the grace, whatever
            # an index read says meanwhile (one read before the unload still shows it READY).
            if now - t > _UNLOAD_GRACE_S:
                del st.unloading[model]
            else:
                held.discard(model)
        for model, ended in list(st.loading.items()):
            if ended is None or now - ended < _LOAD_GRACE_S:
                held.add(model)  # loading, or loaded so lately that an index read before may still come
            else:
                del st.loading[model]  # the index decides from now on
        return held

    async def _usage(self, ep: Any) -> Usage | None:
        try:
            answer, form = await self.backend.endpoint_stats(ep, "", "", _STATS_TIMEOUT_S)
            usage = Usage.read(answer, form)
            self.room.learn(usage)
            return usage
        except Refused as exc:
            why = exc.error.message
        except GatewayError as exc:
            why = exc.message
        log.warning("backend '%s': statistics of %s unreadable (%s)", self.backend.name, ep.address, why)
        return None

    def _evictable(self, ep: Any, occupied: set[str], usage: Usage, now_wall: float) -> str | None:
        """The least recently used model ``ep`` may give up, or None."""
        index = ep.health.index
        ready = index.ready_names if index is not None else frozenset()
        residency_ms = self.spec.min_residency_s * 1000
        now_ms = now_wall * 1000
        best: tuple[float, str] | None = None
        for model in occupied:
            if (model not in ready or model in self.pinned or self.inflight.get(model) or model in self._placing
                    or model in self.holds.waiting or not self.owns(model)):
                continue
            last = usage.models.get(model, (0, 0))[0]
            loaded = self.loaded_at.get((str(ep.address), model), 0.0) * 1000
            used = max(last, loaded)
            if now_ms - used < residency_ms or (loaded > last and now_ms - loaded < _FRESH_S * 1000):
                continue
            if best is None or (used, model) < best:
                best = (used, model)
        return None if best is None else best[1]

    async def _claim(self, ep: Any, model: str, evict: bool) -> bool:
        """Take a place for ``model`` on ``ep`` (``evict``: giving up its least recently used
        model when it has no free one). True: the load may be sent (it is counted from now)."""
        address = str(ep.address)
        st = self._state(address)
        async with st.lock:
            now = time.monotonic()
            occupied = self._occupied(ep, st, now)
            index = ep.health.index
            if model in occupied and (model in st.loading or index is None or model not in index.unloading):
                st.loading.setdefault(model, None)  # (one that ended lately stays so: _load checks it)
                st.unloading.pop(model, None)
                return True  # loading there already (a load to a LOADING model joins it)
            occupied.discard(model)  # (unloading there: its place is leaving; this load needs one of its own)
            room = self.room
            usage: Usage | None = None
            if room.limit:
                usage = await self._usage(ep)
                if usage is None:
                    return False  # (memory that cannot be counted is not taken)
            if len(occupied) > room.models:
                return False  # over by more than one model (someone else's loads): one eviction frees nothing
            # The victims are all chosen before any is unloaded: nothing is given up for a load
            # that would not fit after all.
            victims: list[str] = []
            while not room.fits(model, occupied, usage):
                if not evict or (victims and not room.limit):
                    return False  # (only memory may take more than one eviction)
                if usage is None:
                    usage = await self._usage(ep)
                    if usage is None:
                        return False
                victim = self._evictable(ep, occupied, usage, time.time())
                if victim is None:
                    return False
                victims.append(victim)
                occupied.discard(victim)
            for victim in victims:
                if not await self._evict(ep, st, victim):
                    return False
            st.loading[model] = None
            st.unloading.pop(model, None)  # (loaded again where it was being unloaded)
            return True

    async def _evict(self, ep: Any, st: _Endpoint, model: str) -> bool:
        if not await self._unload(ep, model, "evict"):
            return False
        st.unloading[model] = time.monotonic()
        st.loading.pop(model, None)  # (a load of it lately must not count it back)
        return True

    async def _settle(self, ep: Any, model: str) -> None:
        """After ``model``'s first load anywhere revealed its size: evict from ``ep`` (never
        ``model``: it is fresh) until the memory its models report is within ``capacity_bytes``
        again (``Room``)."""
        st = self._state(str(ep.address))
        async with st.lock:
            usage = await self._usage(ep)
            if usage is None:
                return
            occupied = self._occupied(ep, st, time.monotonic())
            while self.room.over(occupied, usage):
                victim = self._evictable(ep, occupied, usage, time.time())
                if victim is None:
                    log.warning("backend '%s': %s holds %d bytes of models against capacity_bytes %d since "
                                "'%s' loaded, and none may be evicted yet", self.backend.name, ep.address,
                                self.room.used(occupied, usage), self.room.limit, model)
                    return
                if not await self._evict(ep, st, victim):
                    return
                occupied.discard(victim)

    async def _unload(self, ep: Any, model: str, reason: str) -> bool:
        try:
            await self.backend.control(ep, "unload", model, _STATS_TIMEOUT_S)
        except GatewayError as exc:
            log.warning("backend '%s': unloading '%s' from %s failed: %s", self.backend.name, model, ep.address,
                        exc.message)
            return False
        log.info("backend '%s': unloaded '%s' from %s (%s)", self.backend.name, model, ep.address, reason)
        self.loaded_at.pop((str(ep.address), model), None)
        ep.health.not_ready(model, "")
        self.events.unloaded(self.backend.name, reason)
        return True

    def _capacity(self) -> str:
        room = self.room
        return f"{room.models} models" + (f", {room.limit} bytes" if room.limit else "")

    def _usable(self) -> list[Any]:
        return [ep for ep in self.backend.endpoints.values() if ep.health.usable()]

    def _order(self, model: str, eps: list[Any]) -> list[Any]:
        by_address = {str(ep.address): ep for ep in eps}
        return [by_address[a] for a in rank(model, by_address)]

    async def _place(self, model: str, copies: int) -> None:
        """Make ``model`` ready on ``copies`` endpoints (those it is ready on count)."""
        eps = self._usable()
        if not eps:
            raise not_ready(f"model '{model}' cannot be loaded: backend '{self.backend.name}' has no live "
                             "endpoint; retry later", 2)
        order = self._order(model, eps)
        have = [ep for ep in order if ep.health.ready_for(model, "") == Ready.YES]
        need = copies - len(have)
        if need <= 0:
            return
        chosen: list[Any] = []
        rest = [ep for ep in order if ep not in have]
        if not any(ep.health.knows(model) for ep in eps):
            # No repository lists it (a name a client made up, or one added since the last
            # check): never evict for it. Loaded where there is room (the server says what it
            # makes of it), else the request goes on and the server answers it itself.
            for ep in rest:
                if await self._claim(ep, model, False):
                    await self._load(ep, model)
                    return
            return
        deadline = time.monotonic() + self.spec.load_timeout_s
        while True:
            # The model's own order decides, not where there happens to be room: its first
            # endpoint evicts before it loads, so a model has one home while its endpoints stay,
            # and a pod that comes or goes moves only the models whose first choice it is.
            for ep in rest:
                if len(chosen) >= need:
                    break
                if ep not in chosen and ep.health.usable() and await self._claim(ep, model, True):
                    chosen.append(ep)
            if chosen or have:
                break
            # Every endpoint is full of models in use or within min_residency_s: the requests
            # wait (bounded by load_timeout_s) until one may go, rather than failing at once.
            if time.monotonic() + _ROOM_POLL_S >= deadline:
                raise NoRoom(f"model '{model}' cannot be loaded on backend '{self.backend.name}': every live "
                             f"endpoint is full ({self._capacity()}) of models in use or within "
                             f"min_residency_s; retry later", max(1, round(self.spec.min_residency_s / 4)))
            await asyncio.sleep(_ROOM_POLL_S)
        if not chosen:
            return
        results = await asyncio.gather(*(self._load(ep, model) for ep in chosen), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results) and not have:
            raise errors[0]

    async def _load(self, ep: Any, model: str) -> None:
        address = str(ep.address)
        st = self._state(address)
        start = time.monotonic()
        index = ep.health.index
        ended = st.loading.get(model)
        if (index is not None and model in index.ready_names) or (
                ended is not None and await self.backend.check_model(ep, model, "", _STATS_TIMEOUT_S)):
            # Ready there already — as its index says, or as the server says when this process
            # loaded it lately (an index read before that load ended may hide it): a load could
            # reload it (Triton does when anything in its directory changed).
            st.loading[model] = start if ended is None else ended
            ep.health.placed(model, time.monotonic())
            self.holds.wake(model)
            return
        unknown = bool(self.room.limit) and model not in self.room.sizes
        try:
            # Bounded by the backend's timeout_s: a request stops waiting after load_timeout_s, the
            # load goes on (the next request finds the model ready, or loading).
            await self.backend.control(ep, "load", model, max(self.spec.load_timeout_s, self.backend.spec.timeout_s))
        except GatewayError as exc:
            st.loading.pop(model, None)
            outcome = "timeout" if isinstance(exc, UpstreamTimeout) else "failed"
            self.events.loaded(self.backend.name, outcome, time.monotonic() - start)
            log.warning("backend '%s': loading '%s' on %s failed: %s", self.backend.name, model, address, exc.message)
            raise
        seconds = time.monotonic() - start
        st.loading[model] = time.monotonic()
        self.loaded_at[(address, model)] = time.time()
        ep.health.placed(model, time.monotonic())
        self.events.loaded(self.backend.name, "ok", seconds)
        log.info("backend '%s': loaded '%s' on %s in %.2f s", self.backend.name, model, address, seconds)
        self.holds.wake(model)
        if unknown:
            await self._settle(ep, model)

    # -- once per health round -------------------------------------------------------------
    def maintain(self) -> None:
        """Wake what is ready, then (one pass at a time) pinned models, copies with demand, idle
        extra copies."""
        self.holds.recheck()
        spec = self.spec
        if self.pinned or spec.max_copies > spec.copies:  # (else a pass has nothing to do)
            if self._maintaining is None or self._maintaining.done():
                self._maintaining = asyncio.get_running_loop().create_task(self._maintain())

    def placed_models(self) -> set[str]:
        """The models of this pool's routes ready on some live endpoint now."""
        names: set[str] = set()
        for ep in self.backend.endpoints.values():
            index = ep.health.index
            if index is not None and ep.health.usable():
                names |= index.ready_names
        return {m for m in names if self.owns(m)}

    def copies(self, model: str) -> int:
        return sum(1 for ep in self.backend.endpoints.values()
                   if ep.health.usable() and ep.health.ready_for(model, "") == Ready.YES)

    def deciding(self) -> bool:
        return self.peers is None or self.peers.decider(self.backend.name) is None

    async def _maintain(self) -> None:
        try:
            deciding = self.deciding()
            for model in self.pinned if deciding else ():
                if model not in self._placing and model not in self._asking and self.copies(model) < self.spec.copies:
                    self._start(model, self.spec.copies)
            now = time.monotonic()
            spec = self.spec
            demand = dict(self.inflight) if spec.max_copies > spec.copies else {}  # (held requests are in flight too)
            for model in list(self._hot_since):
                if model not in demand:
                    del self._hot_since[model]
            for model, n in demand.items():
                have = self.copies(model)
                if have == 0 or have >= spec.max_copies or n / have <= spec.scale_up_per_copy:
                    self._hot_since.pop(model, None)
                    continue
                since = self._hot_since.setdefault(model, now)
                if now - since >= spec.scale_up_after_s and model not in self._placing and model not in self._asking:
                    log.info("backend '%s': '%s' has %d requests on %d copies: adding one", self.backend.name,
                             model, n, have)
                    self._hot_since[model] = now
                    self._start(model, have + 1)
            if spec.max_copies > spec.copies and deciding:
                await self._trim_copies()
        except Exception:  # noqa: BLE001 - a pass that fails is logged; the next round tries again
            log.exception("backend '%s': placement maintenance failed", self.backend.name)

    async def _trim_copies(self) -> None:
        """Unload extra copies (beyond ``copies``, last in hash order first) idle for ``copy_idle_s``."""
        spec = self.spec
        eps = self._usable()
        counts: dict[str, list[Any]] = {}
        for ep in eps:
            index = ep.health.index
            for model in (index.ready_names if index is not None else ()):
                counts.setdefault(model, []).append(ep)
        extra = {m: e for m, e in counts.items() if len(e) > spec.copies and self.owns(m)
                 and not self.inflight.get(m) and m not in self._placing and m not in self.holds.waiting}
        if not extra:
            return
        usages: dict[str, Usage | None] = {}
        now_ms = time.time() * 1000
        for model, holders in extra.items():
            order = [ep for ep in self._order(model, eps) if ep in holders]
            for ep in reversed(order[spec.copies:]):
                address = str(ep.address)
                if address not in usages:
                    usages[address] = await self._usage(ep)
                usage = usages[address]
                if usage is None:
                    continue
                used = max(usage.models.get(model, (0, 0))[0], self.loaded_at.get((address, model), 0.0) * 1000)
                if now_ms - used >= spec.copy_idle_s * 1000:
                    st = self._state(address)
                    async with st.lock:
                        if await self._unload(ep, model, "idle_copy"):
                            st.unloading[model] = time.monotonic()
                            st.loading.pop(model, None)

    # -- the backend's background job ------------------------------------------------------
    def start(self) -> None:
        """Nothing runs until the first health round (``maintain``)."""

    async def stop(self) -> None:
        tasks = [*self._placing.values(), *self._asking.values(), *([self._maintaining] if self._maintaining else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
