"""The ``routes`` section: which backend takes a request (model name or glob, version, headers),
weighted splits and mirrors — their frozen dataclasses and their parser (the conventions of
``loader.py``)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from .parsing import Problems, mapping, number
from .security import Rate, parse_rate

__all__ = ["Mirror", "Route", "Side"]

_ROUTE_KEYS = {"model", "version", "backend", "split", "headers", "mirror", "auth", "rate", "stateful", "hold_s"}
_SIDE_KEYS = {"backend", "weight"}
_MIRROR_KEYS = {"backend", "percent", "max_inflight"}
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a weighted split: a backend and its share (any positive weight)."""

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
    backend; a weighted ``split`` names several (``backend`` is then its first side's).
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
    # Seconds a request waits for a model that is ready nowhere yet (pods starting, a scale-up
    # from zero, a placement pool loading it) before the 503; 0: answered at once.
    hold_s: float = 0.0

    @property
    def is_glob(self) -> bool:
        return any(c in self.model for c in "*?[")

    @property
    def backends(self) -> tuple[str, ...]:
        """Every backend the route sends requests to (not its mirror)."""
        return tuple(s.backend for s in self.split) if self.split else (self.backend,)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is empty")
        if self.split and len({s.backend for s in self.split}) != len(self.split):
            raise ValueError("a split names a backend twice")
        if not 0 <= self.hold_s <= 3600:
            raise ValueError("hold_s must be between 0 and 3600")


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
    hold_s = number(p, f"{key}.hold_s", data["hold_s"], float) if "hold_s" in data else 0.0
    ok = ok and hold_s is not None
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
                                      rate=rate, stateful=stateful, hold_s=hold_s or 0.0))
