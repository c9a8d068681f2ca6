"""Prometheus metrics as an object built with a registry (no module globals).

Label values are bounded: ``route`` is the configured route pattern (or
``_unrouted``), never the model name a client typed, so random names cannot
grow the label set. docs/metrics.md documents every series.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..dataplane import UNROUTED, RouteLabel
from ..gcpolicy import grown
from .access import AccessLog, AccessRecord
from .loopmetrics import LoopCounter, LoopHistogram

__all__ = ["SERVER_LEVEL", "UNROUTED", "Counted", "Metrics", "Observer", "RouteLabel", "counting"]

# (route, backend) of a request: the matching route's model pattern and its backend.
SERVER_LEVEL: RouteLabel = ("", "")  # server live/ready/metadata: no route

REQUEST_LABELS = ["protocol", "api", "route", "backend", "code"]
REQUESTS_DOC = "Requests answered by the gateway."
REQUEST_SECONDS_DOC = "Time from request received to response sent."
REQUEST_BYTES_DOC = "Inference request body sizes."
UPSTREAM_SECONDS_DOC = "Time spent waiting for a backend."

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = tuple(float(4**i) for i in range(4, 15))  # 256 B .. 256 MiB


class Observer:
    """``observe(amount)`` of one labelled histogram child, for the per-request path."""

    __slots__ = ("observe",)

    def __init__(self, child: Any) -> None:
        self.observe: Callable[[float], None] = child.observe


class Counted:
    """``inc()`` of several labelled counter children at once (a series and its aliases)."""

    __slots__ = ("children",)

    def __init__(self, *children: Any) -> None:
        self.children = children

    def inc(self, amount: float = 1) -> None:
        for child in self.children:
            child.inc(amount)


def counting(child: Any) -> Callable[[], None]:
    """``inc()`` of one labelled counter child, for the per-request path."""
    inc: Callable[[], None] = child.inc
    return inc


_REFUSAL_REASONS = {"Unauthenticated": "unauthenticated", "PermissionDenied": "permission_denied",
                    "RateLimited": "rate_limited"}


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, access_log: bool = False,
                 access_sample: float = 1.0) -> None:
        # One JSON line per finished request (access.py), off by default: at tens of
        # thousands of requests per second a log line costs more than the proxying.
        self.access = AccessLog(access_sample) if access_log else None
        self._children: dict[tuple[str, str, RouteLabel, str | int], tuple[Callable[[], None], Observer]] = {}
        self._upstream: dict[str, Observer] = {}
        self._bytes_in: dict[str, Observer] = {}
        # prometheus_client's multiprocess mode (workers > 1, supervisor.py): each worker's
        # values live in files the supervisor reads, so a gauge cannot be a function.
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # The four recorded on every request: kept in plain numbers in one process
        # (loopmetrics.py says why), the library's own (file-backed) with several workers.
        if self.multiprocess:
            self.requests: Any = Counter(
                "oip_gateway_requests", REQUESTS_DOC, REQUEST_LABELS, registry=r)
            self.request_seconds: Any = Histogram(
                "oip_gateway_request_duration_seconds", REQUEST_SECONDS_DOC, REQUEST_LABELS[:-1],
                buckets=_LATENCY_BUCKETS, registry=r)
            self.request_bytes: Any = Histogram(
                "oip_gateway_request_body_bytes", REQUEST_BYTES_DOC, ["protocol"], buckets=_SIZE_BUCKETS, registry=r)
            self.upstream_seconds: Any = Histogram(
                "oip_gateway_upstream_duration_seconds", UPSTREAM_SECONDS_DOC, ["backend"],
                buckets=_LATENCY_BUCKETS, registry=r)
        else:
            self.requests = LoopCounter("oip_gateway_requests", REQUESTS_DOC, REQUEST_LABELS, r)
            self.request_seconds = LoopHistogram("oip_gateway_request_duration_seconds", REQUEST_SECONDS_DOC,
                                                 REQUEST_LABELS[:-1], _LATENCY_BUCKETS, r)
            self.request_bytes = LoopHistogram("oip_gateway_request_body_bytes", REQUEST_BYTES_DOC, ["protocol"],
                                               _SIZE_BUCKETS, r)
            self.upstream_seconds = LoopHistogram("oip_gateway_upstream_duration_seconds", UPSTREAM_SECONDS_DOC,
                                                  ["backend"], _LATENCY_BUCKETS, r)
        self.upstream_errors = Counter(
            "oip_gateway_upstream_errors", "Backend calls that failed, by kind.",
            ["backend", "kind"], registry=r,
        )
        self.endpoint_healthy = Gauge(
            "oip_gateway_endpoint_healthy", "1 when the last health check reached the endpoint.",
            ["backend", "endpoint"], registry=r, multiprocess_mode="max",
        )
        self.endpoint_ejected = Gauge(
            "oip_gateway_endpoint_ejected", "1 while passive outlier detection keeps the endpoint out.",
            ["backend", "endpoint"], registry=r, multiprocess_mode="max",
        )
        self.route_ready = Gauge(
            "oip_gateway_route_ready",
            "1 when some endpoint of the route's backend has its model ready (exact routes).",
            ["route", "backend"], registry=r, multiprocess_mode="max",
        )
        self.conversions = Counter(
            "oip_gateway_conversions", "Inference requests converted between protocols, by direction.",
            ["backend", "direction"], registry=r,
        )
        self.config_generation = Gauge(
            "oip_gateway_config_generation", "Configs applied since start: 1 at start, +1 per applied reload.",
            registry=r, multiprocess_mode="max",
        )
        self.config_generation.set(1)
        self.backend_events = Counter(
            "oip_gateway_backend_events", "What backends did: retry, retry_budget_exhausted, ejection.",
            ["backend", "event"], registry=r,
        )
        # The same counts under a deprecated name, counted with them until it is removed
        # (docs/metrics.md "Deprecated names").
        self.pool_events = Counter(
            "oip_gateway_pool_events", "Deprecated alias of oip_gateway_backend_events_total.",
            ["backend", "event"], registry=r,
        )
        self.mirror_requests = Counter(
            "oip_gateway_mirror_requests", "Shadow copies of requests (routes' mirror), by outcome: answered, "
            "failed (an error or non-200 answer, never the client's), dropped (max_inflight copies in flight).",
            ["route", "backend", "outcome"], registry=r,
        )
        self.mirror_inflight = Gauge(
            "oip_gateway_mirror_inflight", "Shadow copies of requests in flight now (at most the route's "
            "mirror.max_inflight).", ["route", "backend"], registry=r, multiprocess_mode="livesum",
        )
        self.queue_scrapes = Counter(
            "oip_gateway_queue_scrapes", "least_queue: reads of endpoints' Triton metrics, by result (ok, failed: "
            "that endpoint is balanced by its requests in flight).", ["backend", "result"], registry=r,
        )
        self.queue_scrape_seconds = Counter(
            "oip_gateway_queue_scrape_seconds", "least_queue: CPU time spent parsing the pending counts out of "
            "scraped metrics pages (the parsing only, not the HTTP exchange).", ["backend"], registry=r,
        )
        self.refusals = Counter(
            "oip_gateway_refusals",
            "Requests refused before routing: credentials, permissions, rate limits, connection limits.",
            ["protocol", "reason"], registry=r)
        self.config_reloads = Counter(
            "oip_gateway_config_reloads", "Config reloads (SIGHUP or a watched file change), by result.",
            ["result"], registry=r,
        )
        self.config_last_reload_ok = Gauge(
            "oip_gateway_config_last_reload_successful", "0 when the last config reload was refused.",
            registry=r, multiprocess_mode="min",
        )
        self.config_last_reload_ok.set(1)
        self.inflight_bytes = Gauge(
            "oip_gateway_inflight_request_bytes", "Bytes of inference request bodies being handled now.",
            registry=r, multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "oip_gateway_ready", "1 when every exact-name route has a ready endpoint.",
            registry=r, multiprocess_mode="max",
        )
        self.placement_loads = Counter(
            "oip_gateway_placement_loads", "Models placement loaded on an endpoint, by outcome (ok, failed, "
            "timeout).", ["backend", "outcome"], registry=r)
        self.placement_unloads = Counter(
            "oip_gateway_placement_unloads", "Models placement unloaded from an endpoint, by reason (evict: room "
            "for another; idle_copy: an extra copy without inference).", ["backend", "reason"], registry=r)
        self.placement_load_seconds = Histogram(
            "oip_gateway_placement_load_seconds", "How long a load placement sent took, until the model was ready.",
            ["backend"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=r)
        self.placement_copies = Gauge(
            "oip_gateway_placement_copies", "Endpoints a model of a placement pool is ready on.",
            ["backend", "model"], registry=r, multiprocess_mode="max")
        self.hold_seconds = Histogram(
            "oip_gateway_hold_seconds", "How long requests waited for a model ready nowhere (hold_s, placement).",
            ["route", "backend"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.hold_waiting = Gauge(
            "oip_gateway_hold_waiting", "Requests waiting now for a model ready nowhere (hold_s, placement).",
            ["route", "backend"], registry=r, multiprocess_mode="livesum")
        self.hold_refusals = Counter(
            "oip_gateway_hold_refusals", "Requests a hold ended with 503 / UNAVAILABLE, by reason (queue_full, "
            "timeout, no_room).", ["route", "backend", "reason"], registry=r)
        self.route_demand = Gauge(
            "oip_gateway_route_demand", "Requests in flight and waiting, per route to a placement pool or with "
            "hold_s: what an autoscaler (KEDA) scales the servers on.", ["route", "backend"], registry=r,
            multiprocess_mode="livesum")

    # -- placement (backends/holds.py PlacementEvents) -------------------------------------------
    def loaded(self, backend: str, outcome: str, seconds: float) -> None:
        self.placement_loads.labels(backend, outcome).inc()
        if outcome == "ok":
            self.placement_load_seconds.labels(backend).observe(seconds)

    def unloaded(self, backend: str, reason: str) -> None:
        self.placement_unloads.labels(backend, reason).inc()

    def held(self, route: str, backend: str, seconds: float) -> None:
        self.hold_seconds.labels(route, backend).observe(seconds)

    def hold_refused(self, route: str, backend: str, reason: str) -> None:
        self.hold_refusals.labels(route, backend, reason).inc()

    def refused(self, protocol: str, err: Exception) -> None:
        """A refusal by the guard, counted by its kind (a bounded label: the error's class)."""
        self.refusals.labels(protocol, _REFUSAL_REASONS.get(type(err).__name__, "other")).inc()

    def connection_refused(self, reason: str, protocol: str = "http") -> None:
        """A connection (or a gRPC call) refused or closed by a hard limit (max_connections,
        header_timeout, body_timeout; gRPC: a flood limit, ``flood_<frame>``)."""
        self.refusals.labels(protocol, reason).inc()

    def config_reloaded(self, ok: bool) -> None:
        self.config_reloads.labels("success" if ok else "failure").inc()
        self.config_last_reload_ok.set(1 if ok else 0)
        if ok:
            self.config_generation.inc()

    def backend_event(self, backend: str, event: str) -> Counted:
        """The counter of ``event`` (retry, retry_budget_exhausted, ejection) for ``backend``:
        ``oip_gateway_backend_events`` and its deprecated alias at once."""
        return Counted(self.backend_events.labels(backend, event), self.pool_events.labels(backend, event))

    def upstream_timer(self, backend: str) -> Observer:
        """The upstream duration histogram's child for ``backend``, cached (labels() takes a
        lock and builds a key per call; one per backend)."""
        child = self._upstream.get(backend)
        if child is None:
            child = self._upstream[backend] = Observer(self.upstream_seconds.labels(backend))
        return child

    def bytes_in(self, protocol: str) -> Observer:
        """The request body size histogram's child for ``protocol``, cached."""
        child = self._bytes_in.get(protocol)
        if child is None:
            child = self._bytes_in[protocol] = Observer(self.request_bytes.labels(protocol))
        return child

    def track(self, gauge: Gauge, value: Callable[[], float]) -> bool:
        """Make ``gauge`` read ``value()`` when scraped (nothing to update per request); False
        in multiprocess mode, where the caller sets it as it changes."""
        if self.multiprocess:
            return False
        gauge.set_function(value)
        return True

    def observe(self, protocol: str, api: str, route: RouteLabel, code: str | int, seconds: float,
                model: str = "", version: str = "", record: AccessRecord | None = None) -> None:
        """The one place a finished request is recorded: metrics and the access log."""
        key = (protocol, api, route, code)
        children = self._children.get(key)
        if children is None:
            # labels() takes a lock and builds a key per call; the label sets are
            # bounded (routes × codes), so their children are cached here.
            children = (counting(self.requests.labels(protocol, api, route[0], route[1], str(code))),
                        Observer(self.request_seconds.labels(protocol, api, route[0], route[1])))
            self._children[key] = children
            grown()  # (long-lived: frozen out of the collector's way with the rest, gcpolicy.py)
        children[0]()
        children[1].observe(seconds)
        if record is not None and self.access is not None:
            self.access.write(record, protocol, api, model, version, route[0], route[1], code, seconds)
