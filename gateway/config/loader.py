"""YAML → :class:`GatewayConfig`, with one clear message per problem naming the key.

Unknown keys are errors (a typo must not silently fall back to a default).
Every section is checked even after an earlier one failed, so ``oip-gateway
check`` reports all problems at once.
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
import pathlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from ..errors import ConfigError
from .parsing import NOT_HERE, Presence, Problems, mapping, number, read_file, secret
from .schema import (
    BALANCES,
    Backend,
    BackendTls,
    Dns,
    GatewayConfig,
    Health,
    HostPort,
    Listen,
    Mirror,
    Outlier,
    QueueMetrics,
    Route,
    Side,
    Tls,
)
from .security import parse_auth, parse_limits, parse_rate
from .v1 import parse_v1

__all__ = ["Checked", "check_config", "load_config", "parse_config", "read_config"]

T = TypeVar("T")

_TOP_KEYS = {"listen", "backends", "routes", "health", "max_message_bytes", "workers", "access_log", "drain_s",
             "max_inflight_bytes", "forward_headers", "dns", "server", "max_json_depth",
             "max_header_count", "max_header_bytes", "auth", "limits", "v1"}
_DNS_KEYS = {"nameservers", "refresh_s", "timeout_s"}
_OUTLIER_KEYS = {"consecutive_failures", "base_ejection_s", "max_ejection_s", "max_ejection_percent"}
_LISTEN_KEYS = {"http", "grpc", "metrics"}
_TLS_KEYS = {"cert", "key", "client_ca"}
_HEALTH_KEYS = {"interval_s", "timeout_s", "unhealthy_threshold", "healthy_threshold"}
_BACKEND_KEYS = {"protocol", "endpoints", "timeout_s", "connect_timeout_s", "max_message_bytes", "binary_extension",
                 "max_connections", "balance", "tls", "retries", "retry_budget_percent", "outlier", "repository_index",
                 "check_headers", "non_utf8_bytes", "queue_metrics", "max_answer_header_count",
                 "max_answer_head_bytes", "max_check_answer_bytes", "server_family"}
_BACKEND_TLS_KEYS = {"ca", "cert", "key", "server_name"}
_ROUTE_KEYS = {"model", "version", "backend", "split", "headers", "mirror", "auth", "rate", "stateful"}
_SIDE_KEYS = {"backend", "weight"}
_MIRROR_KEYS = {"backend", "percent", "max_inflight"}
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


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


def _health(p: Problems, raw: Any) -> Health | None:
    return _section(p, "health", raw, _HEALTH_KEYS, Health, ints=("unhealthy_threshold", "healthy_threshold"))


def _backend(p: Problems, name: str, raw: Any) -> Backend | None:
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
        # Checked here, not only by Backend(): reported even when another key of the
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
                # port differs from the pool's queue_metrics.port.
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
        kwargs["balance"] = data["balance"]  # its values are checked by Backend
    if "server_family" in data:
        kwargs["server_family"] = data["server_family"]  # checked by Backend
    if data.get("queue_metrics") is not None:
        qm = _section(p, f"{key}.queue_metrics", data["queue_metrics"], {"port", "interval_s"}, QueueMetrics,
                      ints=("port",))
        ok = ok and qm is not None
        kwargs["queue_metrics"] = qm
    if metrics_ports:
        kwargs["metrics_ports"] = tuple(metrics_ports)
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
    return p.build(key, lambda: Backend(name=name, protocol=data["protocol"], endpoints=tuple(endpoints),
                                        dns=tuple(dns), **kwargs))


def _section(p: Problems, key: str, raw: Any, keys: set[str], cls: Callable[..., T],
             ints: tuple[str, ...] = ()) -> T | None:
    """A mapping of numbers onto a frozen dataclass (health, outlier, dns timings)."""
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, keys)
    kwargs = {k: number(p, f"{key}.{k}", v, int if k in ints else float) for k, v in data.items() if k in keys}
    if any(v is None for v in kwargs.values()):
        return None
    return p.build(key, lambda: cls(**kwargs))


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


def _route(p: Problems, i: int, raw: Any) -> Route | None:
    key = f"routes[{i}]"
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _ROUTE_KEYS)
    ok = True
    if not isinstance(data.get("model"), str) or not data.get("model"):
        p.add(f"{key}.model", "required: a non-empty string")
        ok = False
    split: list[Side] = []
    if ("backend" in data) == ("split" in data):
        p.add(f"{key}.backend", "required: a backend name, or a split (not both)")
        ok = False
    elif "backend" in data and (not isinstance(data["backend"], str) or not data["backend"]):
        p.add(f"{key}.backend", "required: a non-empty string")
        ok = False
    elif "split" in data:
        sides = data["split"]
        if not isinstance(sides, list) or len(sides) < 2:
            p.add(f"{key}.split", "expected a list of at least two {backend, weight}")
            ok = False
        else:
            for j, side in enumerate(sides):
                where = f"{key}.split[{j}]"
                body = mapping(p, where, side)
                if body is None:
                    ok = False
                    continue
                p.check_keys(where, body, _SIDE_KEYS)
                weight = number(p, f"{where}.weight", body.get("weight"), float) if "weight" in body else None
                if "weight" not in body:
                    p.add(f"{where}.weight", "required: a positive number")
                if not isinstance(body.get("backend"), str) or not body.get("backend"):
                    p.add(f"{where}.backend", "required: a non-empty string")
                    ok = False
                    continue
                name: str = body["backend"]
                built = p.build(where, functools.partial(Side, name, weight)) if weight is not None else None
                ok = ok and built is not None
                if built is not None:
                    split.append(built)
    headers: list[tuple[str, str]] = []
    if "headers" in data:
        hraw = data["headers"]
        if not isinstance(hraw, dict) or not hraw:
            p.add(f"{key}.headers", "expected a mapping of header name to value")
            ok = False
        else:
            for name, value in hraw.items():
                lname = str(name).lower()
                if not _HEADER_NAME.fullmatch(lname) or lname.startswith(":"):
                    p.add(f"{key}.headers", f"not a header name: {name!r}")
                    ok = False
                elif not isinstance(value, str):
                    p.add(f"{key}.headers.{name}", f"expected a string, got {value!r}")
                    ok = False
                else:
                    headers.append((lname, value))
    mirror = None
    if data.get("mirror") is not None:
        mraw = mapping(p, f"{key}.mirror", data["mirror"])
        if mraw is None:
            ok = False
        else:
            p.check_keys(f"{key}.mirror", mraw, _MIRROR_KEYS)
            if not isinstance(mraw.get("backend"), str) or not mraw.get("backend"):
                p.add(f"{key}.mirror.backend", "required: a non-empty string")
                ok = False
            pct = number(p, f"{key}.mirror.percent", mraw.get("percent"), float)
            mi = number(p, f"{key}.mirror.max_inflight", mraw["max_inflight"], int) if "max_inflight" in mraw \
                else 64
            if isinstance(mraw.get("backend"), str) and pct is not None and mi is not None:
                mirror = p.build(f"{key}.mirror", functools.partial(Mirror, mraw["backend"], pct, mi))
            ok = ok and mirror is not None
    auth = None
    if "auth" in data:
        if not isinstance(data["auth"], bool):
            p.add(f"{key}.auth", f"expected true or false, got {data['auth']!r}")
            ok = False
        else:
            auth = data["auth"]
    rate = parse_rate(p, f"{key}.rate", data["rate"]) if data.get("rate") is not None else None
    ok = ok and (rate is not None or data.get("rate") is None)
    stateful = data.get("stateful", False)
    if not isinstance(stateful, bool):
        p.add(f"{key}.stateful", f"expected true or false, got {stateful!r}")
        ok = False
    raw_version = data.get("version")
    version: str | None = None
    if raw_version is not None:
        if isinstance(raw_version, bool) or not isinstance(raw_version, (str, int)):
            p.add(f"{key}.version", f"expected a string, got {raw_version!r}")
            ok = False
        else:
            version = str(raw_version)  # YAML reads `version: 1` as an int; V2 versions are strings
    if not ok:
        return None
    backend = data["backend"] if "backend" in data else split[0].backend
    return p.build(key, lambda: Route(model=data["model"], backend=backend, version=version, split=tuple(split),
                                      headers=tuple(headers), mirror=mirror, auth=auth,
                                      rate=rate, stateful=stateful))


def parse_config(raw: Any) -> GatewayConfig:
    """Validate an already-parsed YAML document. Raises ConfigError listing every problem.
    Every file and environment variable it names must exist here (Presence.STRICT)."""
    return _parse(Problems(Presence.STRICT), raw)


def _parse(p: Problems, raw: Any) -> GatewayConfig:
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): expected a mapping with listen, backends and routes"])
    p.check_keys("", raw, _TOP_KEYS)

    listen = _listen(p, raw.get("listen")) if "listen" in raw else Listen()
    health = _health(p, raw.get("health")) if "health" in raw else Health()
    dns = _dns(p, raw.get("dns")) if "dns" in raw else Dns()

    backends: dict[str, Backend] = {}
    braw = mapping(p, "backends", raw.get("backends"))
    if not braw:
        p.add("backends", "required: at least one named backend pool")
    else:
        for name, body in braw.items():
            b = _backend(p, str(name), body)
            if b is not None:
                backends[str(name)] = b

    routes: list[Route] = []
    rraw = raw.get("routes")
    if not isinstance(rraw, list) or not rraw:
        p.add("routes", "required: a non-empty list of {model, backend[, version]}")
    else:
        for i, body in enumerate(rraw):
            r = _route(p, i, body)
            if r is None:
                continue
            unknown = [b for b in (*r.backends, *((r.mirror.backend,) if r.mirror else ()))
                       if b not in backends and (braw and b not in braw)]
            if unknown:
                where = "split" if r.split else "backend"
                p.add(f"routes[{i}].{where}", f"no backend named {unknown[0]!r}")
                continue
            routes.append(r)

    extra: dict[str, Any] = {}
    if "max_message_bytes" in raw:
        extra["max_message_bytes"] = number(p, "max_message_bytes", raw["max_message_bytes"], int)
    if "workers" in raw:
        extra["workers"] = number(p, "workers", raw["workers"], int)
    if "drain_s" in raw:
        extra["drain_s"] = number(p, "drain_s", raw["drain_s"])
    if "forward_headers" in raw:
        names = raw["forward_headers"]
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            extra["forward_headers"] = tuple(names)
        else:
            p.add("forward_headers", f"expected a list of header names, got {names!r}")
    if "server" in raw:
        server = mapping(p, "server", raw["server"])
        if server is not None:
            p.check_keys("server", server, {"name", "version"})
            for key in ("name", "version"):
                if key in server:
                    if isinstance(server[key], str) and server[key]:
                        extra[f"server_{key}"] = server[key]
                    else:
                        p.add(f"server.{key}", f"expected a non-empty string, got {server[key]!r}")
    for k in ("max_json_depth", "max_header_count", "max_header_bytes"):
        if k in raw:
            extra[k] = number(p, k, raw[k], int)
    if raw.get("auth") is not None:
        extra["auth"] = parse_auth(p, raw["auth"])
    if raw.get("limits") is not None:
        extra["limits"] = parse_limits(p, raw["limits"])
    if raw.get("v1") is not None:
        extra["v1"] = parse_v1(p, raw["v1"])
    if "max_inflight_bytes" in raw:
        extra["max_inflight_bytes"] = number(p, "max_inflight_bytes", raw["max_inflight_bytes"], int)
    if "access_log" in raw:
        value = raw["access_log"]
        if isinstance(value, bool):
            extra["access_log"] = value
        elif isinstance(value, dict):
            p.check_keys("access_log", value, {"sample"})
            sample = number(p, "access_log.sample", value.get("sample", 1.0))
            if sample is not None:
                extra["access_log"] = True
                extra["access_log_sample"] = float(sample)
        else:
            p.add("access_log", f"expected true, false or {{sample: 0.1}}, got {value!r}")

    if p.items or listen is None or health is None or dns is None:
        raise ConfigError(p.items)
    cfg = p.build(
        "(config)",
        lambda: GatewayConfig(backends=backends, routes=tuple(routes), listen=listen, health=health, dns=dns,
                              **extra),
    )
    if p.items or cfg is None:
        raise ConfigError(p.items)
    return cfg


def read_config(path: str | pathlib.Path, unless: bytes | None = None) -> tuple[GatewayConfig | None, bytes]:
    """The config in ``path`` and the SHA-256 of the bytes it was read from; None (not
    parsed) when that digest is ``unless`` — a watched file that did not really change.
    Every file and environment variable it names must exist here (Presence.STRICT)."""
    data, digest = _read(path)
    if digest == unless:
        return None, digest
    raw = _yaml(path, data, digest)
    try:
        return parse_config(raw), digest
    except ConfigError as exc:
        raise ConfigError(exc.problems, digest) from None


@dataclass(frozen=True, slots=True)
class Checked:
    """What ``check_config`` found: ``problems`` (none: the config is valid), and ``notes``,
    one per file or environment variable not present here (Presence.LENIENT only).
    ``config`` is None when there are problems; loaded under Presence.LENIENT it is for
    checking only — a secret not present here holds parsing.NOT_HERE_SECRET."""

    config: GatewayConfig | None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def check_config(path: str | pathlib.Path, presence: Presence = Presence.STRICT) -> Checked:
    """``oip-gateway check``: the config in ``path`` validated under ``presence`` —
    STRICT as ``serve`` loads it, LENIENT where the files and variables it names exist only
    where it runs (a pod's mounted Secrets and environment): those are noted, not problems."""
    p = Problems(presence)
    try:
        data, digest = _read(path)
        config = _parse(p, _yaml(path, data, digest))
    except ConfigError as exc:
        return Checked(None, tuple(exc.problems), tuple(p.notes))
    return Checked(config, (), tuple(p.notes))


def _read(path: str | pathlib.Path) -> tuple[bytes, bytes]:
    """The bytes of the config file and their SHA-256."""
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
    return data, hashlib.sha256(data).digest()


def _yaml(path: str | pathlib.Path, data: bytes, digest: bytes) -> Any:
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"], digest) from exc
    except Exception as exc:
        # PyYAML's constructors fail on a scalar they resolved or were told to build with
        # whatever their code raises (`2024-13-01`: ValueError, `!!float ''`: IndexError,
        # `!!bool x`: KeyError, `!!timestamp x`: AttributeError), and its composer recurses
        # once per nesting level (RecursionError). Parsing does nothing else: all mean bad YAML.
        raise ConfigError([f"{path}: not valid YAML: {type(exc).__name__}: {exc}"], digest) from exc


def load_config(path: str | pathlib.Path) -> GatewayConfig:
    config, _ = read_config(path)
    assert config is not None
    return config
