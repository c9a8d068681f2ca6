"""What a request is routed with: the route table and the pools, one immutable snapshot that a
reload replaces whole (``Routing``), and the (route, pool) a request was routed to, noted for
its metrics (``ROUTED``).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .config.schema import Backend, GatewayConfig
from .dataplane import RouteLabel
from .routing.table import STATEFUL, Match, RouteTable
from .upstream.grpc import GrpcPool
from .upstream.http import HttpPool
from .upstream.pool import Pool

__all__ = ["ROUTED", "POOL_KINDS", "Routing", "build_pool"]

# The (route pattern, pool) the current request was routed to: one request per task (the
# listeners run each in its own), read back by Proxy.route_label for its metrics.
ROUTED: ContextVar[RouteLabel | None] = ContextVar("oip_gateway_chosen_route", default=None)

# The pool class for each ``protocol`` of the config.
POOL_KINDS: dict[str, type[Pool[Any]]] = {"http": HttpPool, "grpc": GrpcPool}


def build_pool(backend: Backend) -> Pool[Any]:
    return POOL_KINDS[backend.protocol](backend)


@dataclass(frozen=True, slots=True)
class Routing:
    """What a request is routed with: replaced whole on a reload, never changed in place."""

    config: GatewayConfig
    table: RouteTable
    pools: Mapping[str, Pool[Any]]

    def pool(self, model: str, version: str, headers: Mapping[str, str] | None = None,
             affinity: str | None = None) -> Pool[Any]:
        return self.pick(model, version, headers, affinity)[0]

    def pick(self, model: str, version: str, headers: Mapping[str, str] | None = None,
             affinity: str | None = None) -> tuple[Pool[Any], Match]:
        """The pool for one request (a split's side chosen now) and its route. The
        (route, pool) pair is noted for this request's metrics (``ROUTED``)."""
        match = self.table.resolve(model, version, headers)
        if match.stateful is not STATEFUL.get():  # (a get is cheaper than a set: most routes are not)
            STATEFUL.set(match.stateful)
        if match.split is None:  # (choose's common case, inlined: every inference passes here)
            ROUTED.set((match.label, match.backend))
            return self.pools[match.backend], match
        return self.choose(match, model, version, affinity)

    def choose(self, match: Match, model: str, version: str, affinity: str | None = None) -> tuple[Pool[Any], Match]:
        """``pick`` for a route already resolved."""
        name = match.backend if match.split is None else \
            match.pick(lambda n: self.pools[n].can_take(model, version), affinity)
        if match.stateful is not STATEFUL.get():
            STATEFUL.set(match.stateful)
        ROUTED.set((match.label, name))
        return self.pools[name], match

    def pools_of(self, model: str, version: str = "") -> list[Pool[Any]]:
        """Every pool of the model's route (all sides of a split): model control,
        statistics and per-model settings go to each."""
        match = self.table.resolve(model, version)
        return [self.pools[n] for n in (match.split.names if match.split is not None else (match.backend,))]
