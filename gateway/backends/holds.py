"""Requests for a model that is ready nowhere yet, held in a bounded queue per model until a
health round (or a load) finds it ready: every backend whose routes set ``hold_s``, and every
placement pool (``placement.py``), which also loads the model meanwhile."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from ..errors import ModelNotReady, NoEndpointAvailable
from ..routing.readiness import Ready
from .base import Backend

__all__ = ["Holds", "NoRoom", "PlacementEvents", "not_ready"]


class PlacementEvents(Protocol):
    """What placement reports (observability/metrics.py implements it)."""

    def loaded(self, backend: str, outcome: str, seconds: float) -> None: ...
    def unloaded(self, backend: str, reason: str) -> None: ...
    def held(self, route: str, backend: str, seconds: float) -> None: ...
    def hold_refused(self, route: str, backend: str, reason: str) -> None: ...


class _Waiting:
    """The requests held for one model: how many, and the future they wait on."""

    __slots__ = ("count", "done", "since")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.count = 0
        self.done: asyncio.Future[None] = loop.create_future()
        self.since = time.monotonic()


def _ready_somewhere(backend: Backend[Any], model: str, version: str) -> bool:
    """Some endpoint may take the model now (a request would be sent, not refused)."""
    try:
        backend.eligible(model, version)  # (not candidates: a balancer's turn is a request's)
    except NoEndpointAvailable:  # (ModelNotReady included)
        return False
    return True


class Holds:
    """Requests waiting for a model that is ready nowhere yet, per backend: at most ``queue`` per
    model, each for at most its route's ``hold_s``; woken when a health round (or a load) finds
    the model ready."""

    def __init__(self, backend: Backend[Any], queue: int, events: PlacementEvents, *, placing: bool = False) -> None:
        self.backend = backend
        self.queue = queue
        self.events = events
        # A placement pool: "ready" means ready on a live endpoint — a model no endpoint has heard
        # of is loaded too (its absence from the repository is the server's own answer).
        self.placing = placing
        self._ready: dict[tuple[str, str], tuple[int, bool]] = {}
        self.waiting: dict[str, _Waiting] = {}
        # Requests waiting now per route, and in flight (held ones included) per model and per
        # route: a placement pool never evicts a model in use here; the demand gauges read them.
        self.by_route: dict[str, int] = {}
        self.inflight: dict[str, int] = {}
        self.inflight_by_route: dict[str, int] = {}

    def enter(self, model: str, route: str) -> None:
        self.inflight[model] = self.inflight.get(model, 0) + 1
        self.inflight_by_route[route] = self.inflight_by_route.get(route, 0) + 1

    def leave(self, model: str, route: str) -> None:
        n = self.inflight[model] - 1
        if n:
            self.inflight[model] = n
        else:
            del self.inflight[model]
        n = self.inflight_by_route[route] - 1
        if n:
            self.inflight_by_route[route] = n
        else:
            del self.inflight_by_route[route]

    def ready(self, model: str, version: str) -> bool:
        if not self.placing:
            return _ready_somewhere(self.backend, model, version)
        gen = self.backend.generation
        hit = self._ready.get((model, version))
        if hit is not None and hit[0] == gen:
            return hit[1]
        ok = False
        for ep in self.backend.endpoints.values():
            health = ep.health
            # (a version the endpoint lacks while it has the model: the server answers for it)
            if health.usable() and (health.ready_for(model, version) == Ready.YES
                                    or (version and health.lacks_version(model, version))):
                ok = True
                break
        if len(self._ready) >= 4096:  # clients choose model names: keep it bounded
            self._ready.clear()
        self._ready[(model, version)] = (gen, ok)
        return ok

    async def wait(self, model: str, version: str, route: str, timeout: float, why: str = "") -> None:
        """Wait until ``model`` is ready somewhere or ``timeout`` passes (ModelNotReady with
        Retry-After), holding a place of the model's bounded queue."""
        backend = self.backend
        entry = self.waiting.get(model)
        if entry is None:
            entry = self.waiting[model] = _Waiting(asyncio.get_running_loop())
        if entry.count >= self.queue:
            self.events.hold_refused(route, backend.name, "queue_full")
            raise not_ready(f"model '{model}' is not ready on backend '{backend.name}' and {entry.count} requests "
                             f"already wait for it (the queue's bound){why}; retry later", 2)
        entry.count += 1
        self.by_route[route] = self.by_route.get(route, 0) + 1
        start = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(entry.done), timeout)
        except NoRoom:
            self.events.hold_refused(route, backend.name, "no_room")
            raise
        except TimeoutError:
            self.events.hold_refused(route, backend.name, "timeout")
            raise not_ready(f"model '{model}' was not ready on any endpoint of backend '{backend.name}' within "
                             f"{timeout:g} s{why}; retry later", max(1, round(timeout))) from None
        finally:
            entry.count -= 1
            left = self.by_route[route] - 1
            if left:
                self.by_route[route] = left
            else:
                del self.by_route[route]
            if entry.count == 0 and self.waiting.get(model) is entry:
                del self.waiting[model]
            self.events.held(route, backend.name, time.monotonic() - start)

    def wake(self, model: str, error: BaseException | None = None) -> None:
        """``model`` is ready (or cannot be: ``error``): its waiting requests go on."""
        entry = self.waiting.pop(model, None)
        if entry is not None and not entry.done.done():
            if error is None:
                entry.done.set_result(None)
            else:
                entry.done.set_exception(error)
                entry.done.exception()  # (retrieved: no "never retrieved" warning with no waiter left)

    def recheck(self) -> None:
        """After a health round: wake the models now ready somewhere."""
        for model in [m for m in self.waiting if self.ready(m, "")]:
            self.wake(model)


class NoRoom(ModelNotReady):
    """Every endpoint that may take a model is full of models it may not evict (yet)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def not_ready(message: str, retry_after: int) -> ModelNotReady:
    """ModelNotReady with a Retry-After: a wait that may end well if tried again later."""
    err = ModelNotReady(message)
    err.retry_after = retry_after
    return err
