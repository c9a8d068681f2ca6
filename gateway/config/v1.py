"""The ``v1`` config section: the first-generation API bridge (docs/v1-bridge.md).

``ready``: how ``/api/health/ready`` (and gRPC Health "ready") answer — ``strict``, the
first-generation server's default, ready only when every model can be served (the
gateway's own readiness); ``non_strict`` (its ``--strict-readiness=false``), ready while
the gateway is responsive. ``model_repositories``: directories holding the backends'
model repositories as the gateway can read them (a shared volume): label files a model's
configuration names (``label_filename``) are read from ``<dir>/<model>/<file>`` for
classification answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["V1_KEYS", "V1Api", "parse_v1"]

V1_KEYS = {"ready", "model_repositories"}
READY = ("strict", "non_strict")


@dataclass(frozen=True, slots=True)
class V1Api:
    ready: str = "strict"
    model_repositories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.ready not in READY:
            raise ValueError(f"ready must be 'strict' or 'non_strict', got {self.ready!r}")


class _Problems(Protocol):
    def add(self, key: str, message: str) -> None: ...

    def check_keys(self, key: str, data: dict[str, Any], allowed: set[str]) -> None: ...


def parse_v1(p: _Problems, raw: Any) -> V1Api | None:
    if not isinstance(raw, dict):
        p.add("v1", f"expected a mapping (ready, model_repositories), got {type(raw).__name__}")
        return None
    p.check_keys("v1", raw, V1_KEYS)
    ready = raw.get("ready", "strict")
    if ready not in READY:
        p.add("v1.ready", f"expected 'strict' or 'non_strict', got {ready!r}")
        return None
    dirs = raw.get("model_repositories", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
        p.add("v1.model_repositories", f"expected a list of directory paths, got {dirs!r}")
        return None
    return V1Api(ready=ready, model_repositories=tuple(dirs))
