"""YAML → :class:`GatewayConfig`, with one clear message per problem naming the key.

Unknown keys are errors (a typo must not silently fall back to a default).
Every section is checked even after an earlier one failed, so ``oip-gateway
check`` reports all problems at once.

Each section's parser lives with its dataclasses (``network``, ``backends``, ``routes``,
``security``, ``v1``); this module checks the top level and ``health``, and reads the file.
"""
from __future__ import annotations

import hashlib
import pathlib
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from .backends import BackendSpec, _backend
from .network import Dns, Listen, _dns, _listen, _peers
from .parsing import Presence, Problems, _section, mapping, number
from .routes import Route, _route
from .schema import GatewayConfig, Health
from .security import parse_auth, parse_limits
from .v1 import parse_v1

__all__ = ["Checked", "check_config", "load_config", "parse_config", "read_config"]

_TOP_KEYS = {"listen", "backends", "routes", "health", "max_message_bytes", "workers", "access_log", "drain_s",
             "max_inflight_bytes", "forward_headers", "dns", "server", "max_json_depth",
             "max_header_count", "max_header_bytes", "auth", "limits", "v1", "peers"}
_HEALTH_KEYS = {"interval_s", "timeout_s", "unhealthy_threshold", "healthy_threshold"}


def _health(p: Problems, raw: Any) -> Health | None:
    return _section(p, "health", raw, _HEALTH_KEYS, Health, ints=("unhealthy_threshold", "healthy_threshold"))


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

    backends: dict[str, BackendSpec] = {}
    braw = mapping(p, "backends", raw.get("backends"))
    if not braw:
        p.add("backends", "required: at least one named backend")
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
    if raw.get("peers") is not None:
        extra["peers"] = _peers(p, raw["peers"])
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
