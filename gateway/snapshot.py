"""What a request is routed with: the route table and the backends, one immutable snapshot that a
reload replaces whole (``Routing``), and the (route, backend) a request was routed to, noted for
its metrics (``ROUTED``).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .backends.base import Backend
from .backends.grpc import GrpcBackend
from .backends.http import HttpBackend
from .config.schema import BackendSpec, GatewayConfig
from .dataplane import RouteLabel
from .routing.table import STATEFUL, Match, RouteTable

__all__ = ["BACKEND_KINDS", "ROUTED", "Routing", "build_backend"]

# The (route pattern, backend) the current request was routed to: one request per task (the
# listeners run each in its own), read back by Proxy.route_label for its metrics.
ROUTED: ContextVar[RouteLabel | None] = ContextVar("oip_gateway_chosen_route", default=None)

# The backend class for each ``protocol`` of the config.
BACKEND_KINDS: dict[str, type[Backend[Any]]] = {"http": HttpBackend, "grpc": GrpcBackend}


def build_backend(backend: BackendSpec) -> Backend[Any]:
    return BACKEND_KINDS[backend.protocol](backend)


@dataclass(frozen=True, slots=True)
class Routing:
    """What a request is routed with: replaced whole on a reload, never changed in place."""

    config: GatewayConfig
    table: RouteTable
    backends: Mapping[str, Backend[Any]]

    def backend(self, model: str, version: str, headers: Mapping[str, str] | None = None,
                affinity: str | None = None) -> Backend[Any]:
        return self.pick(model, version, headers, affinity)[0]

    def pick(self, model: str, version: str, headers: Mapping[str, str] | None = None,
             affinity: str | None = None) -> tuple[Backend[Any], Match]:
        """The backend for one request (a split's side chosen now) and its route. The
        (route, backend) pair is noted for this request's metrics (``ROUTED``)."""
        match = self.table.resolve(model, version, headers)
        if match.stateful is not STATEFUL.get():  # (a get is cheaper than a set: most routes are not)
            STATEFUL.set(match.stateful)
        if match.split is None:  # (choose's common case, inlined: every inference passes here)
            ROUTED.set((match.label, match.backend))
            return self.backends[match.backend], match
        return self.choose(match, model, version, affinity)

    def choose(self, match: Match, model: str, version: str, affinity: str | None = None) -> tuple[Backend[Any], Match]:
        """``pick`` for a route already resolved."""
        name = match.backend if match.split is None else \
            match.pick(lambda n: self.backends[n].can_take(model, version), affinity)
        if match.stateful is not STATEFUL.get():
            STATEFUL.set(match.stateful)
        ROUTED.set((match.label, name))
        return self.backends[name], match

    def other_side(self, match: Match, failed: Backend[Any], model: str, version: str,
                   affinity: str | None) -> Backend[Any] | None:
        """A split's side answered that nothing could take the request (no endpoint had the
        model ready after all — the checker had not seen it go yet): another side that can
        takes it, as its share would have gone there (noted in ``ROUTED``). None when there is
        none."""
        assert match.split is not None
        backends = self.backends
        name = match.split.choose(lambda n: n != failed.name and backends[n].can_take(model, version), affinity)
        if name == failed.name or not backends[name].can_take(model, version):
            return None
        ROUTED.set((match.label, name))
        return backends[name]

    def backends_of(self, model: str, version: str = "") -> list[Backend[Any]]:
        """Every backend of the model's route (all sides of a split): model control,
        statistics and per-model settings go to each."""
        match = self.table.resolve(model, version)
        return [self.backends[n] for n in (match.split.names if match.split is not None else (match.backend,))]
