"""py-spy on the gateway during large conversions: where its CPU time goes.

``py-spy record --native`` samples the gateway's *Python* threads with their native
frames (so a ``b"".join`` or a page-faulting memcpy shows under the Python line that
called it). gRPC's C-core threads carry no Python state and are invisible to py-spy,
so the per-thread CPU from /proc/<pid>/task/*/stat is recorded beside the samples.
libc on this machine is stripped: its frames show as addresses and are grouped as
``libc.so.6`` (memcpy/memmove/memset and the page faults they take are most of them).
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import proc

__all__ = ["py_spy", "ThreadCpu", "Recorder", "summarize"]

_ADDR = re.compile(r"^0x[0-9a-f]+ \((.+)\)$")
_PY = re.compile(r"^(.*) \((.+\.py):(\d+)\)$")


def py_spy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


class ThreadCpu:
    """utime+stime per thread name of one process, over a window."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self._read()

    def _read(self) -> dict[str, tuple[str, float]]:
        out = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat") as fh:
                    text = fh.read()
            except OSError:
                continue
            name = text[text.index("(") + 1 : text.rindex(")")]
            f = text[text.rindex(")") + 2 :].split()
            out[tid] = (name, (int(f[11]) + int(f[12])) / proc.TICK)
        return out

    def delta(self) -> dict[str, float]:
        """CPU seconds per thread name (threads of one name summed; exited threads are lost)."""
        by_name: dict[str, float] = collections.defaultdict(float)
        for tid, (name, cpu) in self._read().items():
            by_name[name] += cpu - self.start.get(tid, (name, 0.0))[1]
        return dict(sorted(by_name.items(), key=lambda kv: -kv[1]))


class Recorder:
    """``py-spy record`` attached to ``pid`` until :meth:`stop` (SIGINT makes it write the file)."""

    def __init__(self, exe: str, pid: int, out: Path, rate: int = 200) -> None:
        self.out = out
        self.log = out.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--rate", str(rate), "--native", "--full-filenames",
                 "--format", "raw", "--output", str(out)],
                stdout=log, stderr=subprocess.STDOUT,
            )

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _short(frame: str, root: str) -> str:
    m = _ADDR.match(frame)
    if m:
        return m.group(1)  # "libc.so.6" etc.: unresolved native address
    m = _PY.match(frame)
    if m:
        name, file, line = m.groups()
        for marker in (root + "/", "/site-packages/", "/lib/python3."):
            if marker in file:
                file = file.split(marker, 1)[1]
                if marker == "/lib/python3.":
                    file = "stdlib/" + file.split("/", 1)[1]
                break
        return f"{name} ({file}:{line})"
    return frame


def summarize(raw: Path, root: str, top: int = 15) -> dict[str, Any]:
    """Self time by leaf, time by the deepest Python line (native work below it included),
    and inclusive time of gateway/ lines, each as a share of all samples."""
    leaf: collections.Counter[str] = collections.Counter()
    py_line: collections.Counter[str] = collections.Counter()
    gateway: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_short(f, root) for f in stack.split(";")]
        leaf[frames[-1]] += n
        py = [f for f in frames if f.endswith(")") and ".py:" in f]
        if py:
            py_line[py[-1]] += n
        for f in dict.fromkeys(f for f in py if "gateway/" in f.split("(", 1)[1]):
            gateway[f] += n

    def share(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in c.most_common(top)] if total else []

    return {"samples": total, "self": share(leaf), "deepest_python_line": share(py_line),
            "gateway_inclusive": share(gateway)}
