"""Route table: model name (+ optional version) → backend pool name.

Exact model names resolve through one dict lookup, so a request costs the same
with 10,000 routes as with one. Glob routes are tried in config order only
when no exact route names the model. Within one model name, routes are tried
in config order: the first whose version is unset or equal to the requested
version wins. No I/O, no asyncio.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..config.schema import Route
from ..errors import ModelNotFound

__all__ = ["Match", "RouteTable"]


@dataclass(frozen=True, slots=True)
class Match:
    backend: str
    label: str  # the route's model pattern: a bounded label for metrics


class RouteTable:
    __slots__ = ("_cache", "_cache_max", "_exact", "_globs")

    def __init__(self, routes: tuple[Route, ...], *, cache_max: int = 4096) -> None:
        self._exact: dict[str, list[tuple[str | None, Match]]] = {}
        self._globs: list[tuple[re.Pattern[str], str | None, Match]] = []
        for r in routes:
            m = Match(backend=r.backend, label=r.model)
            if r.is_glob:
                self._globs.append((re.compile(fnmatch.translate(r.model)), r.version, m))
            else:
                self._exact.setdefault(r.model, []).append((r.version, m))
        # Glob results are cached per (model, version): a per-process cache of a
        # pure function, bounded so that clients sending random names cannot grow it.
        self._cache: dict[tuple[str, str], Match | None] = {}
        self._cache_max = cache_max

    @property
    def exact_models(self) -> list[tuple[str, str | None]]:
        """(model, version) of every exact route: what server readiness waits for."""
        return [(name, v) for name, entries in self._exact.items() for v, _ in entries]

    def resolve(self, model: str, version: str = "") -> Match:
        entries = self._exact.get(model)
        if entries is not None:
            for want, match in entries:
                if want is None or want == version:
                    return match
            raise ModelNotFound(f"Request for unknown model: '{model}' version {version or '(none)'} is not routed")
        key = (model, version)
        try:
            hit = self._cache[key]
        except KeyError:
            hit = self._glob(model, version)
            if len(self._cache) >= self._cache_max:
                self._cache.clear()
            self._cache[key] = hit
        if hit is None:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not routed")
        return hit

    def _glob(self, model: str, version: str) -> Match | None:
        for pattern, want, match in self._globs:
            if pattern.match(model) and (want is None or want == version):
                return match
        return None
