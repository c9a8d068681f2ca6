"""The security sections of the config: ``auth`` (API keys, JWT), rate limits and ``limits``.

Frozen dataclasses validated once at load, and their parsers (same conventions as
``loader.py``: one problem per bad key, every key checked). Secrets are never
kept in a ``repr`` and never named in a problem: a problem names the variable or
the file, not its content.
"""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .parsing import NOT_HERE, NOT_HERE_SECRET, Problems, mapping, number, read_file, secret

__all__ = ["ApiKey", "Auth", "Jwt", "Limits", "Rate", "parse_auth", "parse_limits", "parse_rate"]

# Algorithms a JWKS key can verify. "none" and the HMAC family are not offered: an HMAC
# "public" key in a JWKS would be a shared secret, and "none" verifies nothing.
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``per_s`` requests per second on average, ``burst`` at once."""

    per_s: float
    burst: int

    def __post_init__(self) -> None:
        if not self.per_s > 0:
            raise ValueError(f"per_s must be > 0, got {self.per_s}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One bearer key. ``name`` is what logs show (never the key); ``source`` is where the
    key is read — ``("file", path)`` (re-read when the file changes: a rotated Kubernetes
    Secret) or ``("env", variable)``; ``models``: globs of the models it may use (empty:
    every model); ``control``: it may load/unload models and change trace/log settings."""

    name: str
    source: tuple[str, str]
    value: str = field(repr=False, compare=False)
    models: tuple[str, ...] = ()
    control: bool = False
    rate: Rate | None = None


@dataclass(frozen=True, slots=True)
class Jwt:
    """JWT bearer tokens verified against the public keys of a JWKS file (re-read when it
    changes). ``models_claim``: a claim listing the model globs the token may use (absent
    from a token: no model); unset: every model. ``control_claim``: a boolean claim that
    allows model control and settings. ``rate``: a bucket per token subject (``sub``)."""

    jwks_file: str
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = 30.0
    models_claim: str | None = None
    control_claim: str | None = None
    rate: Rate | None = None

    def __post_init__(self) -> None:
        bad = [a for a in self.algorithms if a not in JWT_ALGORITHMS]
        if bad or not self.algorithms:
            raise ValueError(f"algorithms: expected some of {', '.join(JWT_ALGORITHMS)}, got {list(self.algorithms)}")
        if self.leeway_s < 0:
            raise ValueError("leeway_s must be >= 0")


