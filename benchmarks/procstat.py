"""CPU time and memory of a process tree, read from /proc (Linux only).

CPU: ``utime + stime`` (fields 14 and 15 of /proc/<pid>/stat, in clock ticks, all threads of the
process) summed over the root and its descendants (nginx master + workers, gateway supervisor +
workers). Sampled every 100 ms during a run; CPU per request is the CPU used between the first and
the last completion of the run over the requests completed in between (Sampler.cpu_between).
Memory: the sum of VmRSS over the tree at the same samples; its maximum is the run's peak.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

__all__ = ["Sampler", "cpu_seconds", "rss_bytes", "settle", "system_busy_seconds", "tree_pids"]

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


def system_busy_seconds() -> float:
    """CPU seconds all processes on the machine have used (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


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


class Sampler:
    """While the ``with`` block runs, samples (time, proxy CPU s, backend CPU s) every ``interval`` and
    tracks the peak of the proxy tree's summed RSS.

    ``cpu_between(t0, t1)`` interpolates the CPU used between two wall-clock instants, so CPU per
    request can be taken over exactly the window in which the counted requests completed.
    """

    def __init__(self, proxy: int | None, backend: int | None, interval: float = 0.1) -> None:
        self.proxy, self.backend, self.interval = proxy, backend, interval
        self.peak_rss = 0
        self.start_rss: int | None = None
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.time(), cpu_seconds(self.proxy), cpu_seconds(self.backend)))
        if self.proxy is not None:
            rss = rss_bytes(self.proxy)
            self.peak_rss = max(self.peak_rss, rss)
            if self.start_rss is None:
                self.start_rss = rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def total(self) -> tuple[float, float]:
        (_, p0, b0), (_, p1, b1) = self.samples[0], self.samples[-1]
        return p1 - p0, b1 - b0

    def cpu_between(self, t0: float, t1: float) -> tuple[float, float]:
        ts = np.array([s[0] for s in self.samples])
        proxy = np.array([s[1] for s in self.samples])
        backend = np.array([s[2] for s in self.samples])
        at = lambda series, t: float(np.interp(t, ts, series))
        return at(proxy, t1) - at(proxy, t0), at(backend, t1) - at(backend, t0)


def settle(pids: list[int | None], *, busy: float = 0.1, period: float = 0.25, timeout: float = 60.0) -> float:
    """Wait until every tree in ``pids`` uses less than ``busy`` of a core over ``period``; return the wait.

    A run that ends with requests in flight leaves work behind (Triton keeps executing requests
    whose client has gone); the next target must not pay for it.
    """
    roots = [p for p in pids if p is not None]
    began = time.monotonic()
    before = [cpu_seconds(p) for p in roots]
    while time.monotonic() - began < timeout:
        time.sleep(period)
        after = [cpu_seconds(p) for p in roots]
        if all(a - b < busy * period for a, b in zip(after, before)):
            break
        before = after
    return time.monotonic() - began
