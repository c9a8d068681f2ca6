"""Composition root: builds the gateway from its config and serves it (:class:`Gateway`): the
routing snapshot, the backends, health, discovery, queue scraping and placement, the metrics,
and the listeners (``listeners.py``); reload swaps the snapshot, stop drains.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from .config.loader import read_config
from .config.schema import BackendSpec, GatewayConfig, HostPort, Peers
from .errors import ConfigError, GatewayError
from .malloc import IdleTrimmer, large_answer_at
from .memlimit import auto_inflight_limit
from .rawbody import release_buffers
from .observability.metrics import Metrics
from .proxy import Proxy
from .snapshot import Routing, build_backend
from .routing.table import RouteTable
from .backends.base import Backend
from .backends.discovery import Discovery
from .backends.health import HealthChecker
from .backends.holds import Holds
from .backends.placement import Placer
from .peers import PeerSet, peers_app
from .listeners import Listeners, Ports
from .backends.queue import QueueScraper

__all__ = ["Gateway", "exact_routes", "wait_for_signal"]

log = logging.getLogger("oip_gateway")


async def wait_for_signal() -> None:
    """Return on SIGTERM or SIGINT: the process owner's cue to drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def exact_routes(config: GatewayConfig) -> list[tuple[str, str | None, str, int]]:
    """What the health checker checks: every backend of every exact route (a split's sides
    share the route's group: ready when one is), and mirrors' shadow backends and placement
    pools (group -1: checked, so they know the model, never required for readiness)."""
    out: list[tuple[str, str | None, str, int]] = []
    for i, r in enumerate(config.routes):
        if r.is_glob:
            continue
        # A placement pool loads its models when asked: they are checked, never required.
        out += [(r.model, r.version, b, -1 if config.backends[b].placement is not None else i)
                for b in r.backends if b in config.backends]
        if r.mirror is not None:
            out.append((r.model, r.version, r.mirror.backend, -1))
    return out


# Requests held per model for a route's hold_s on a backend without placement (which has its own).
HOLD_QUEUE = 64