@dataclass(frozen=True, slots=True)
class Auth:
    """Who may call. With an ``auth`` section every route needs a credential unless it says
    ``auth: false``; model control and settings always do. Health endpoints never do;
    metadata endpoints (server/model metadata, model readiness, config, statistics, the
    repository index) only with ``protect_metadata``."""

    keys: tuple[ApiKey, ...] = ()
    jwt: Jwt | None = None
    protect_metadata: bool = False

    def __post_init__(self) -> None:
        if not self.keys and self.jwt is None:
            raise ValueError("auth needs keys, jwt or both")
        names = [k.name for k in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("two keys share a name")


MAX_ELEMENTS_CAP = 1 << 56


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits on what one request may hold (each refusal names its key). Checked
    wherever the gateway reads a request, pass-through included."""

    max_tensors: int = 1024  # inputs, and requested outputs, each
    max_dims: int = 32  # dimensions of one tensor's shape
    max_elements: int = 1 << 31  # elements of one tensor (the shape's product)
    max_name_length: int = 512  # model, version and tensor names
    max_id_length: int = 1024  # request ids (and sequence ids given as strings)
    max_grpc_streams: int = 1024  # concurrent calls on one gRPC connection (HTTP/2 streams)
    max_connections: int = 10000  # open connections per listener (HTTP; gRPC: see docs/config.md)
    header_timeout_s: float = 30.0  # a request head must arrive within this (slowloris)
    body_timeout_s: float = 60.0  # longest pause while a request body is arriving
    idle_timeout_s: float = 75.0  # keep-alive: an idle connection is closed after this

    def __post_init__(self) -> None:
        for name in ("max_tensors", "max_dims", "max_elements", "max_name_length", "max_id_length",
                     "max_grpc_streams", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_elements > MAX_ELEMENTS_CAP:
            # Backends size a tensor's buffer as elements × up to 8 bytes in 64-bit arithmetic
            # (codec/limits.py _NONZERO): past this that product can wrap.
            raise ValueError(f"max_elements must be <= 2**56 ({MAX_ELEMENTS_CAP})")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


_RATE_KEYS = {"per_s", "burst"}
_KEY_KEYS = {"name", "key", "models", "control", "rate"}
_JWT_KEYS = {"jwks_file", "algorithms", "issuer", "audience", "leeway_s", "models_claim", "control_claim", "rate"}
_AUTH_KEYS = {"keys", "jwt", "protect_metadata"}
_LIMIT_INTS = ("max_tensors", "max_dims", "max_elements", "max_name_length", "max_id_length", "max_grpc_streams",
               "max_connections")
_LIMIT_FLOATS = ("header_timeout_s", "body_timeout_s", "idle_timeout_s")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def parse_rate(p: Problems, key: str, raw: Any) -> Rate | None:
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _RATE_KEYS)
    if "per_s" not in data:
        p.add(f"{key}.per_s", "required: requests per second (a positive number)")
        return None
    per_s = number(p, f"{key}.per_s", data["per_s"])
    burst = number(p, f"{key}.burst", data["burst"], int) if "burst" in data else None
    if per_s is None or ("burst" in data and burst is None):
        return None
    # Without a burst, one second's worth (at least one request).
    return p.build(key, lambda: Rate(float(per_s), burst if burst is not None else max(1, int(per_s))))


def _globs(p: Problems, key: str, raw: Any) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or not raw or not all(isinstance(g, str) and g for g in raw):
        p.add(key, f"expected a non-empty list of model names or globs, got {raw!r}")
        return None
    for g in raw:
        fnmatch.translate(g)  # never raises; kept to say globs are fnmatch's
    return tuple(raw)


def _bool(p: Problems, key: str, raw: Any) -> bool | None:
    if not isinstance(raw, bool):
        p.add(key, f"expected true or false, got {raw!r}")
        return None
    return raw


def _api_key(p: Problems, i: int, raw: Any) -> ApiKey | None:
    key = f"auth.keys[{i}]"
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, _KEY_KEYS)
    name = data.get("name")
    ok = True
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        p.add(f"{key}.name", "required: a short name (letters, digits, . _ -) for logs")
        ok = False
    if "key" not in data:
        p.add(f"{key}.key", "required: {file: PATH} or {env: VARIABLE}")
        return None
    value = secret(p, f"{key}.key", data["key"])
    if value is not None and value is not NOT_HERE_SECRET and len(value) < 16:
        p.add(f"{key}.key", "too short: a key needs at least 16 characters")
        value = None
    models = _globs(p, f"{key}.models", data["models"]) if "models" in data else ()
    control = _bool(p, f"{key}.control", data["control"]) if "control" in data else False
    rate = parse_rate(p, f"{key}.rate", data["rate"]) if data.get("rate") is not None else None
    if not ok or value is None or models is None or control is None or (data.get("rate") is not None and
                                                                        rate is None):
        return None
    (kind, where), = data["key"].items()
    return ApiKey(name=name, source=(kind, where), value=value, models=models, control=control,  # type: ignore[arg-type]
                  rate=rate)


def _jwt(p: Problems, raw: Any) -> Jwt | None:
    data = mapping(p, "auth.jwt", raw)
    if data is None:
        return None
    p.check_keys("auth.jwt", data, _JWT_KEYS)
    path = data.get("jwks_file")
    if not isinstance(path, str) or not path:
        p.add("auth.jwt.jwks_file", "required: path of a JWKS (JSON Web Key Set) file")
        return None
    text = read_file(p, "auth.jwt.jwks_file", path)
    if text is None:
        return None
    if text is not NOT_HERE:  # not present here (Presence.LENIENT): checked where it runs
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
                raise ValueError("no keys list")
        except ValueError:
            p.add("auth.jwt.jwks_file", f"{path} is not a JWKS document (a JSON object with a keys list)")
            return None
    kwargs: dict[str, Any] = {}
    ok = True
    if "algorithms" in data:
        algs = data["algorithms"]
        if not isinstance(algs, list) or not all(isinstance(a, str) for a in algs):
            p.add("auth.jwt.algorithms", f"expected a list of algorithm names, got {algs!r}")
            ok = False
        else:
            kwargs["algorithms"] = tuple(algs)
    for k in ("issuer", "audience", "models_claim", "control_claim"):
        if k in data:
            if not isinstance(data[k], str) or not data[k]:
                p.add(f"auth.jwt.{k}", f"expected a non-empty string, got {data[k]!r}")
                ok = False
            else:
                kwargs[k] = data[k]
    if "leeway_s" in data:
        kwargs["leeway_s"] = number(p, "auth.jwt.leeway_s", data["leeway_s"])
        ok = ok and kwargs["leeway_s"] is not None
    if data.get("rate") is not None:
        kwargs["rate"] = parse_rate(p, "auth.jwt.rate", data["rate"])
        ok = ok and kwargs["rate"] is not None
    if not ok:
        return None
    return p.build("auth.jwt", lambda: Jwt(jwks_file=path, **kwargs))


def parse_auth(p: Problems, raw: Any) -> Auth | None:
    data = mapping(p, "auth", raw)
    if data is None:
        return None
    p.check_keys("auth", data, _AUTH_KEYS)
    before = len(p.items)
    keys: list[ApiKey] = []
    if "keys" in data:
        if not isinstance(data["keys"], list):
            p.add("auth.keys", "expected a list of {name, key, models, control, rate}")
        else:
            keys = [k for i, body in enumerate(data["keys"]) if (k := _api_key(p, i, body)) is not None]
    jwt = _jwt(p, data["jwt"]) if data.get("jwt") is not None else None
    protect = _bool(p, "auth.protect_metadata", data["protect_metadata"]) if "protect_metadata" in data else False
    if len(p.items) > before or protect is None:
        return None
    return p.build("auth", lambda: Auth(keys=tuple(keys), jwt=jwt, protect_metadata=protect))


def parse_limits(p: Problems, raw: Any) -> Limits | None:
    data = mapping(p, "limits", raw)
    if data is None:
        return None
    p.check_keys("limits", data, set(_LIMIT_INTS) | set(_LIMIT_FLOATS))
    kwargs = {k: number(p, f"limits.{k}", v, int if k in _LIMIT_INTS else float) for k, v in data.items()
              if k in _LIMIT_INTS or k in _LIMIT_FLOATS}
    if any(v is None for v in kwargs.values()):
        return None
    return p.build("limits", lambda: Limits(**kwargs))
