"""Configuration objects: frozen, slotted dataclasses validated once at load.

The YAML keys map one to one onto these fields; docs/config.md is the reference
for every key, its default and an example. Cross-field checks live in
``__post_init__`` (the aiohttp ``ClientTimeout`` shape, DESIGN.md) so an object
that exists is valid.

The sections with a module of their own hold their dataclasses and parsers together:
``network`` (addresses, ``listen``, TLS, ``dns``), ``backends``, ``routes``, ``security``
and ``v1``. This module holds the top level (and ``health``) and re-exports the rest, as
the gateway imports them from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .backends import BALANCES, DEFAULT_MAX_MESSAGE_BYTES, FAMILIES, BackendSpec, Outlier, Placement, QueueMetrics
from .network import BackendTls, Dns, HostPort, Listen, Peers, Tls
from .routes import Mirror, Route, Side
from .security import Auth, Limits
from .v1 import V1Api

__all__ = [
    "BALANCES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "FAMILIES",
    "BackendSpec",
    "BackendTls",
    "Dns",
    "GatewayConfig",
    "Health",
    "HostPort",
    "Listen",
    "Peers",
    "Mirror",
    "Outlier",
    "Placement",
    "QueueMetrics",
    "Route",
    "Side",
    "Tls",
]


@dataclass(frozen=True, slots=True)
class Health:
    """Background readiness checks (not per request). ``timeout_s``: how long a round waits
    for a check's answer; a later one is still taken, up to ``interval_s`` more (only then
    is the check failed). An endpoint goes down after ``unhealthy_threshold`` failed checks
    in a row and comes back after ``healthy_threshold`` good ones (Envoy's thresholds)."""

    interval_s: float = 2.0
    timeout_s: float = 1.0
    unhealthy_threshold: int = 3
    healthy_threshold: int = 1

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if not 0 < self.timeout_s <= self.interval_s * 10:
            raise ValueError(f"timeout_s must be > 0 and at most 10 × interval_s ({self.interval_s * 10:g}), "
                             f"got {self.timeout_s:g}")
        for name in ("unhealthy_threshold", "healthy_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# Headers that describe a hop, the body's framing or the protocol: never copied from a client.
_NOT_FORWARDABLE = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
    "proxy-connection", "expect", "content-type", "content-encoding", "accept-encoding",
    "inference-header-content-length", "user-agent",
})


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    backends: dict[str, BackendSpec]
    routes: tuple[Route, ...]
    listen: Listen = field(default_factory=Listen)
    health: Health = field(default_factory=Health)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    workers: int = 1
    access_log: bool = False
    # Share of requests the access log writes (``access_log: {sample: 0.1}``), in (0, 1].
    access_log_sample: float = 1.0
    # On SIGTERM: answer "not ready" but keep serving this long, so a load balancer
    # (a Kubernetes Service) stops sending new requests before the listeners close.
    drain_s: float = 0.0
    # Admission control (per process): inference requests whose bodies add up to more
    # than this many bytes in flight are refused (503 / UNAVAILABLE) instead of pushing
    # the process out of memory; converting paths hold several times a payload. 0 = off.
    # HTTP request bodies (inference JSON part, generate, model control, settings) nesting
    # deeper than this are refused before they go anywhere (0: no limit).
    max_json_depth: int = 64
    # The head of an HTTP request (count of headers; their names and values in bytes, also
    # the gRPC listener's metadata size): past either, 431 before anything else is read.
    max_header_count: int = 100
    max_header_bytes: int = 32768
    auth: Auth | None = None
    limits: Limits = field(default_factory=Limits)
    max_inflight_bytes: int | None = None  # None: from the memory limit (gateway/memlimit.py), else off
    # Client headers (HTTP) / metadata (gRPC) passed on to backends on every path, besides
    # the trace context (traceparent, tracestate, x-request-id) that always is. Lower case.
    forward_headers: tuple[str, ...] = ()
    dns: Dns = field(default_factory=Dns)
    # What server metadata (GET /v2, ServerMetadata) names: the gateway's own name and
    # version unless set — e.g. "triton" for scripts that check it. Extensions stay true.
    server_name: str | None = None
    server_version: str | None = None
    # The first-generation API bridge (config/v1.py, docs/v1-bridge.md).
    v1: V1Api = field(default_factory=V1Api)
    # Placement's deciders: every replica's listen.peers (None: this process decides alone).
    peers: Peers | None = None

    def __post_init__(self) -> None:
        for name in self.forward_headers:
            if name != name.lower() or not name or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(f"forward_headers: {name!r} is not a lower-case header name")
            if name in _NOT_FORWARDABLE or name.startswith(("grpc-", ":")):
                raise ValueError(f"forward_headers: {name!r} belongs to the connection or the protocol; "
                                 "the gateway sets it itself")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if not 0 < self.access_log_sample <= 1:
            raise ValueError("access_log.sample must be > 0 and <= 1")
        if self.max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be > 0")
        if self.max_header_count < 10 or self.max_header_bytes < 1024:
            raise ValueError("max_header_count must be >= 10 and max_header_bytes >= 1024")
        if not 0 <= self.max_json_depth <= 10_000:
            raise ValueError("max_json_depth must be between 0 (no limit) and 10000")
        if self.max_inflight_bytes is not None and self.max_inflight_bytes < 0:
            raise ValueError("max_inflight_bytes must be >= 0 (0 turns it off)")
        if self.max_inflight_bytes is not None and 0 < self.max_inflight_bytes < self.max_message_bytes:
            raise ValueError(f"max_inflight_bytes ({self.max_inflight_bytes}) is below max_message_bytes "
                             f"({self.max_message_bytes}): a largest request could never be admitted")
        if not 0 <= self.drain_s <= 3600:
            raise ValueError("drain_s must be between 0 and 3600")
        for i, route in enumerate(self.routes):
            if route.backend not in self.backends:
                raise ValueError(f"routes[{i}].backend: no backend named {route.backend!r}")
