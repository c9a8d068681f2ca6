"""The memory limit the gateway runs under, for admission control's default.

In a Kubernetes pod (or any cgroup v2 with ``memory.max``), the kernel OOM-kills a process
that passes the limit; a burst of large requests the gateway would happily accept can do
that. When ``max_inflight_bytes`` is not set, admission control sizes itself from the limit:
a fifth of it, shared by the worker processes (a converting request peaks at up to ~8 × its
payload, a pass-through at ~1 ×: README "Memory and large tensors"), so a burst past it gets
503 / UNAVAILABLE with Retry-After instead of an OOM kill. Read once at start-up.

``OIP_GATEWAY_MEMORY_LIMIT`` (bytes) stands in for the cgroup's limit where there is none to
read (or to test with one).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SHARE", "auto_inflight_limit", "memory_limit"]

SHARE = 5  # admission control's default: memory limit / SHARE / workers


def memory_limit(environ: Mapping[str, str] | None = None, proc: Path = Path("/proc/self/cgroup"),
                 root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The tightest cgroup v2 ``memory.max`` over this process's cgroup and its parents, in
    bytes (``OIP_GATEWAY_MEMORY_LIMIT`` first); None when unlimited or unknown."""
    environ = os.environ if environ is None else environ
    given = environ.get("OIP_GATEWAY_MEMORY_LIMIT", "").strip()
    if given:
        return int(given) if given.isascii() and given.isdigit() and int(given) > 0 else None
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)  # cgroup v2: "0::/a/b"
    if path is None:
        return None
    limits = []
    where = (root / path.lstrip("/")).resolve()
    while True:
        try:
            text = (where / "memory.max").read_text().strip()
        except OSError:
            text = ""
        if text.isascii() and text.isdigit():
            limits.append(int(text))
        if where == root.resolve() or where.parent == where:
            break
        where = where.parent
    return min(limits) if limits else None


def auto_inflight_limit(limit: int | None, workers: int) -> int:
    """``max_inflight_bytes`` when the config leaves it unset: a share of the memory limit
    per worker, or 0 (off) without a limit."""
    if limit is None:
        return 0
    return max(1, limit // SHARE // max(1, workers))
