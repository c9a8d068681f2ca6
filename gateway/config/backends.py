"""The ``backends`` section — each backend a named set of endpoints (servers) that routes send to,
with its protocol, limits, balancing, retries, outlier ejection and TLS: its frozen dataclasses
(:class:`BackendSpec`) and its parser (the conventions of ``loader.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .network import BackendTls, HostPort, _hostport, _pem
from .parsing import Problems, _section, mapping, number, secret

__all__ = ["BALANCES", "DEFAULT_MAX_MESSAGE_BYTES", "FAMILIES", "BackendSpec", "Outlier", "Placement", "QueueMetrics"]

# gRPC's 4 MiB default is the limit users of other gateways hit most; 256 MiB
# carries a 64 MB tensor through JSON with room to spare.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

Protocol = Literal["http", "grpc"]

_OUTLIER_KEYS = {"consecutive_failures", "base_ejection_s", "max_ejection_s", "max_ejection_percent"}
_BACKEND_KEYS = {"protocol", "endpoints", "timeout_s", "connect_timeout_s", "max_message_bytes", "binary_extension",
                 "max_connections", "balance", "tls", "retries", "retry_budget_percent", "outlier", "repository_index",
                 "check_headers", "non_utf8_bytes", "queue_metrics", "max_answer_header_count",
                 "max_answer_head_bytes", "max_check_answer_bytes", "server_family", "placement"}
_BACKEND_TLS_KEYS = {"ca", "cert", "key", "server_name"}


@dataclass(frozen=True, slots=True)
class Outlier:
    """Passive outlier ejection of one backend (Envoy's consecutive gateway failures):
    ``consecutive_failures`` transport failures in a row eject an endpoint for
    ``base_ejection_s`` × its number of ejections (at most ``max_ejection_s``); no more
    than ``max_ejection_percent`` of the backend is ejected at once (one endpoint always may)."""

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


_PLACEMENT_NUMBERS = {"capacity_models": int, "capacity_bytes": int, "copies": int, "max_copies": int,
                      "scale_up_per_copy": float, "scale_up_after_s": float, "copy_idle_s": float,
                      "min_residency_s": float, "queue": int, "load_timeout_s": float, "grpc_port": int}


@dataclass(frozen=True, slots=True)
class Placement:
    """On-demand placement (docs/placement.md): the backend's endpoints are Triton servers in
    explicit model-control mode sharing one repository, and the gateway decides which of them
    hold which model — loaded when first asked for, placed by rendezvous hashing, the least
    recently used evicted when an endpoint is at ``capacity_models`` (or ``capacity_bytes`` of
    the memory Triton's statistics report), copies added with demand."""

    capacity_models: int
    capacity_bytes: int = 0  # 0: only models are counted
    copies: int = 1
    max_copies: int = 0  # 0: ``copies``
    scale_up_per_copy: float = 4.0
    scale_up_after_s: float = 5.0
    copy_idle_s: float = 300.0
    min_residency_s: float = 60.0
    pinned: tuple[str, ...] = ()
    queue: int = 64
    load_timeout_s: float = 120.0
    # An http backend's servers' gRPC port, where its loads and unloads go (0: over HTTP). Triton
    # holds its other HTTP traffic while an HTTP repository call runs (0.8 s seen); over gRPC
    # nothing waits.
    grpc_port: int = 0

    def __post_init__(self) -> None:
        if self.capacity_models < 1:
            raise ValueError("capacity_models must be >= 1")
        if self.capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if self.copies < 1:
            raise ValueError("copies must be >= 1")
        if self.max_copies == 0:
            object.__setattr__(self, "max_copies", self.copies)
        if self.max_copies < self.copies:
            raise ValueError("max_copies must be >= copies")
        if self.scale_up_per_copy <= 0 or self.scale_up_after_s < 0 or self.copy_idle_s <= 0:
            raise ValueError("scale_up_per_copy and copy_idle_s must be > 0, scale_up_after_s >= 0")
        if self.min_residency_s < 0:
            raise ValueError("min_residency_s must be >= 0")
        if self.queue < 1:
            raise ValueError("queue must be >= 1")
        if not 0 < self.load_timeout_s <= 3600:
            raise ValueError("load_timeout_s must be > 0 and <= 3600")
        if len(set(self.pinned)) != len(self.pinned) or not all(self.pinned):
            raise ValueError("pinned must list distinct, non-empty model names")
        if not 0 <= self.grpc_port < 65536:
            raise ValueError("grpc_port must be a TCP port (0: repository calls over HTTP)")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    protocol: Protocol
    endpoints: tuple[HostPort, ...]
    # DNS names (host = the name) re-resolved every dns.refresh_s; every A/AAAA record
    # becomes an endpoint on the given port (a Kubernetes headless Service: one per pod).
    dns: tuple[HostPort, ...] = ()
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # HTTP backends only: whether the backend speaks the binary data extension
    # (Triton, OVMS do; MLServer does not, so requests to it are sent as JSON).
    binary_extension: bool = True
    # HTTP backends without the binary extension: how a BYTES element that is not UTF-8
    # travels in JSON — "refuse" (a clear error naming the tensor) or "base64" (MLServer's
    # own way: the input goes base64 with parameters.content_type "base64").
    non_utf8_bytes: str = "refuse"
    # HTTP backends only: open connections per endpoint; more concurrent requests wait.
    max_connections: int = 512
    # HTTP backends only: what the gateway accepts of an answer's head (interim 1xx heads count
    # too); the body is bounded by max_message_bytes on every path.
    max_answer_header_count: int = 100
    max_answer_head_bytes: int = 65536
    # HTTP backends only: the body of a health, readiness or repository-index answer (an index
    # of 10,000 models is ~1 MB).
    max_check_answer_bytes: int = 16 * 1024 * 1024
    # HTTP backends only: the servers' family, whose gRPC answer form a gRPC client gets through
    # this backend ("auto": read from each endpoint's server metadata name).
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
    # Retries in progress stay within this share of the backend's requests in flight.
    retry_budget_percent: float = 20.0
    outlier: Outlier = field(default_factory=Outlier)
    # Ask each endpoint for its repository index (one call per round) before falling
    # back to per-model ready calls.
    repository_index: bool = True
    # Sent with the health checker's calls (HTTP headers / gRPC metadata): Triton's
    # restricted repository API wants one (--http-restricted-api=model-repository:k=v).
    check_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # On-demand placement of models on the endpoints (None: the endpoints' models are their own).
    placement: Placement | None = None

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
        if self.placement is not None and self.placement.copies > len(self.endpoints) and not self.dns:
            raise ValueError("placement.copies is more than the backend's endpoints")
        if self.placement is not None and self.placement.grpc_port and self.protocol == "grpc":
            raise ValueError("placement.grpc_port is for an http backend (a grpc backend's loads go over gRPC)")


BALANCES = ("round_robin", "least_request", "least_queue")
# Server families an HTTP backend answers gRPC clients as (docs/config.md "server_family").
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


def _backend(p: Problems, name: str, raw: Any) -> BackendSpec | None:
    key = f"backends.{name}"
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _BACKEND_KEYS)
    ok = True
    if "protocol" not in data:
        p.add(f"{key}.protocol", "required (http or grpc)")
        ok = False
    elif data["protocol"] not in ("http", "grpc"):
        # Checked here, not only by BackendSpec(): reported even when another key of the
        # backend is wrong too (every problem in one run).
        p.add(f"{key}.protocol", f"expected http or grpc, got {data['protocol']!r}")
        ok = False
    if "balance" in data and data["balance"] not in BALANCES:
        p.add(f"{key}.balance", f"expected one of {', '.join(BALANCES)}, got {data['balance']!r}")
        ok = False
    metrics_ports: list[tuple[HostPort, int]] = []
    eps_raw = data.get("endpoints")
    endpoints: list[HostPort] = []
    dns: list[HostPort] = []
    if not isinstance(eps_raw, list) or not eps_raw:
        p.add(f"{key}.endpoints", "required: a non-empty list of host:port (or dns: name:port)")
        ok = False
    else:
        for i, ep in enumerate(eps_raw):
            where = f"{key}.endpoints[{i}]"
            if isinstance(ep, dict) and "address" in ep:
                # {address: host:port, metrics_port: N}: an endpoint whose Triton metrics
                # port differs from the backend's queue_metrics.port.
                p.check_keys(where, ep, {"address", "metrics_port"})
                hp = _hostport(p, f"{where}.address", ep.get("address"))
                if hp is not None:
                    endpoints.append(hp)
                if "metrics_port" in ep:
                    port = number(p, f"{where}.metrics_port", ep["metrics_port"], int)
                    if port is not None and hp is not None:
                        metrics_ports.append((hp, port))
            elif isinstance(ep, dict):
                p.check_keys(where, ep, {"dns"})
                hp = _hostport(p, f"{where}.dns", ep.get("dns")) if "dns" in ep else None
                if "dns" not in ep:
                    p.add(f"{where}.dns", "required: name:port of a DNS name to follow (or address: host:port)")
                (dns if hp is not None else []).append(hp)  # type: ignore[arg-type]
            else:
                hp = _hostport(p, where, ep)
                if hp is not None:
                    endpoints.append(hp)
            ok = ok and hp is not None
    kwargs: dict[str, Any] = {}
    for k in ("timeout_s", "connect_timeout_s", "max_message_bytes", "max_connections", "retries",
              "retry_budget_percent", "max_answer_header_count", "max_answer_head_bytes", "max_check_answer_bytes"):
        if k in data:
            kwargs[k] = number(p, f"{key}.{k}", data[k], int if k.startswith("max_") or k == "retries" else float)
            ok = ok and kwargs[k] is not None
    for k in ("binary_extension", "repository_index"):
        if k in data:
            if not isinstance(data[k], bool):
                p.add(f"{key}.{k}", f"expected true or false, got {data[k]!r}")
                ok = False
            else:
                kwargs[k] = data[k]
    if data.get("outlier") is not None:
        outlier = _section(p, f"{key}.outlier", data["outlier"], _OUTLIER_KEYS, Outlier,
                           ints=("consecutive_failures",))
        ok = ok and outlier is not None
        kwargs["outlier"] = outlier
    if data.get("check_headers") is not None:
        headers = _check_headers(p, f"{key}.check_headers", data["check_headers"])
        ok = ok and headers is not None
        kwargs["check_headers"] = headers
    if "non_utf8_bytes" in data:
        if data["non_utf8_bytes"] not in ("refuse", "base64"):
            p.add(f"{key}.non_utf8_bytes", f"expected refuse or base64, got {data['non_utf8_bytes']!r}")
            ok = False
        else:
            kwargs["non_utf8_bytes"] = data["non_utf8_bytes"]
    if "balance" in data:
        kwargs["balance"] = data["balance"]  # its values are checked by BackendSpec
    if "server_family" in data:
        kwargs["server_family"] = data["server_family"]  # checked by BackendSpec
    if data.get("queue_metrics") is not None:
        qm = _section(p, f"{key}.queue_metrics", data["queue_metrics"], {"port", "interval_s"}, QueueMetrics,
                      ints=("port",))
        ok = ok and qm is not None
        kwargs["queue_metrics"] = qm
    if metrics_ports:
        kwargs["metrics_ports"] = tuple(metrics_ports)
    if data.get("placement") is not None:
        placement = _placement(p, f"{key}.placement", data["placement"])
        ok = ok and placement is not None
        kwargs["placement"] = placement
    if data.get("tls") is not None:
        tls = data["tls"]
        if tls is True:
            kwargs["tls"] = BackendTls()  # the system's CAs, no client certificate
        elif isinstance(tls, dict):
            p.check_keys(f"{key}.tls", tls, _BACKEND_TLS_KEYS)
            bad = [k for k in _BACKEND_TLS_KEYS if k in tls and not isinstance(tls[k], str)]
            for k in bad:
                p.add(f"{key}.tls.{k}", f"expected a string, got {tls[k]!r}")
            files_ok = _pem(p, f"{key}.tls", tls, ("ca", "cert", "key"))
            built = None if bad or not files_ok else p.build(f"{key}.tls", lambda: BackendTls(
                **{k: tls[k] for k in _BACKEND_TLS_KEYS if k in tls}))
            ok = ok and built is not None
            kwargs["tls"] = built
        elif tls is not False:
            p.add(f"{key}.tls", f"expected true, false or a mapping (ca, cert, key, server_name), got {tls!r}")
            ok = False
    if not ok:
        return None
    return p.build(key, lambda: BackendSpec(name=name, protocol=data["protocol"], endpoints=tuple(endpoints),
                                            dns=tuple(dns), **kwargs))


def _placement(p: Problems, key: str, raw: Any) -> Placement | None:
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, {*_PLACEMENT_NUMBERS, "pinned"})
    ok = True
    if "capacity_models" not in data:
        p.add(f"{key}.capacity_models", "required: how many models one endpoint holds")
        ok = False
    kwargs: dict[str, Any] = {}
    for k, kind in _PLACEMENT_NUMBERS.items():
        if k in data:
            kwargs[k] = number(p, f"{key}.{k}", data[k], kind)
            ok = ok and kwargs[k] is not None
    if "pinned" in data:
        pinned = data["pinned"]
        if not isinstance(pinned, list) or not all(isinstance(n, str) and n for n in pinned):
            p.add(f"{key}.pinned", f"expected a list of model names, got {pinned!r}")
            ok = False
        else:
            kwargs["pinned"] = tuple(pinned)
    if not ok:
        return None
    return p.build(key, lambda: Placement(**kwargs))


def _check_headers(p: Problems, key: str, raw: Any) -> tuple[tuple[str, str], ...] | None:
    data = mapping(p, key, raw)
    if data is None:
        return None
    out = []
    for name, spec in data.items():
        if not isinstance(name, str) or name != name.lower() or not name or not all(
                c.isalnum() or c in "-_." for c in name):
            p.add(f"{key}.{name}", "expected a lower-case header name")
            continue
        value = secret(p, f"{key}.{name}", spec)
        if value is not None:
            out.append((name, value))
    return tuple(out) if len(out) == len(data) else None
