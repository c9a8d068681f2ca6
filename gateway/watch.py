"""Watching the config file for ``--watch`` (no I/O on the hot path; polled).

A change is seen through ``os.stat`` of the path, which follows symlinks: an
editor's write (mtime, size), an atomic rename (inode), and Kubernetes' ConfigMap
update, which swaps the ``..data`` symlink the mounted file points through (the
resolved inode changes). Polling four times a second costs a few stat calls; a
file briefly missing mid-swap is waited out, not reported. Every ``recheck_every``
polls ``on_change`` runs anyway: a rewrite of the same size within one tick of a
coarse file-system clock leaves the stat unchanged. Whether the content really
changed is for ``on_change`` to decide: it knows what was last loaded, also by a
SIGHUP in between (a digest: Gateway.reload_file(if_changed=True)).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .fileid import file_id

__all__ = ["WATCH_INTERVAL_S", "watch_file"]

log = logging.getLogger("oip_gateway.watch")

WATCH_INTERVAL_S = 0.25


async def watch_file(path: str, on_change: Callable[[], Awaitable[object]],
                     interval: float = WATCH_INTERVAL_S, recheck_every: int = 8) -> None:
    """Call ``on_change`` after each change of ``path``'s file (and every
    ``recheck_every`` polls), until cancelled."""
    seen = file_id(path)
    polls = 0
    while True:
        await asyncio.sleep(interval)
        polls += 1
        now = file_id(path)
        if now is None or (now == seen and polls % recheck_every):
            continue
        seen = now
        try:
            await on_change()
        except Exception:  # a failed reload must not end the watch
            log.exception("reacting to a change of %s failed", path)
