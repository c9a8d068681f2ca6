"""Configuration objects: frozen, slotted dataclasses validated once at load.

The YAML keys map one to one onto these fields; docs/config.md is the reference
for every key, its default and an example. Cross-field checks live in
``__post_init__`` (the aiohttp ``ClientTimeout`` shape, DESIGN.md) so an object
that exists is valid.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

from .security import Auth, Limits, Rate
from .v1 import V1Api

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Backend",
    "Dns",
    "GatewayConfig",
    "Health",
    "HostPort",
    "Listen",
    "Outlier",
    "Route",
]

# gRPC's 4 MiB default is the limit users of other gateways hit most; 256 MiB
# carries a 64 MB tensor through JSON with room to spare.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

Protocol = Literal["http", "grpc"]


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is out of range 0..65535")
        if not self.host:
            raise ValueError("host is empty")

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """``host:port`` or ``[v6addr]:port``."""
        if not isinstance(text, str) or ":" not in text:
            raise ValueError(f"expected host:port, got {text!r}")
        host, _, port = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            port_num = int(port)
        except ValueError:
            raise ValueError(f"port in {text!r} is not a number") from None
        return cls(host, port_num)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS for the HTTP and gRPC listeners (PEM files); ``client_ca`` set = clients must
    present a certificate it signed (mutual TLS). The files are read and checked to be PEM
    by the loader (loader._pem), under the load's Presence policy."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True, slots=True)
class BackendTls:
    """TLS to a backend's endpoints: ``ca`` (PEM; default: the system's CAs), a client
    certificate ``cert`` + ``key`` for mutual TLS, and ``server_name`` when the
    certificate names a host other than the endpoint's. The files are checked as ``Tls``'s."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key go together (a client certificate and its key)")


@dataclass(frozen=True, slots=True)
class Listen:
    http: HostPort | None = HostPort("0.0.0.0", 8000)
    grpc: HostPort | None = HostPort("0.0.0.0", 8001)
    metrics: HostPort | None = HostPort("0.0.0.0", 8002)
    # Applies to the HTTP and gRPC listeners; the metrics listener stays plain HTTP.
    tls: Tls | None = None

    def __post_init__(self) -> None:
        if self.http is None and self.grpc is None:
            raise ValueError("at least one of listen.http and listen.grpc is required")


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


