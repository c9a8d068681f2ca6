"""The memory limit the gateway runs under, for admission control's default.

In a Kubernetes pod (cgroup v2 ``memory.max``, or cgroup v1 ``memory.limit_in_bytes`` on
older nodes), the kernel OOM-kills a process that passes the limit; a burst of large requests
the gateway would happily accept can do that. When ``max_inflight_bytes`` is not set,
admission control sizes itself from the limit: a fifth of it, shared by the worker processes
(each request counted as what its path holds: ``admission.COST_*``), so a burst past it gets
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
    """The tightest memory limit over this process's cgroup and its parents, in bytes
    (``OIP_GATEWAY_MEMORY_LIMIT`` first); None when unlimited or unknown. cgroup v2
    (``memory.max``, line ``0::/path`` of /proc/self/cgroup) and cgroup v1's memory controller
    (``memory.limit_in_bytes`` under ``<root>/memory``, line ``N:memory:/path``: nodes that still
    run v1, and containers given one by ``docker run --memory`` there) are both read."""
    environ = os.environ if environ is None else environ
    given = environ.get("OIP_GATEWAY_MEMORY_LIMIT", "").strip()
    if given:
        return int(given) if given.isascii() and given.isdigit() and int(given) > 0 else None
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # cgroup v2: "0::/a/b"
            limits += _walk(root, path, "memory.max")
        elif "memory" in controllers.split(","):  # cgroup v1: "4:memory:/a/b"
            limits += _walk(root / "memory", path, "memory.limit_in_bytes")
    return min(limits) if limits else None


# cgroup v1 writes "no limit" as the largest page count in bytes (9223372036854771712 on x86-64).
_V1_UNLIMITED = 1 << 62


def _walk(root: Path, path: str, name: str) -> list[int]:
    """The limits set in ``name`` from the cgroup at ``path`` up to ``root``. Directories that
    are not there are passed over: in a container the cgroup's own directory is often mounted
    as the root while /proc/self/cgroup names its path on the host."""
    limits = []
    top = root.resolve()
    where = (root / path.strip().lstrip("/")).resolve()
    if not where.is_relative_to(top):
        where = top
    while True:
        try:
            text = (where / name).read_text().strip()
        except OSError:
            text = ""
        if text.isascii() and text.isdigit() and int(text) < _V1_UNLIMITED:
            limits.append(int(text))
        if where == top or where.parent == where:
            break
        where = where.parent
    return limits


def auto_inflight_limit(limit: int | None, workers: int) -> int:
    """``max_inflight_bytes`` when the config leaves it unset: a share of the memory limit
    per worker, or 0 (off) without a limit."""
    if limit is None:
        return 0
    return max(1, limit // SHARE // max(1, workers))
