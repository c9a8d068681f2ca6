"""Profilers on the gateway during large conversions: where its CPU time goes.

* ``py-spy record --native`` samples the gateway's *Python* threads with their native
  frames, so a ``b"".join`` or a page-faulting memcpy shows under the Python line that
  called it. Samples whose leaf is a wait (``epoll_wait`` …) are idle and dropped.
  gRPC's C-core threads carry no Python state and are invisible to py-spy.
* ``perf record -e cpu-clock -g`` (when perf is installed and allowed) samples every
  thread, kernel included, so it measures what py-spy cannot: the share of the
  gateway's CPU spent in the kernel's page-fault path (first touches of freshly
  mmapped buffers) and in memcpy.
* /proc/<pid>/task/*/stat gives the CPU per thread name over the same window.
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

__all__ = ["Recorder", "ThreadCpu", "perf", "perf_summary", "perf_text", "py_spy", "summarize"]

_ADDR = re.compile(r"^0x[0-9a-f]+ \((.+)\)$")
_PY = re.compile(r"^(.*) \((.+\.py):(\d+)\)$")
_IDLE = ("epoll_wait", "epoll_pwait", "poll ", "ppoll", "select", "pthread_cond_wait", "pthread_cond_timedwait",
         "sem_wait", "futex")


def py_spy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


def perf() -> str | None:
    exe = shutil.which("perf")
    if exe is None:
        return None
    try:
        probe = subprocess.run([exe, "stat", "-e", "cpu-clock", "--", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if probe.returncode == 0 else None


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
    """A profiler attached to ``pid`` until :meth:`stop` (SIGINT makes it write its file)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)

    @classmethod
    def py_spy(cls, exe: str, pid: int, out: Path, rate: int = 100) -> Recorder:
        return cls([exe, "record", "--pid", str(pid), "--rate", str(rate), "--native", "--full-filenames",
                    "--format", "raw", "--output", str(out)], out.with_suffix(".log"))

    @classmethod
    def perf(cls, exe: str, pid: int, out: Path, freq: int = 499) -> Recorder:
        return cls([exe, "record", "-e", "cpu-clock", "-F", str(freq), "-g", "-p", str(pid), "-o", str(out)],
                   out.with_suffix(".log"))

    def stop(self, timeout: float = 60.0) -> None:
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
        return Path(m.group(1)).name  # an unresolved native address: name its library
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
    return re.sub(r" \(/[^)]*/([^/)]+)\)$", r" (\1)", frame)


def summarize(raw: Path, root: str, top: int = 12) -> dict[str, Any]:
    """py-spy raw stacks → shares of the non-idle samples: by the deepest Python line (native
    work below it included, its leaf named), and inclusive per gateway/ line."""
    py_line: collections.Counter[str] = collections.Counter()
    gateway: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f, root) for f in stack.split(";")]
        if frames[-1].startswith(_IDLE):
            idle += n
            continue
        busy += n
        py = [i for i, f in enumerate(frames) if ".py:" in f]
        if py:
            deepest = frames[py[-1]]
            below = frames[py[-1] + 1 :]
            leaf = below[-1].split(" (")[0] if below else "(Python)"
            py_line[f"{deepest} → {leaf}"] += n
        for f in dict.fromkeys(frames[i] for i in py if "gateway/" in frames[i]):
            gateway[f] += n

    def share(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, v / busy) for k, v in c.most_common(top)] if busy else []

    return {"busy_samples": busy, "idle_samples": idle, "deepest_python_line": share(py_line),
            "gateway_inclusive": share(gateway)}


_FLAT = re.compile(r"^\s+([\d.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")
_CHILDREN = re.compile(r"^\s+([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.+?)\s*$")
_PAGE_FAULT = ("asm_exc_page_fault", "exc_page_fault")


def perf_summary(exe: str, data: Path, top: int = 15) -> dict[str, Any]:
    """Flat self-time by (thread, library, symbol), CPU share by thread, and the page-fault share."""
    def report(*args: str) -> list[str]:
        res = subprocess.run([exe, "report", "-i", str(data), "--stdio", "-g", "none", *args],
                             capture_output=True, text=True, timeout=300)
        return res.stdout.splitlines()

    flat = []
    for line in report("--no-children", "--sort", "comm,dso,sym", "--percent-limit", "0.5"):
        m = _FLAT.match(line)
        if m:
            pct, comm, dso, kind, sym = m.groups()
            flat.append((f"{comm} {Path(dso).name if kind == '.' else 'kernel'} {sym}", float(pct) / 100))
    by_comm = []
    for line in report("--no-children", "--sort", "comm"):
        m = re.match(r"^\s+([\d.]+)%\s+(.+?)\s*$", line)
        if m:
            by_comm.append((m.group(2), float(m.group(1)) / 100))
    page_fault = memcpy = 0.0
    for line in report("--children", "--sort", "sym"):
        m = _CHILDREN.match(line)
        if m:
            children, _, kind, sym = m.groups()
            if sym in _PAGE_FAULT:
                page_fault = max(page_fault, float(children) / 100)
            if kind == "." and ("memmove" in sym or "memcpy" in sym):
                memcpy += float(children) / 100
    return {"self": flat[:top], "threads": by_comm, "page_fault_share": page_fault, "memcpy_share": memcpy}


def perf_text(exe: str, data: Path, out: Path) -> None:
    """The flat report as text beside the results (the binary perf.data is not kept)."""
    res = subprocess.run([exe, "report", "-i", str(data), "--stdio", "-g", "none", "--no-children",
                          "--sort", "comm,dso,sym", "--percent-limit", "0.2"], capture_output=True, text=True,
                         timeout=300)
    out.write_text(res.stdout)
