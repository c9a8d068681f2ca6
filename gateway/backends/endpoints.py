"""The endpoint set of a backend: one :class:`Endpoint` per address, static or found by DNS discovery.

Endpoints come and go (``set_dns_addresses``) without disturbing requests in flight on them: a
removed one retires once they are done. On a config reload a new backend adopts the endpoints
(connections, health state) of the old one that it keeps (``adopt``). What a backend does with
its endpoints — choice, safe retries, ejection — is :class:`~.base.Backend`'s (base.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar

from ..config.schema import BackendSpec, HostPort
from ..routing.readiness import EndpointHealth, Generation

__all__ = ["E", "Endpoint", "EndpointSet"]

log = logging.getLogger("oip_gateway.backend")


class Endpoint:
    """One address of a backend and what is known of its health."""

    __slots__ = ("address", "health", "queue")

    def __init__(self, address: HostPort) -> None:
        self.address = address
        self.health = EndpointHealth()
        # least_queue: Triton's pending requests per (model, version) — and per (model, "")
        # summed over versions — as last scraped; None when its metrics cannot be read.
        self.queue: dict[tuple[str, str], float] | None = None

    @property
    def inflight(self) -> int:
        raise NotImplementedError

    async def close(self) -> None:
        """Stop using the endpoint; requests in flight on it finish first."""
        raise NotImplementedError


E = TypeVar("E", bound=Endpoint)

# BackendSpec fields that an endpoint's connections depend on: a reloaded backend keeps an
# endpoint (its connections and health state) only when these are unchanged.
_TRANSPORT_FIELDS = ("protocol", "tls", "connect_timeout_s", "max_connections", "max_message_bytes",
                     "max_answer_header_count", "max_answer_head_bytes")


class EndpointSet(Generic[E]):
    """The endpoints of one backend (config ``backends``) as its addresses come and go: what
    :class:`~.base.Backend` chooses from."""

    # The protocol the endpoints speak (Backend's; a reloaded backend adopts only endpoints of its own).
    protocol: ClassVar[str]

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.endpoints: dict[HostPort, E] = {}
        # Bumped by every change of what decides where a request may go (endpoint health,
        # the endpoint set, ``routed``); the eligible endpoints per model are cached against it.
        self._gen = Generation()
        # Called when endpoints appear, so the health checker looks at them at once.
        self.on_new_endpoints: Callable[[], None] | None = None
        self._dns: frozenset[HostPort] = frozenset()
        self._started = False
        # Work that lives as long as the backend (least_queue's scraper): start() / async stop().
        self.background: list[Any] = []
        self._closing: set[asyncio.Task[None]] = set()  # removed endpoints finishing their requests

    def _make(self, address: HostPort) -> E:
        raise NotImplementedError

    def _own(self, ep: E) -> E:
        ep.health.gen = self._gen  # its health changes now invalidate this backend's choices
        self._gen.n += 1
        return ep

    async def start(self) -> None:
        """Create the static endpoints (inside the running loop: grpc.aio binds to it)."""
        self._started = True
        self._apply(self._dns)
        for job in self.background:
            job.start()

    def set_dns_addresses(self, addresses: Iterable[HostPort]) -> None:
        """What DNS discovery resolved now: added endpoints are created (and take traffic
        once checked ready), removed ones retire after their requests in flight."""
        self._dns = frozenset(addresses)
        if self._started:
            self._apply(self._dns)

    def _apply(self, dns: frozenset[HostPort]) -> None:
        wanted = list(dict.fromkeys([*self.spec.endpoints, *sorted(dns, key=str)]))
        added = False
        for addr in wanted:
            if addr not in self.endpoints:
                self.endpoints[addr] = self._own(self._make(addr))
                added = True
        for addr in [a for a in self.endpoints if a not in wanted]:
            log.info("backend '%s': endpoint %s removed", self.name, addr)
            self._retire(self.endpoints.pop(addr))
            self._gen.n += 1
        if added and self.on_new_endpoints is not None:
            self.on_new_endpoints()

    @property
    def generation(self) -> int:
        """Moves whenever anything that decides where a request may go changes (the health
        checker recomputes the gateway's readiness only then)."""
        return self._gen.n

    def adopt(self, old: EndpointSet[Any]) -> None:
        """Take over ``old``'s endpoints that this backend also has (hot reload): their
        connections and health state carry over; ``old`` no longer owns them."""
        if old.protocol != self.protocol or any(
                getattr(old.spec, f) != getattr(self.spec, f) for f in _TRANSPORT_FIELDS):
            return
        self._dns = old._dns if self.spec.dns == old.spec.dns else self._dns
        for addr in list(old.endpoints):
            if addr in self.spec.endpoints or addr in self._dns:
                self.endpoints[addr] = self._own(old.endpoints.pop(addr))
                old._gen.n += 1

    def _retire(self, ep: Endpoint) -> None:
        task = asyncio.ensure_future(ep.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def retire(self) -> None:
        """The backend is no longer routed to (a reload): its endpoints close in the
        background once the requests in flight on them are done."""
        for ep in self.endpoints.values():
            self._retire(ep)
        self.endpoints.clear()
        self._gen.n += 1
        for job in self.background:
            task = asyncio.ensure_future(job.stop())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every endpoint still owned; requests in flight finish first."""
        eps = list(self.endpoints.values())
        self.endpoints.clear()
        self._gen.n += 1
        for job in self.background:
            await job.stop()
        for ep in eps:
            await ep.close()
