"""DNS discovery: backends that list ``dns:`` endpoints follow what those names
resolve to (every A/AAAA record is an endpoint on the given port — a Kubernetes
headless Service gives one record per ready pod).

Each such backend has one task that re-resolves its names every ``dns.refresh_s``
through an asyncio resolver (``dns.py``; never getaddrinfo on the loop) and hands
the union to ``Backend.set_dns_addresses``: new endpoints take traffic once the health
checker has seen their models ready, removed ones finish the requests in flight
on them. A name that fails to resolve (timeout, SERVFAIL) keeps its last known
addresses — a DNS hiccup must not empty a backend; a name that resolves to nothing
(NXDOMAIN, no records) has no endpoints, as Envoy's STRICT_DNS does.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ..config.schema import Dns, HostPort
from .base import Backend
from .dns import DnsFailure, DnsResolver

__all__ = ["Discovery"]

log = logging.getLogger("oip_gateway.discovery")


class Discovery:
    def __init__(self, config: Dns) -> None:
        self._config = config
        self._resolver = _resolver(config)
        self._tasks: dict[int, asyncio.Task[None]] = {}  # id(backend) -> its task
        self._first: dict[int, asyncio.Event] = {}

    def update(self, backends: Mapping[str, Backend[Any]], config: Dns) -> None:
        """Follow the DNS names of ``backends`` (a start or a reload): tasks of backends
        no longer in use stop, backends new to discovery get one."""
        if config != self._config:
            self._config = config
            self._resolver = _resolver(config)
            for task in self._tasks.values():
                task.cancel()
            self._tasks.clear()
            self._first.clear()
        wanted = {id(p): p for p in backends.values() if p.spec.dns}
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
            self._first.pop(key, None)
        for key, backend in wanted.items():
            if key not in self._tasks:
                self._first[key] = asyncio.Event()
                self._tasks[key] = asyncio.get_running_loop().create_task(self._follow(backend, self._first[key]))

    async def resolved(self, timeout: float) -> None:
        """Wait (bounded) until every followed backend has had its first resolution."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._first.values())), timeout)

    async def _follow(self, backend: Backend[Any], first: asyncio.Event) -> None:
        known: dict[HostPort, tuple[HostPort, ...]] = {}
        while True:
            for name in backend.spec.dns:
                try:
                    found = tuple(HostPort(ip, name.port) for ip in await self._resolver.resolve(name.host))
                except DnsFailure as exc:
                    log.warning("backend '%s': %s; keeping %d known addresses", backend.name, exc,
                                len(known.get(name, ())))
                    continue
                if found != known.get(name):
                    log.info("backend '%s': %s resolves to %s", backend.name, name,
                             ", ".join(map(str, found)) or "nothing")
                known[name] = found
            backend.set_dns_addresses(a for addrs in known.values() for a in addrs)
            first.set()
            await asyncio.sleep(self._config.refresh_s)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _resolver(config: Dns) -> DnsResolver:
    servers = [(ns.host, ns.port) for ns in config.nameservers] or None
    return DnsResolver(servers, timeout_s=config.timeout_s)
