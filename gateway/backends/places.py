"""The places on each endpoint of a placement pool (``Places``): which models count against an
endpoint's capacity, and taking a place for a load — evicting when the endpoint is full.

An endpoint holds at most ``capacity_models`` models (and, with ``capacity_bytes``, the memory
its models report), counting every model its index shows ready, loading or unloading (whoever
loaded it) and the loads issued here that its index does not show yet. A full one evicts first:
the least recently used by Triton's own ``last_inference`` (statistics), never a pinned model,
one with requests in flight or waiting through this process, one being placed here, one loaded or
used within ``min_residency_s``, nor one no route of this backend sends to it (someone else's).
One decision per endpoint at a time (a lock per endpoint): two models never take the same free
place. The unload is sent, then the load at once (Triton answers an unload at once and frees the
memory ~1 s later: the overshoot is one unload long).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config.schema import Placement
from ..errors import GatewayError
from .base import Backend
from .capacity import Room, Usage
from .holds import Holds, PlacementEvents
from .refusal import Refused

__all__ = ["Places"]

log = logging.getLogger("oip_gateway.placement")

# How long a load this process issued counts against an endpoint whose index does not show it
# (yet): an index read before the load began may arrive after it ended.
LOAD_GRACE_S = 10.0
# An unload sent here frees its place at once (the overshoot of one unload); after this long the
# index alone says whether the model still takes room (an unload that never ends).
UNLOAD_GRACE_S = 10.0
# Statistics and unloads are answered at once by a live server.
CONTROL_TIMEOUT_S = 5.0
# A model this pool loaded and no inference has used since is not evicted for this long, whatever
# min_residency_s says: the requests it was loaded for — waiting here, or at a replica or worker
# that asked for it — run first (an eviction right after the load would make them load it again).
FRESH_S = 2.0


class _Endpoint:
    """What this process did on one endpoint that its index may not show yet."""

    __slots__ = ("loading", "lock", "unloading")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        # model -> None while its load is in progress, then the monotonic time it ended.
        self.loading: dict[str, float | None] = {}
        self.unloading: dict[str, float] = {}  # model -> monotonic time the unload was sent


class Places:
    """The capacity of one placement backend's endpoints (see the module's docstring).

    ``placing`` is the placer's map of models being placed now (never evicted meanwhile);
    ``owns`` says whether a route sends a model to this backend (only such models are unloaded).
    """

    def __init__(self, backend: Backend[Any], spec: Placement, holds: Holds, events: PlacementEvents,
                 owns: Callable[[str], bool], placing: Mapping[str, object]) -> None:
        self.backend = backend
        self.spec = spec
        self.holds = holds
        self.events = events
        self.owns = owns
        self.placing = placing
        self.pinned = frozenset(spec.pinned)
        self.room = Room(spec.capacity_models, spec.capacity_bytes)
        self.loaded_at: dict[tuple[str, str], float] = {}  # (endpoint, model) -> wall time of our load
        self._eps: dict[str, _Endpoint] = {}

    def _state(self, address: str) -> _Endpoint:
        st = self._eps.get(address)
        if st is None:
            st = self._eps[address] = _Endpoint()
        return st

    # -- the loads this process issued -----------------------------------------------------
    def load_ended(self, address: str, model: str) -> float | None:
        """When this process's latest load of ``model`` on ``address`` ended (None: in progress,
        or none it still remembers)."""
        return self._state(address).loading.get(model)

    def loaded(self, address: str, model: str, ended: float, *, ours: bool) -> None:
        """``model`` is ready on ``address`` since ``ended`` (monotonic); ``ours``: this process's
        load made it so (its wall time keeps a fresh model from eviction)."""
        self._state(address).loading[model] = ended
        if ours:
            self.loaded_at[(address, model)] = time.time()

    def load_failed(self, address: str, model: str) -> None:
        self._state(address).loading.pop(model, None)

    # -- counting ------------------------------------------------------------------------
    def _occupied(self, ep: Any, st: _Endpoint, now: float) -> set[str]:
        """The models that count against ``ep``'s capacity now."""
        index = ep.health.index
        held = set(index.held) if index is not None else set()
        for model, t in list(st.unloading.items()):
            # Decided: its place is taken by the load that evicted it — for the grace, whatever
            # an index read says meanwhile (one read before the unload still shows it READY).
            if now - t > UNLOAD_GRACE_S:
                del st.unloading[model]
            else:
                held.discard(model)
        for model, ended in list(st.loading.items()):
            if ended is None or now - ended < LOAD_GRACE_S:
                held.add(model)  # loading, or loaded so lately that an index read before may still come
            else:
                del st.loading[model]  # the index decides from now on
        return held

    async def usage(self, ep: Any) -> Usage | None:
        """``ep``'s models as its statistics tell them now (None: unreadable, logged)."""
        try:
            answer, form = await self.backend.endpoint_stats(ep, "", "", CONTROL_TIMEOUT_S)
            usage = Usage.read(answer, form)
            self.room.learn(usage)
            return usage
        except Refused as exc:
            why = exc.error.message
        except GatewayError as exc:
            why = exc.message
        log.warning("backend '%s': statistics of %s unreadable (%s)", self.backend.name, ep.address, why)
        return None

    def last_used(self, address: str, model: str, usage: Usage) -> float:
        """The later of ``model``'s last inference on ``address`` and this process's load of it
        there, in ms since the epoch."""
        return max(usage.models.get(model, (0, 0))[0], self.loaded_at.get((address, model), 0.0) * 1000)

    def _evictable(self, ep: Any, occupied: set[str], usage: Usage, now_wall: float) -> str | None:
        """The least recently used model ``ep`` may give up, or None."""
        index = ep.health.index
        ready = index.ready_names if index is not None else frozenset()
        residency_ms = self.spec.min_residency_s * 1000
        now_ms = now_wall * 1000
        inflight, waiting = self.holds.inflight, self.holds.waiting
        best: tuple[float, str] | None = None
        for model in occupied:
            if (model not in ready or model in self.pinned or inflight.get(model) or model in self.placing
                    or model in waiting or not self.owns(model)):
                continue
            last = usage.models.get(model, (0, 0))[0]
            loaded = self.loaded_at.get((str(ep.address), model), 0.0) * 1000
            used = max(last, loaded)
            if now_ms - used < residency_ms or (loaded > last and now_ms - loaded < FRESH_S * 1000):
                continue
            if best is None or (used, model) < best:
                best = (used, model)
        return None if best is None else best[1]

    # -- deciding ------------------------------------------------------------------------
    async def claim(self, ep: Any, model: str, evict: bool) -> bool:
        """Take a place for ``model`` on ``ep`` (``evict``: giving up its least recently used
        model when it has no free one). True: the load may be sent (it is counted from now)."""
        st = self._state(str(ep.address))
        async with st.lock:
            now = time.monotonic()
            occupied = self._occupied(ep, st, now)
            index = ep.health.index
            if model in occupied and (model in st.loading or index is None or model not in index.unloading):
                st.loading.setdefault(model, None)  # (one that ended lately stays so: the load checks it)
                st.unloading.pop(model, None)
                return True  # loading there already (a load to a LOADING model joins it)
            occupied.discard(model)  # (unloading there: its place is leaving; this load needs one of its own)
            room = self.room
            usage: Usage | None = None
            if room.limit:
                usage = await self.usage(ep)
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
                    usage = await self.usage(ep)
                    if usage is None:
                        return False
                victim = self._evictable(ep, occupied, usage, time.time())
                if victim is None:
                    return False
                victims.append(victim)
                occupied.discard(victim)
            for victim in victims:
                if not await self._unload(ep, st, victim, "evict"):
                    return False
            st.loading[model] = None
            st.unloading.pop(model, None)  # (loaded again where it was being unloaded)
            return True

    async def settle(self, ep: Any, model: str) -> None:
        """After ``model``'s first load anywhere revealed its size: evict from ``ep`` (never
        ``model``: it is fresh) until the memory its models report is within ``capacity_bytes``
        again (``Room``)."""
        st = self._state(str(ep.address))
        async with st.lock:
            usage = await self.usage(ep)
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
                if not await self._unload(ep, st, victim, "evict"):
                    return
                occupied.discard(victim)

    async def unload(self, ep: Any, model: str, reason: str) -> bool:
        """Unload ``model`` from ``ep`` under its endpoint's lock (False: the server refused)."""
        st = self._state(str(ep.address))
        async with st.lock:
            return await self._unload(ep, st, model, reason)

    async def _unload(self, ep: Any, st: _Endpoint, model: str, reason: str) -> bool:
        try:
            await self.backend.control(ep, "unload", model, CONTROL_TIMEOUT_S)
        except GatewayError as exc:
            log.warning("backend '%s': unloading '%s' from %s failed: %s", self.backend.name, model, ep.address,
                        exc.message)
            return False
        log.info("backend '%s': unloaded '%s' from %s (%s)", self.backend.name, model, ep.address, reason)
        self.loaded_at.pop((str(ep.address), model), None)
        ep.health.not_ready(model, "")
        self.events.unloaded(self.backend.name, reason)
        st.unloading[model] = time.monotonic()
        st.loading.pop(model, None)  # (a load of it lately must not count it back)
        return True

    def capacity(self) -> str:
        """The capacity in words (for the answer to a request that found no room)."""
        room = self.room
        return f"{room.models} models" + (f", {room.limit} bytes" if room.limit else "")
