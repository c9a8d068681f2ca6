"""CPU time and memory of a process tree, read from /proc (Linux only).

CPU: ``utime + stime`` (fields 14 and 15 of /proc/<pid>/stat, in clock ticks, all threads of the
process) summed over the root and its descendants (nginx master + workers, gateway supervisor +
workers). Sampled before and after a run; the difference over the completed requests is the CPU
per request. Memory: the sum of VmRSS over the tree, sampled every 50 ms during the run; its
maximum is the run's peak.
"""
from __future__ import annotations

import os
import threading

__all__ = ["tree_pids", "cpu_seconds", "rss_bytes", "RssSampler"]

_TICK = os.sysconf("SC_CLK_TCK")


def tree_pids(root: int) -> list[int]:
    pids = [root]
    i = 0
    while i < len(pids):
        pid = pids[i]
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    pids.extend(int(c) for c in fh.read().split())
        except OSError:
            pass
        i += 1
    return pids


def _cpu_one(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces; the fields after it start past the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def cpu_seconds(root: int | None) -> float:
    if root is None:
        return 0.0
    return sum(_cpu_one(p) for p in tree_pids(root))


def _rss_one(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes(root: int | None) -> int:
    if root is None:
        return 0
    return sum(_rss_one(p) for p in tree_pids(root))


class RssSampler:
    """Peak of the tree's summed RSS while the ``with`` block runs."""

    def __init__(self, root: int | None, interval: float = 0.05) -> None:
        self.root = root
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.root))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "RssSampler":
        if self.root is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.root is not None:
            self.peak = max(self.peak, rss_bytes(self.root))