@dataclass(frozen=True, slots=True)
class Outlier:
    """Passive outlier ejection of one pool (Envoy's consecutive gateway failures):
    ``consecutive_failures`` transport failures in a row eject an endpoint for
    ``base_ejection_s`` × its number of ejections (at most ``max_ejection_s``); no more
    than ``max_ejection_percent`` of the pool is ejected at once (one endpoint always may)."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 10.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be >= 1")
        if self.base_ejection_s <= 0 or self.max_ejection_s < self.base_ejection_s:
            raise ValueError("base_ejection_s must be > 0 and max_ejection_s >= base_ejection_s")
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be between 0 and 100")

    def may_eject(self, ejected: int, total: int) -> bool:
        """Whether one more of ``total`` endpoints may be ejected with ``ejected`` out already.
        As Envoy: at least one endpoint may always be ejected, whatever the percentage."""
        return (ejected == 0 and total > 1) or (ejected + 1) * 100 <= self.max_ejection_percent * total


@dataclass(frozen=True, slots=True)
class Dns:
    """DNS discovery: ``nameservers`` ((ip, port) pairs; empty = the system's
    /etc/resolv.conf), how often names are re-resolved, and the query timeout."""

    nameservers: tuple[HostPort, ...] = ()
    refresh_s: float = 5.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.refresh_s <= 0 or self.timeout_s <= 0:
            raise ValueError("refresh_s and timeout_s must be > 0")
        for ns in self.nameservers:
            try:
                ipaddress.ip_address(ns.host)
            except ValueError:
                raise ValueError(f"nameserver {ns} is not an IP address (a resolver is reached by address)") from None


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    protocol: Protocol
    endpoints: tuple[HostPort, ...]
    # DNS names (host = the name) re-resolved every dns.refresh_s; every A/AAAA record
    # becomes an endpoint on the given port (a Kubernetes headless Service: one per pod).
    dns: tuple[HostPort, ...] = ()
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # HTTP pools only: whether the backend speaks the binary data extension
    # (Triton, OVMS do; MLServer does not, so requests to it are sent as JSON).
    binary_extension: bool = True
    # HTTP pools without the binary extension: how a BYTES element that is not UTF-8
    # travels in JSON — "refuse" (a clear error naming the tensor) or "base64" (MLServer's
    # own way: the input goes base64 with parameters.content_type "base64").
    non_utf8_bytes: str = "refuse"
    # HTTP pools only: open connections per endpoint; more concurrent requests wait.
    max_connections: int = 512
    # HTTP pools only: what the gateway accepts of an answer's head (interim 1xx heads count
    # too); the body is bounded by max_message_bytes on every path.
    max_answer_header_count: int = 100
    max_answer_head_bytes: int = 65536
    # HTTP pools only: the body of a health, readiness or repository-index answer (an index
    # of 10,000 models is ~1 MB).
    max_check_answer_bytes: int = 16 * 1024 * 1024
    # HTTP pools only: the servers' family, whose gRPC answer form a gRPC client gets through
    # this pool ("auto": read from each endpoint's server metadata name).
    server_family: str = "auto"
    # How a request picks its endpoint: "round_robin", "least_request" (the healthy
    # endpoint with the fewest requests in flight; ties in round-robin order), or
    # "least_queue" (Triton's pending requests for the model, scraped from its metrics
    # port, plus the gateway's own in flight; power of two choices).
    balance: str = "round_robin"
    # least_queue: where and how often each endpoint's Triton metrics are read.
    queue_metrics: QueueMetrics = field(default_factory=lambda: QueueMetrics())
    # Per-endpoint metrics ports ({address, metrics_port} endpoints) overriding queue_metrics.port.
    metrics_ports: tuple[tuple[HostPort, int], ...] = ()
    # TLS to the endpoints (None: plain text).
    tls: BackendTls | None = None
    # Attempts on another ready endpoint after one refused before any inference ran.
    retries: int = 1
    # Retries in progress stay within this share of the pool's requests in flight.
    retry_budget_percent: float = 20.0
    outlier: Outlier = field(default_factory=Outlier)
    # Ask each endpoint for its repository index (one call per round) before falling
    # back to per-model ready calls.
    repository_index: bool = True
    # Sent with the health checker's calls (HTTP headers / gRPC metadata): Triton's
    # restricted repository API wants one (--http-restricted-api=model-repository:k=v).
    check_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        if self.protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {self.protocol!r}")
        if not self.endpoints and not self.dns:
            raise ValueError("endpoints must list at least one host:port or dns: name:port")
        if len(set(self.endpoints)) != len(self.endpoints) or len(set(self.dns)) != len(self.dns):
            raise ValueError("endpoints has duplicates")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        if self.max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if self.max_answer_header_count < 10 or self.max_answer_head_bytes < 1024:
            raise ValueError("max_answer_header_count must be >= 10 and max_answer_head_bytes >= 1024")
        if self.max_check_answer_bytes < 1024:
            raise ValueError("max_check_answer_bytes must be >= 1024")
        if self.server_family not in FAMILIES:
            raise ValueError(f"server_family must be one of {', '.join(FAMILIES)}, got {self.server_family!r}")
        if not 0 <= self.retries <= 5:
            raise ValueError("retries must be between 0 and 5")
        if not 0 < self.retry_budget_percent <= 100:
            raise ValueError("retry_budget_percent must be > 0 and <= 100")


BALANCES = ("round_robin", "least_request", "least_queue")
# Server families an HTTP pool answers gRPC clients as (docs/config.md "server_family").
FAMILIES = ("auto", "triton", "mlserver", "kserve", "other")


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """least_queue: each endpoint's Triton metrics (``http://<host>:<port>/metrics``, its
    ``nv_inference_pending_request_count``) are read every ``interval_s``."""

    port: int = 8002
    interval_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("queue_metrics.port must be a TCP port")
        if not 0.05 <= self.interval_s <= 60:
            raise ValueError("queue_metrics.interval_s must be between 0.05 and 60")


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a weighted split: a pool and its share (any positive weight)."""

    backend: str
    weight: float

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"split weight of {self.backend!r} must be > 0")


@dataclass(frozen=True, slots=True)
class Mirror:
    """Shadow traffic: ``percent`` of a route's inference requests also go to ``backend``;
    its answers are discarded and at most ``max_inflight`` copies are in flight."""

    backend: str
    percent: float
    max_inflight: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.percent <= 100:
            raise ValueError("mirror.percent must be > 0 and <= 100")
        if self.max_inflight < 1:
            raise ValueError("mirror.max_inflight must be >= 1")


@dataclass(frozen=True, slots=True)
class Route:
    """``model`` is an exact name or a glob (``*``, ``?``, ``[...]``). ``backend`` is the
    pool; a weighted ``split`` names several (``backend`` is then its first side's).
    ``headers``: (lower-case name, value) pairs a request must carry (HTTP headers or gRPC
    metadata) for this route to take it; ``mirror``: shadow traffic."""

    model: str
    backend: str
    version: str | None = None
    split: tuple[Side, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    mirror: Mirror | None = None
    # None: a credential is needed when the config has an ``auth`` section; False: open.
    auth: bool | None = None
    # A token bucket per model of this route, every caller together.
    rate: Rate | None = None
    # Every request of this route is stateful (as one carrying a sequence_id is): never sent
    # to a backend a second time once any of its bytes were written.
    stateful: bool = False

    @property
    def is_glob(self) -> bool:
        return any(c in self.model for c in "*?[")

    @property
    def backends(self) -> tuple[str, ...]:
        """Every pool the route sends requests to (not its mirror)."""
        return tuple(s.backend for s in self.split) if self.split else (self.backend,)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is empty")
        if self.split and len({s.backend for s in self.split}) != len(self.split):
            raise ValueError("a split names a backend twice")


# Headers that describe a hop, the body's framing or the protocol: never copied from a client.
_NOT_FORWARDABLE = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
    "proxy-connection", "expect", "content-type", "content-encoding", "accept-encoding",
    "inference-header-content-length", "user-agent",
})


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    backends: dict[str, Backend]
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
