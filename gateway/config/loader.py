"""YAML → :class:`GatewayConfig`, with one clear message per problem naming the key.

Unknown keys are errors (a typo must not silently fall back to a default).
Every section is checked even after an earlier one failed, so ``oip-gateway
check`` reports all problems at once.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from ..errors import ConfigError
from .schema import Backend, BackendTls, GatewayConfig, Health, HostPort, Listen, Route, Tls

__all__ = ["load_config", "parse_config"]

T = TypeVar("T")

_TOP_KEYS = {"listen", "backends", "routes", "health", "max_message_bytes", "workers", "access_log", "drain_s",
             "max_inflight_bytes", "forward_headers"}
_LISTEN_KEYS = {"http", "grpc", "metrics"}
_TLS_KEYS = {"cert", "key", "client_ca"}
_HEALTH_KEYS = {"interval_s", "timeout_s"}
_BACKEND_KEYS = {"protocol", "endpoints", "timeout_s", "connect_timeout_s", "max_message_bytes", "binary_extension",
                 "max_connections", "balance", "tls"}
_BACKEND_TLS_KEYS = {"ca", "cert", "key", "server_name"}
_ROUTE_KEYS = {"model", "version", "backend"}


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{key}: {message}")

    def check_keys(self, key: str, data: dict[str, Any], allowed: set[str]) -> None:
        for unknown in sorted(set(data) - allowed):
            self.add(f"{key}.{unknown}" if key else unknown, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def build(self, key: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except (ValueError, TypeError) as exc:
            self.add(key, str(exc))
            return None


def _mapping(p: _Problems, key: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        p.add(key, f"expected a mapping, got {type(value).__name__}")
        return None
    return value


def _number(p: _Problems, key: str, value: Any, kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        p.add(key, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
        return None
    return value


def _hostport(p: _Problems, key: str, value: Any) -> HostPort | None:
    return p.build(key, lambda: HostPort.parse(value))


def _listen(p: _Problems, raw: Any) -> Listen | None:
    data = _mapping(p, "listen", raw)
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


def _tls(p: _Problems, raw: Any) -> Tls | None:
    data = _mapping(p, "listen.tls", raw)
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
    return p.build("listen.tls", lambda: Tls(cert=data["cert"], key=data["key"], client_ca=data.get("client_ca")))


def _health(p: _Problems, raw: Any) -> Health | None:
    data = _mapping(p, "health", raw)
    if data is None:
        return None
    p.check_keys("health", data, _HEALTH_KEYS)
    kwargs = {k: _number(p, f"health.{k}", v) for k, v in data.items() if k in _HEALTH_KEYS}
    if any(v is None for v in kwargs.values()):
        return None
    return p.build("health", lambda: Health(**kwargs))


def _backend(p: _Problems, name: str, raw: Any) -> Backend | None:
    key = f"backends.{name}"
    data = _mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _BACKEND_KEYS)
    ok = True
    if "protocol" not in data:
        p.add(f"{key}.protocol", "required (http or grpc)")
        ok = False
    eps_raw = data.get("endpoints")
    endpoints: list[HostPort] = []
    if not isinstance(eps_raw, list) or not eps_raw:
        p.add(f"{key}.endpoints", "required: a non-empty list of host:port")
        ok = False
    else:
        for i, ep in enumerate(eps_raw):
            hp = _hostport(p, f"{key}.endpoints[{i}]", ep)
            if hp is None:
                ok = False
            else:
                endpoints.append(hp)
    kwargs: dict[str, Any] = {}
    for k in ("timeout_s", "connect_timeout_s", "max_message_bytes", "max_connections"):
        if k in data:
            kwargs[k] = _number(p, f"{key}.{k}", data[k], int if k.startswith("max_") else float)
            ok = ok and kwargs[k] is not None
    if "binary_extension" in data:
        if not isinstance(data["binary_extension"], bool):
            p.add(f"{key}.binary_extension", f"expected true or false, got {data['binary_extension']!r}")
            ok = False
        else:
            kwargs["binary_extension"] = data["binary_extension"]
    if "balance" in data:
        kwargs["balance"] = data["balance"]  # its values are checked by Backend
    if data.get("tls") is not None:
        tls = data["tls"]
        if tls is True:
            kwargs["tls"] = BackendTls()  # the system's CAs, no client certificate
        elif isinstance(tls, dict):
            p.check_keys(f"{key}.tls", tls, _BACKEND_TLS_KEYS)
            bad = [k for k in _BACKEND_TLS_KEYS if k in tls and not isinstance(tls[k], str)]
            for k in bad:
                p.add(f"{key}.tls.{k}", f"expected a string, got {tls[k]!r}")
            built = None if bad else p.build(f"{key}.tls", lambda: BackendTls(
                **{k: tls[k] for k in _BACKEND_TLS_KEYS if k in tls}))
            ok = ok and built is not None
            kwargs["tls"] = built
        elif tls is not False:
            p.add(f"{key}.tls", f"expected true, false or a mapping (ca, cert, key, server_name), got {tls!r}")
            ok = False
    if not ok:
        return None
    return p.build(key, lambda: Backend(name=name, protocol=data["protocol"], endpoints=tuple(endpoints), **kwargs))


def _route(p: _Problems, i: int, raw: Any) -> Route | None:
    key = f"routes[{i}]"
    data = _mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _ROUTE_KEYS)
    ok = True
    for req in ("model", "backend"):
        if not isinstance(data.get(req), str) or not data.get(req):
            p.add(f"{key}.{req}", "required: a non-empty string")
            ok = False
    version = data.get("version")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, (str, int)):
            p.add(f"{key}.version", f"expected a string, got {version!r}")
            ok = False
        else:
            version = str(version)  # YAML reads `version: 1` as an int; V2 versions are strings
    if not ok:
        return None
    return p.build(key, lambda: Route(model=data["model"], backend=data["backend"], version=version))


def parse_config(raw: Any) -> GatewayConfig:
    """Validate an already-parsed YAML document. Raises ConfigError listing every problem."""
    p = _Problems()
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): expected a mapping with listen, backends and routes"])
    p.check_keys("", raw, _TOP_KEYS)

    listen = _listen(p, raw.get("listen")) if "listen" in raw else Listen()
    health = _health(p, raw.get("health")) if "health" in raw else Health()

    backends: dict[str, Backend] = {}
    braw = _mapping(p, "backends", raw.get("backends"))
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
            if r.backend not in backends and (braw and r.backend not in braw):
                p.add(f"routes[{i}].backend", f"no backend named {r.backend!r}")
                continue
            routes.append(r)

    extra: dict[str, Any] = {}
    if "max_message_bytes" in raw:
        extra["max_message_bytes"] = _number(p, "max_message_bytes", raw["max_message_bytes"], int)
    if "workers" in raw:
        extra["workers"] = _number(p, "workers", raw["workers"], int)
    if "drain_s" in raw:
        extra["drain_s"] = _number(p, "drain_s", raw["drain_s"])
    if "forward_headers" in raw:
        names = raw["forward_headers"]
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            extra["forward_headers"] = tuple(names)
        else:
            p.add("forward_headers", f"expected a list of header names, got {names!r}")
    if "max_inflight_bytes" in raw:
        extra["max_inflight_bytes"] = _number(p, "max_inflight_bytes", raw["max_inflight_bytes"], int)
    if "access_log" in raw:
        if isinstance(raw["access_log"], bool):
            extra["access_log"] = raw["access_log"]
        else:
            p.add("access_log", f"expected true or false, got {raw['access_log']!r}")

    if p.items:
        raise ConfigError(p.items)
    cfg = p.build(
        "(config)",
        lambda: GatewayConfig(backends=backends, routes=tuple(routes), listen=listen, health=health, **extra),  # type: ignore[arg-type]
    )
    if p.items or cfg is None:
        raise ConfigError(p.items)
    return cfg


def load_config(path: str | pathlib.Path) -> GatewayConfig:
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from exc
    return parse_config(raw)
