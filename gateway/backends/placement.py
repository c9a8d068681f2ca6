"""Requests for a model that is ready nowhere yet: held (``Holds``, every backend whose routes set
``hold_s``) and, in a placement pool (``Placer``, config ``placement``), loaded on demand.

Placement (docs/placement.md): the backend's endpoints are Triton servers in explicit
model-control mode sharing one repository. A request for a model ready on no endpoint waits in a
bounded queue for that model while one task places it on the first endpoint of the model's
rendezvous order (``routing/rendezvous.py``) that has room or can make it (``places.py``:
capacity and eviction). Triton answers the load when the model is ready; the endpoint is marked
ready for it then, and the waiting requests go.

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
from .base import Backend
from .capacity import Usage
from .holds import Holds, NoRoom, PlacementEvents, not_ready
from .places import CONTROL_TIMEOUT_S, Places

__all__ = ["Decider", "Placer"]

log = logging.getLogger("oip_gateway.placement")

# A load the server refused (a model its repository lacks) is answered from memory this long.
_FAILED_S = 5.0
# How often a load that found no room looks again (a model's residency ends, a request leaves).
_ROOM_POLL_S = 0.25


class Decider(Protocol):
    """Who decides a pool's placement (gateway/peers.py ``PeerSet``): None from ``decider`` means
    this process; ``ask`` has the decider place a model (None: this process decides after all)."""

    def decider(self, pool: str) -> str | None: ...
    def ask(self, pool: str, model: str, copies: int, timeout: float) -> Awaitable[list[str] | None]: ...


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
        self.inflight = holds.inflight
        self._placing: dict[str, asyncio.Task[None]] = {}  # deciding here
        self.places = Places(backend, spec, holds, events, owns, self._placing)
        self.room = self.places.room
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
                if await self.places.claim(ep, model, False):
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
                if ep not in chosen and ep.health.usable() and await self.places.claim(ep, model, True):
                    chosen.append(ep)
            if chosen or have:
                break
            # Every endpoint is full of models in use or within min_residency_s: the requests
            # wait (bounded by load_timeout_s) until one may go, rather than failing at once.
            if time.monotonic() + _ROOM_POLL_S >= deadline:
                raise NoRoom(f"model '{model}' cannot be loaded on backend '{self.backend.name}': every live "
                             f"endpoint is full ({self.places.capacity()}) of models in use or within "
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
        places = self.places
        start = time.monotonic()
        index = ep.health.index
        ended = places.load_ended(address, model)
        if (index is not None and model in index.ready_names) or (
                ended is not None and await self.backend.check_model(ep, model, "", CONTROL_TIMEOUT_S)):
            # Ready there already — as its index says, or as the server says when this process
            # loaded it lately (an index read before that load ended may hide it): a load could
            # reload it (Triton does when anything in its directory changed).
            places.loaded(address, model, start if ended is None else ended, ours=False)
            ep.health.placed(model, time.monotonic())
            self.holds.wake(model)
            return
        unknown = bool(self.room.limit) and model not in self.room.sizes
        try:
            # Bounded by the backend's timeout_s: a request stops waiting after load_timeout_s, the
            # load goes on (the next request finds the model ready, or loading).
            await self.backend.control(ep, "load", model, max(self.spec.load_timeout_s, self.backend.spec.timeout_s))
        except GatewayError as exc:
            places.load_failed(address, model)
            outcome = "timeout" if isinstance(exc, UpstreamTimeout) else "failed"
            self.events.loaded(self.backend.name, outcome, time.monotonic() - start)
            log.warning("backend '%s': loading '%s' on %s failed: %s", self.backend.name, model, address, exc.message)
            raise
        seconds = time.monotonic() - start
        places.loaded(address, model, time.monotonic(), ours=True)
        ep.health.placed(model, time.monotonic())
        self.events.loaded(self.backend.name, "ok", seconds)
        log.info("backend '%s': loaded '%s' on %s in %.2f s", self.backend.name, model, address, seconds)
        self.holds.wake(model)
        if unknown:
            await places.settle(ep, model)

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
                    usages[address] = await self.places.usage(ep)
                usage = usages[address]
                idle_ms = None if usage is None else now_ms - self.places.last_used(address, model, usage)
                if idle_ms is not None and idle_ms >= spec.copy_idle_s * 1000:
                    await self.places.unload(ep, model, "idle_copy")

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
