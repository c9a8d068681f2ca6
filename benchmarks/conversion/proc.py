"""Counters of one process from /proc (Linux): CPU ticks, minor faults, RSS and its peak.

CPU is ``utime`` and ``stime`` of /proc/<pid>/stat (fields 14 and 15, clock ticks summed
over all threads of the process, live and exited), so gRPC's C-core threads count too.
``minflt`` (field 10) counts minor page faults: each first touch of a fresh anonymous
page is one, which is how large fresh allocations show up.

Peak memory is the kernel's ``VmHWM`` (/proc/<pid>/status), which it updates on every
page it maps, so no short peak is missed — a 64 MB copy lasts ~10–30 ms here and a 50 ms
RSS sampler can miss it. VmHWM only grows, so :func:`reset_peak` writes ``5`` to
/proc/<pid>/clear_refs, which sets it back to the current RSS (Linux ≥ 4.0; needs the
process's owner). Where that write fails, the caller reports the peak relative to
``max(RSS, VmHWM)`` at the reset point instead (``peak_reset=False`` in the results).
(benchmarks/procstat.py, the load benchmark's helper, sums a process *tree* and samples
RSS; this one needs the per-process split, fault counts and the exact peak.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Counters", "counters", "memory", "reset_peak"]

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counters:
    user_s: float
    sys_s: float
    minflt: int

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.user_s - other.user_s, self.sys_s - other.sys_s, self.minflt - other.minflt)


def counters(pid: int) -> Counters:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    # Field 2 (comm) may hold spaces; field 3 starts after the last ')'.
    f = text[text.rindex(")") + 2 :].split()
    return Counters(int(f[11]) / TICK, int(f[12]) / TICK, int(f[7]))  # utime, stime, minflt


def memory(pid: int) -> dict[str, int]:
    """``{"rss": VmRSS, "hwm": VmHWM}`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                out["hwm"] = int(line.split()[1]) * 1024
    return out


def reset_peak(pid: int) -> bool:
    """Set VmHWM back to the current RSS; False when the kernel refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False
