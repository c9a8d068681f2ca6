"""Requests that wait for their model (a route's ``hold_s``, a placement backend's ``placement``):
whether a request of a route waits and counts as its model's demand, the wait itself, and whether
a request that found its model gone may have it placed again. Used by the proxy and its stream
path alike (backends/holds.py holds the waiting requests, backends/placement.py loads models)."""
from __future__ import annotations

from typing import Any

from .backends.base import Backend
from .routing.table import Match

__all__ = ["hold", "holding", "placed_again"]


def holding(backend: Backend[Any], match: Match) -> bool:
    """Requests of this route wait for their model (and count as its demand)."""
    return match.split is None and (backend.placer is not None or match.hold_s > 0)


async def hold(backend: Backend[Any], match: Match, model: str, version: str) -> None:
    """A model ready nowhere yet: wait for it (the route's ``hold_s``), loading it first in a
    placement backend. Returns at once when it is ready somewhere."""
    holds = backend.holds
    if holds is None or holds.ready(model, version):
        return
    placer = backend.placer
    if placer is not None:
        await placer.ensure(model, version, match.label)
    elif match.hold_s:
        await holds.wait(model, version, match.label, match.hold_s)


def placed_again(backend: Backend[Any], model: str, version: str) -> bool:
    """A request of a placement backend found its model gone from where it was (no endpoint
    could take it): it is ready nowhere now, so placement may load it again."""
    holds = backend.holds
    return backend.placer is not None and holds is not None and not holds.ready(model, version)
