"""Route table: model name (+ optional version) → backend name.

Exact model names resolve through one dict lookup, so a request costs the same
with 10,000 routes as with one. Glob routes are tried in config order only
when no exact route names the model. Within one model name, routes are tried
in config order: the first whose version is unset or equal to the requested
version, and whose headers (if any) the request carries, wins — so header routes
(a variant picked by a header) come before the route without headers. A match
names one backend, or a weighted split of several (``split.py``). No I/O, no asyncio.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from ..config.schema import Mirror, Route
from ..config.security import Rate
from ..errors import ModelNotFound
from .split import WeightedSplit

__all__ = ["STATEFUL", "Match", "RouteTable"]

# Whether the request being handled is on a ``stateful`` route: set with its route (proxy.py,
# every inference), read by the backends when they decide whether a request may be sent again.
STATEFUL: ContextVar[bool] = ContextVar("oip_gateway_stateful_route", default=False)


@dataclass(frozen=True, slots=True)
class Match:
    backend: str  # the backend's name; for a split, the first side's (see ``pick``)
    label: str  # the route's model pattern: a bounded label for metrics
    split: WeightedSplit | None = None
    headers: tuple[tuple[str, str], ...] = ()
    mirror: Mirror | None = None
    auth: bool | None = None  # the route's ``auth`` (security/guard.py)
    rate: Rate | None = None  # the route's per-model rate limit
    stateful: bool = False  # the route's ``stateful``: no request of it is ever sent twice
    hold_s: float = 0.0  # the route's ``hold_s``: how long a request waits for a model ready nowhere yet

    def takes(self, headers: Mapping[str, str] | None) -> bool:
        """The request carries every header this route asks for."""
        return not self.headers or (headers is not None and all(headers.get(k) == v for k, v in self.headers))

    def pick(self, eligible: Callable[[str], bool], affinity: str | None = None) -> str:
        """The backend's name for one request: the route's, or a side of the split."""
        return self.backend if self.split is None else self.split.choose(eligible, affinity)


class RouteTable:
    __slots__ = ("_cache", "_cache_max", "_exact", "_globs", "by_headers")

    def __init__(self, routes: tuple[Route, ...], *, cache_max: int = 4096) -> None:
        self._exact: dict[str, list[tuple[str | None, Match]]] = {}
        self._globs: list[tuple[re.Pattern[str], str | None, Match]] = []
        for r in routes:
            split = WeightedSplit([s.backend for s in r.split], [s.weight for s in r.split]) if r.split else None
            m = Match(backend=r.backend, label=r.model, split=split, headers=r.headers, mirror=r.mirror,
                      auth=r.auth, rate=r.rate, stateful=r.stateful, hold_s=r.hold_s)
            if r.is_glob:
                self._globs.append((re.compile(fnmatch.translate(r.model)), r.version, m))
            else:
                self._exact.setdefault(r.model, []).append((r.version, m))
        # Glob results are cached per (model, version): a per-process cache of a
        # pure function, bounded so that clients sending random names cannot grow it.
        self._cache: dict[tuple[str, str], tuple[Match, ...]] = {}
        self._cache_max = cache_max
        # Some route asks for request headers: only then does resolve need them.
        self.by_headers = any(r.headers for r in routes)

    @property
    def exact_models(self) -> list[tuple[str, str | None]]:
        """(model, version) of every exact route: what server readiness waits for."""
        return [(name, v) for name, entries in self._exact.items() for v, _ in entries]

    def resolve(self, model: str, version: str = "", headers: Mapping[str, str] | None = None) -> Match:
        """The first route (config order) for ``model`` whose version is unset or equal and
        whose headers the request carries (``headers``: lower-case names, HTTP headers or
        gRPC metadata; None: none)."""
        entries = self._exact.get(model)
        if entries is not None:
            for want, match in entries:
                # (takes() called only for a route with headers: one call less per request)
                if (want is None or want == version) and (not match.headers or match.takes(headers)):
                    return match
            raise ModelNotFound(f"Request for unknown model: '{model}' version {version or '(none)'} is not routed")
        key = (model, version)
        try:
            hits = self._cache[key]
        except KeyError:
            hits = self._glob(model, version)
            if len(self._cache) >= self._cache_max:
                self._cache.clear()
            self._cache[key] = hits
        for match in hits:
            if match.takes(headers):
                return match
        raise ModelNotFound(f"Request for unknown model: '{model}' is not routed")

    def _glob(self, model: str, version: str) -> tuple[Match, ...]:
        return tuple(match for pattern, want, match in self._globs
                     if pattern.match(model) and (want is None or want == version))
