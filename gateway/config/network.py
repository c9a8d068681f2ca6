"""Addresses, TLS and DNS in the config: ``host:port``, the ``listen`` section and its
``tls``, the TLS files of a backend, and the ``dns`` section — their frozen dataclasses and
their parsers (the conventions of ``loader.py``)."""
from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from typing import Any

from .parsing import NOT_HERE, Problems, mapping, number, read_file

__all__ = ["BackendTls", "Dns", "HostPort", "Listen", "Peers", "Tls"]

_DNS_KEYS = {"nameservers", "refresh_s", "timeout_s"}
_LISTEN_KEYS = {"http", "grpc", "metrics", "peers"}
_TLS_KEYS = {"cert", "key", "client_ca"}


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
    by the loader (network._pem), under the load's Presence policy."""

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
    # The placement port other replicas ask (docs/placement.md "Replicas"); plain HTTP.
    peers: HostPort | None = None
    # Applies to the HTTP and gRPC listeners; the metrics and peers listeners stay plain HTTP.
    tls: Tls | None = None

    def __post_init__(self) -> None:
        if self.http is None and self.grpc is None:
            raise ValueError("at least one of listen.http and listen.grpc is required")


@dataclass(frozen=True, slots=True)
class Peers:
    """Every gateway replica's placement port (``listen.peers``): static addresses and DNS names
    re-resolved like endpoints' (a headless Service of the gateway's own pods)."""

    addresses: tuple[HostPort, ...] = ()
    dns: tuple[HostPort, ...] = ()


def _peers(p: Problems, raw: Any) -> Peers | None:
    if not isinstance(raw, list) or not raw:
        p.add("peers", "expected a non-empty list of host:port or {dns: name:port}")
        return None
    addresses: list[HostPort] = []
    dns: list[HostPort] = []
    for i, item in enumerate(raw):
        where = f"peers[{i}]"
        if isinstance(item, dict):
            p.check_keys(where, item, {"dns"})
            hp = _hostport(p, f"{where}.dns", item.get("dns"))
            if hp is not None:
                dns.append(hp)
        else:
            hp = _hostport(p, where, item)
            if hp is not None:
                addresses.append(hp)
    if len(addresses) + len(dns) != len(raw):
        return None
    return Peers(tuple(addresses), tuple(dns))


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


def _hostport(p: Problems, key: str, value: Any) -> HostPort | None:
    return p.build(key, lambda: HostPort.parse(value))


def _listen(p: Problems, raw: Any) -> Listen | None:
    data = mapping(p, "listen", raw)
    if data is None:
        return None
    p.check_keys("listen", data, _LISTEN_KEYS | {"tls"})
    defaults = Listen()
    before = len(p.items)
    kwargs: dict[str, Any] = {}
    if data.get("tls") is not None:
        kwargs["tls"] = _tls(p, data["tls"])
    for name in _LISTEN_KEYS:
        if name not in data:
            kwargs[name] = getattr(defaults, name)
        elif data[name] is None or data[name] is False:
            kwargs[name] = None  # explicitly disabled
        else:
            kwargs[name] = _hostport(p, f"listen.{name}", data[name])
    if len(p.items) > before:
        return None
    return p.build("listen", lambda: Listen(**kwargs))


def _tls(p: Problems, raw: Any) -> Tls | None:
    data = mapping(p, "listen.tls", raw)
    if data is None:
        return None
    p.check_keys("listen.tls", data, _TLS_KEYS)
    for name in ("cert", "key"):
        if not isinstance(data.get(name), str):
            p.add(f"listen.tls.{name}", "required: path of a PEM file")
    if "client_ca" in data and not isinstance(data["client_ca"], str):
        p.add("listen.tls.client_ca", "expected the path of a PEM file")
    if not all(isinstance(data.get(n), str) for n in ("cert", "key")):
        return None
    if not _pem(p, "listen.tls", data, ("cert", "key", "client_ca")):
        return None
    return p.build("listen.tls", lambda: Tls(cert=data["cert"], key=data["key"], client_ca=data.get("client_ca")))


def _pem(p: Problems, key: str, data: dict[str, Any], names: tuple[str, ...]) -> bool:
    """The PEM files ``data`` names under ``names`` (those given as strings): each read and
    checked to start like PEM. A file not present here follows ``p.presence``. False: a problem."""
    ok = True
    for name in names:
        path = data.get(name)
        if not isinstance(path, str):
            continue
        head = read_file(p, f"{key}.{name}", path, 64)
        if head is None:
            ok = False
        elif head is not NOT_HERE and b"-----BEGIN" not in head:
            p.add(f"{key}.{name}", f"{path} is not a PEM file")
            ok = False
    return ok


def _nameserver(text: Any) -> HostPort:
    """``ip``, ``ip:port`` or ``[v6]:port``; port 53 when none is given."""
    if not isinstance(text, str):
        raise ValueError(f"expected ip or ip:port, got {text!r}")
    hp = HostPort.parse(text) if text.startswith("[") or text.count(":") == 1 else HostPort(text, 53)
    try:
        ipaddress.ip_address(hp.host)
    except ValueError:
        raise ValueError(f"{hp.host!r} is not an IP address (a resolver is reached by address)") from None
    return hp


def _dns(p: Problems, raw: Any) -> Dns | None:
    data = mapping(p, "dns", raw)
    if data is None:
        return None
    p.check_keys("dns", data, _DNS_KEYS)
    names = data.get("nameservers", [])
    if not isinstance(names, list):
        p.add("dns.nameservers", f"expected a list of ip:port, got {names!r}")
        return None
    servers = [p.build(f"dns.nameservers[{i}]", functools.partial(_nameserver, ns)) for i, ns in enumerate(names)]
    kwargs = {k: number(p, f"dns.{k}", v) for k, v in data.items() if k in ("refresh_s", "timeout_s")}
    if None in servers or None in kwargs.values():
        return None
    return p.build("dns", lambda: Dns(nameservers=tuple(servers), **kwargs))  # type: ignore[arg-type]