class Gateway:
    """One gateway process: backends, discovery, health checks, proxy and listeners.

    ``reload`` applies a new config atomically: backends whose config is unchanged are
    kept as they are; a changed one is built anew and adopts the endpoints it
    keeps (connections, health state); then one assignment swaps the routing, so
    requests in flight finish on the backends they started on, and backends no longer used
    close once those are done. Listener settings (ports, TLS, workers) take a restart.
    """

    def __init__(self, config: GatewayConfig, *, registry: CollectorRegistry | None = None,
                 reuse_port: bool = False, quiet_reload_errors: bool = False,
                 memory_limit: int | None = None, workers: int = 1,
                 peers_port: HostPort | None = None, serves_peers: bool = True) -> None:
        """``memory_limit``: the limit the process runs under (memlimit.py), which sizes
        admission control when the config leaves ``max_inflight_bytes`` unset. With --workers,
        ``peers_port``: the placement port the supervisor holds (worker 0's, ``serves_peers``;
        the other workers ask it: gateway/peers.py)."""
        self.config = config
        self.peers_port = peers_port if peers_port is not None else config.listen.peers
        self.serves_peers = serves_peers and self.peers_port is not None
        self.peers: PeerSet | None = self._peer_set(config)
        # A worker's supervisor checks the file and logs its problems: the workers do not repeat them.
        self._reload_error_level = logging.DEBUG if quiet_reload_errors else logging.ERROR
        self.metrics = Metrics(registry, access_log=config.access_log, access_sample=config.access_log_sample)
        backends = {name: self._backend(spec) for name, spec in config.backends.items()}
        routing = Routing(config, RouteTable(config.routes), backends)
        self.health = HealthChecker(
            backends,
            exact_routes(config),
            interval_s=config.health.interval_s,
            timeout_s=config.health.timeout_s,
            on_round=self._record_health,
            unhealthy_threshold=config.health.unhealthy_threshold,
            healthy_threshold=config.health.healthy_threshold,
        )
        self.discovery = Discovery(config.dns)
        self.auto_inflight = auto_inflight_limit(memory_limit, workers)
        self.proxy = Proxy(routing, self.health, self.metrics, self.auto_inflight)
        # Freed large buffers go back to the system once large requests have gone quiet.
        self.trimmer = IdleTrimmer(lambda: max(self.proxy.admission.large_at, large_answer_at()),
                                   busy=lambda: self.proxy.admission.large_inflight > 0, release=release_buffers)
        self._trimmer: asyncio.Task[None] | None = None
        self.listeners = Listeners(self.proxy, config.max_message_bytes, self.proxy.gate, self.metrics,
                                   reuse_port=reuse_port,
                                   max_json_depth=config.max_json_depth, max_header_count=config.max_header_count,
                                   max_header_bytes=config.max_header_bytes, limits=config.limits,
                                   tls=config.listen.tls)
        self._reloading = asyncio.Lock()
        # SHA-256 of the config file content last loaded or refused (set by the caller
        # that read the first one): what a file watch compares a change against.
        self.config_digest: bytes | None = None
        # (live, ejected) per (backend, endpoint) as last set on the endpoint gauges.
        self._endpoint_states: dict[tuple[str, str], tuple[bool, bool]] = {}
        self._route_states: dict[tuple[str, str], bool] = {}  # as last set on the route_ready gauges
        self._event_children: dict[tuple[str, str], Any] = {}
        # The hold, demand and copies gauges as last set (set when they change).
        self._waiting_shown: dict[tuple[str, str], int] = {}
        self._demand_shown: dict[tuple[str, str], int] = {}
        self._copies_shown: dict[tuple[str, str], int] = {}

    def _backend(self, spec: BackendSpec) -> Backend[Any]:
        backend = build_backend(spec)
        backend.on_event = functools.partial(self._backend_event, spec.name)
        if spec.balance == "least_queue":
            backend.background.append(QueueScraper(backend, self._scraped))
        placement = spec.placement
        backend.holds = Holds(backend, placement.queue if placement is not None else HOLD_QUEUE, self.metrics,
                              placing=placement is not None)
        if placement is not None:
            backend.placer = Placer(backend, placement, backend.holds, self.metrics,
                                    functools.partial(self._routes_to, spec.name))
            backend.placer.peers = self.peers
            backend.background.append(backend.placer)
        return backend

    def _routes_to(self, backend: str, model: str) -> bool:
        """A route sends ``model`` to ``backend`` (placement unloads only such models)."""
        try:
            return any(b.name == backend for b in self.proxy.routing.backends_of(model))
        except GatewayError:
            return False

    def _scraped(self, backend: str, ok: bool, seconds: float) -> None:
        self.metrics.queue_scrapes.labels(backend, "ok" if ok else "failed").inc()
        if seconds:
            self.metrics.queue_scrape_seconds.labels(backend).inc(seconds)

    def _backend_event(self, name: str, kind: str) -> None:
        """A backend's event: a conversion (per request: the metric child is cached) or a
        retry / ejection."""
        child = self._event_children.get((name, kind))
        if child is None:
            if kind in ("http_to_grpc", "grpc_to_http"):
                child = self.metrics.conversions.labels(name, kind)
            else:
                child = self.metrics.backend_event(name, kind)
            self._event_children[(name, kind)] = child
        child.inc()

    @property
    def backends(self) -> Mapping[str, Backend[Any]]:
        return self.proxy.routing.backends

    def _record_health(self, checker: HealthChecker) -> None:
        shown: dict[tuple[str, str], tuple[bool, bool]] = {}
        before = self._endpoint_states
        for backend in self.backends.values():
            for ep in backend.endpoints.values():
                key = (backend.name, str(ep.address))
                now = shown[key] = (ep.health.live is True, ep.health.ejected_until is not None)
                if before.get(key) != now:  # gauges set when they change, not every round
                    self.metrics.endpoint_healthy.labels(*key).set(1 if now[0] else 0)
                    self.metrics.endpoint_ejected.labels(*key).set(1 if now[1] else 0)
        for key in before.keys() - shown.keys():  # endpoints gone (DNS, reload): their series go too
            for gauge in (self.metrics.endpoint_healthy, self.metrics.endpoint_ejected):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
        self._endpoint_states = shown
        states = checker.route_states
        if states is not self._route_states:  # (the checker makes a new dict only when something moved)
            shown_routes = self._route_states
            for key, ok in states.items():
                if shown_routes.get(key) is not ok:
                    self.metrics.route_ready.labels(*key).set(1 if ok else 0)
            for key in shown_routes.keys() - states.keys():  # routes a reload removed
                with contextlib.suppress(KeyError):
                    self.metrics.route_ready.remove(*key)
            self._route_states = states
        self.metrics.ready.set(1 if checker.ready else 0)
        self._record_holds()

    def _record_holds(self) -> None:
        """Each round: wake held requests whose model is ready now, let placement pools do their
        round (placement.py ``maintain``), and set the hold and demand gauges that changed."""
        waiting: dict[tuple[str, str], int] = {}
        demand: dict[tuple[str, str], int] = {}
        copies: dict[tuple[str, str], int] = {}
        for backend in self.backends.values():
            holds = backend.holds
            if holds is None:
                continue
            if backend.placer is not None:
                backend.placer.maintain()
                for model in backend.placer.placed_models():
                    copies[(backend.name, model)] = backend.placer.copies(model)
            elif holds.waiting:
                holds.recheck()
            for route, n in holds.by_route.items():
                waiting[(route, backend.name)] = n
            for route, n in holds.inflight_by_route.items():
                demand[(route, backend.name)] = n
        for shown, now, gauge in ((self._waiting_shown, waiting, self.metrics.hold_waiting),
                                  (self._demand_shown, demand, self.metrics.route_demand),
                                  (self._copies_shown, copies, self.metrics.placement_copies)):
            for key, n in now.items():
                if shown.get(key) != n:
                    gauge.labels(*key).set(n)
            for key in shown.keys() - now.keys():
                if gauge is self.metrics.placement_copies and not self.metrics.multiprocess:
                    with contextlib.suppress(KeyError):
                        gauge.remove(*key)  # a model placed nowhere any more: its series goes
                else:
                    gauge.labels(*key).set(0)  # (an autoscaler reads 0, not a missing series)
            shown.clear()
            shown.update(now)

    async def start(
        self,
        *,
        http: HostPort | None = None,
        grpc: HostPort | None = None,
        serve_metrics: bool = True,
    ) -> Ports:
        """Start everything; ``http``/``grpc`` override the configured listeners (workers).
        Listeners open after the first DNS resolution and health round (each bounded),
        so the first requests already go only where their models are ready."""
        for backend in self.backends.values():
            await backend.start()
        self.discovery.update(self.backends, self.config.dns)
        await self.discovery.resolved(self.config.dns.timeout_s * 2)
        self.health.start()
        self._trimmer = asyncio.get_running_loop().create_task(self.trimmer.run())
        await self.health.first_round(self.config.health.timeout_s * 3)
        listen = self.config.listen
        if self.peers is not None:
            self.peers.start()
        ports = await self.listeners.start(
            http=http or listen.http,
            grpc=grpc or listen.grpc,
            metrics_addr=listen.metrics if serve_metrics else None,
            metrics_registry=self.metrics.registry,
            peers_addr=self.peers_port if self.serves_peers else None,
            peers=peers_app(lambda: self.backends) if self.serves_peers else None,
        )
        if self.serves_peers and ports.peers is not None and self.peers_port is not None:
            # (a port of 0 is known once bound: the peers list names this process by it)
            self.peers_port = HostPort(self.peers_port.host, ports.peers)
            if self.peers is not None:
                self.peers.own_port = ports.peers
        return ports

    async def reload(self, config: GatewayConfig) -> None:
        """Apply ``config`` (already validated) atomically."""
        async with self._reloading:
            await self._apply(config)

    async def _apply(self, config: GatewayConfig) -> None:
        old = self.proxy.routing
        fixed = ("listen", "workers", "max_message_bytes", "max_json_depth", "max_header_count", "max_header_bytes",
                 "limits")
        if any(getattr(config, k) != getattr(old.config, k) for k in fixed):
            log.warning("reload: %s take effect at the next restart", ", ".join(fixed))
        backends: dict[str, Backend[Any]] = {}
        for name, spec in config.backends.items():
            prev = old.backends.get(name)
            if prev is not None and prev.spec == spec:
                backends[name] = prev
                continue
            backend = self._backend(spec)
            if prev is not None:
                backend.adopt(prev)
            await backend.start()
            backends[name] = backend
        if config.peers != old.config.peers:
            await self._new_peers(config)
        for backend in backends.values():
            if backend.placer is not None:
                backend.placer.peers = self.peers
        routing = Routing(config, RouteTable(config.routes), backends)
        self.health.reconfigure(backends, exact_routes(config))
        self.health.interval_s = config.health.interval_s
        self.health.timeout_s = config.health.timeout_s
        self.health.unhealthy_threshold = config.health.unhealthy_threshold
        self.health.healthy_threshold = config.health.healthy_threshold
        self.discovery.update(backends, config.dns)
        self.proxy.swap(routing)
        self.config = config
        for name, prev in old.backends.items():
            if backends.get(name) is not prev:
                prev.retire()  # closes once the requests in flight on it are done
        log.info("config reloaded: %d backends, %d routes", len(config.backends), len(config.routes))

    async def _new_peers(self, config: GatewayConfig) -> None:
        """A reload changed the top-level ``peers``: who decides is computed from the new list."""
        before = self.peers
        self.peers = self._peer_set(config)
        if self.peers is not None:
            self.peers.start()
        if before is not None:
            await before.stop()

    def _peer_set(self, config: GatewayConfig) -> PeerSet | None:
        """The replicas placement coordinates with: the config's ``peers``, or (a --workers worker
        that does not serve the peers port) worker 0 on the loopback port the supervisor holds."""
        known = config.peers
        if known is None and self.peers_port is not None and not self.serves_peers:
            known = Peers(addresses=(HostPort("127.0.0.1", self.peers_port.port),))
        if known is None:
            return None
        return PeerSet(known, self.peers_port if self.serves_peers else None, config.dns)

    async def reload_file(self, path: str, *, if_changed: bool = False) -> bool:
        """Load, validate and apply ``path``. An invalid file changes nothing: one log
        line names its problems, and the reload metrics count the failure. ``if_changed``
        (a watched file changed): skip content already loaded or refused — the last
        content seen is remembered whichever way it came (SIGHUP or the watch)."""
        async with self._reloading:  # loads and applies in signal order
            unless = self.config_digest if if_changed else None
            try:
                config, digest = await asyncio.get_running_loop().run_in_executor(None, read_config, path, unless)
            except ConfigError as exc:
                if unless is not None and exc.digest == unless:
                    return False  # the same invalid content, already refused once
                self.config_digest = exc.digest
                log.log(self._reload_error_level, "config reload refused, still serving the previous config: %s",
                        "; ".join(exc.problems))
                self.metrics.config_reloaded(False)
                return False
            if config is None:
                return True  # unchanged
            self.config_digest = digest
            await self._apply(config)
        self.metrics.config_reloaded(True)
        return True

    async def stop(self) -> None:
        if self.config.drain_s > 0:
            # Readiness goes false first; requests keep being served until the load
            # balancer has noticed, then the listeners close (in-flight ones finish).
            self.proxy.draining = True
            self.metrics.ready.set(0)
            log.warning("draining: not ready, serving for %.1f s more", self.config.drain_s)
            await asyncio.sleep(self.config.drain_s)
        await self.listeners.stop()
        if self.peers is not None:
            await self.peers.stop()
        await self.discovery.stop()
        await self.health.stop()
        if self._trimmer is not None:
            self._trimmer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trimmer
        for backend in self.backends.values():
            await backend.close()
