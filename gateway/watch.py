"""Watching the config file for ``--watch`` (no I/O on the hot path; polled).

A change is seen through ``os.stat`` of the path, which follows symlinks: an
editor's write (mtime, size), an atomic rename (inode), and Kubernetes' ConfigMap
update, which swaps the ``..data`` symlink the mounted file points through (the
resolved inode changes). Polling four times a second costs a few stat calls; a
file briefly missing mid-swap is waited out, not reported. Content that did not
really change (a touch) triggers nothing.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable

__all__ = ["WATCH_INTERVAL_S", "watch_file"]

WATCH_INTERVAL_S = 0.25


def _stat(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _digest(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).digest()
    except OSError:
        return None


async def watch_file(path: str, on_change: Callable[[], Awaitable[object]],
                     interval: float = WATCH_INTERVAL_S) -> None:
    """Call ``on_change`` after each change of ``path``'s content, until cancelled."""
    seen = _stat(path)
    digest = _digest(path)
    while True:
        await asyncio.sleep(interval)
        now = _stat(path)
        if now is None or now == seen:
            continue
        seen = now
        new = _digest(path)
        if new is None or new == digest:
            continue
        digest = new
        await on_change()
