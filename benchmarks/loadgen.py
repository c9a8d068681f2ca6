"""Drive load with h2load (nghttp2-client) or wrk and return what they measured.

h2load: ``-t1`` (one thread: on 2 cores the generator competes with the proxy), ``-c C -m 1``
(C connections, one request in flight on each), ``-D`` seconds, ``--h1`` for HTTP/1.1 workloads,
plain HTTP/2 (h2c prior knowledge) for gRPC. Latency percentiles come from ``--log-file`` (one line
per request: start µs, HTTP status, µs to the end of the response). h2load only knows the HTTP
status, so gRPC answers are checked once per target with a real client (workloads.verify).

wrk (``--loadgen wrk``, HTTP/1.1 workloads only): ``-t1 -c C -d S --latency`` with a Lua script
setting method, headers and body; p50/p99 from its latency distribution.
"""
from __future__ import annotations

import os
import re
import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["LoadResult", "run_h2load", "run_wrk"]


@dataclass
class LoadResult:
    requests: int = 0  # completed with a 2xx status
    failed: int = 0  # non-2xx or errored
    seconds: float = 0.0
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    mean_us: float = float("nan")
    loadgen_cpu_s: float = 0.0
    error: str = ""
    # Steady-state window (h2load only): epoch seconds of the first and the last successful
    # completion; the requests completing after the first one fall inside it.
    first_done: float | None = None
    last_done: float | None = None

    @property
    def window_s(self) -> float:
        if self.first_done is None or self.last_done is None:
            return 0.0
        return self.last_done - self.first_done

    @property
    def steady(self) -> bool:
        """Enough completions spread over enough time to use the window instead of the whole run."""
        return self.requests >= 5 and self.window_s >= 0.25

    @property
    def rps(self) -> float:
        # Completions over the window between the first and the last one: the ramp-up (connects,
        # the first request's whole latency) and the requests cut off at the end drop out. This
        # matters for 16 MB requests, whose latency is a sizeable part of a run.
        if self.steady:
            return (self.requests - 1) / self.window_s
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    before = _children_cpu()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = f"timed out after {timeout}s: {exc.stdout!r}", -1
    return code, out, _children_cpu() - before


def run_h2load(url: str, body: Path, headers: tuple[tuple[str, str], ...], *, h1: bool, concurrency: int,
               duration: float, timeout_extra: float = 60.0) -> LoadResult:
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log", delete=False) as tmp:
        log = Path(tmp.name)
    cmd = ["h2load", "-t1", f"-c{concurrency}", "-m1", f"-D{max(1, round(duration * 1000))}ms",
           f"--log-file={log}", "-d", str(body)]
    if h1:
        cmd.append("--h1")
    for k, v in headers:
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(url)
    code, out, cpu = _run(cmd, duration + timeout_extra)
    res = LoadResult(loadgen_cpu_s=cpu, seconds=duration)
    try:
        if code != 0:
            res.error = f"h2load exit {code}: {out[-500:]}"
        m = re.search(r"finished in ([\d.]+)(ms|s),", out)
        if m:
            res.seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                      out)
        if m:
            res.failed = int(m.group(3)) + int(m.group(4))
        table = np.empty((0, 3), dtype=np.int64)
        if log.exists() and log.stat().st_size:
            table = np.loadtxt(log, dtype=np.int64, ndmin=2, usecols=(0, 1, 2))
        table_start, table = table[:, 0], table[:, 1:]
        if table.size:
            ok = (table[:, 0] >= 200) & (table[:, 0] < 300)
            res.requests = int(ok.sum())
            res.failed = max(res.failed, int((~ok).sum()))
            lat = table[ok, 1]
            done = (table_start[ok] + lat) / 1e6
            if done.size:
                res.first_done, res.last_done = float(done.min()), float(done.max())
            if lat.size:
                res.p50_us, res.p99_us = (float(x) for x in np.percentile(lat, [50, 99]))
                res.mean_us = float(lat.mean())
        if res.requests == 0 and not res.error:
            res.error = f"no successful requests: {out[-500:]}"
    finally:
        log.unlink(missing_ok=True)
    return res


_WRK_LUA = """
wrk.method = "POST"
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = f:read("*all")
f:close()
{headers}
done = function(summary, latency, requests)
  io.write(string.format("BENCH %d %d %d %d %f %f %f\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99), latency.mean))
end
"""


def run_wrk(url: str, body: Path, headers: tuple[tuple[str, str], ...], *, concurrency: int, duration: float,
            timeout_extra: float = 60.0) -> LoadResult:
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers)
    with tempfile.NamedTemporaryFile("w", prefix="wrk-", suffix=".lua", delete=False) as tmp:
        tmp.write(_WRK_LUA.format(headers=lines))
        script = Path(tmp.name)
    os.environ["BENCH_BODY"] = str(body)
    try:
        secs = max(1, round(duration))
        cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{secs}s", "--timeout", "60s", "-s", str(script), url]
        code, out, cpu = _run(cmd, secs + timeout_extra)
    finally:
        script.unlink(missing_ok=True)
    res = LoadResult(loadgen_cpu_s=cpu, seconds=secs)
    m = re.search(r"^BENCH (\d+) (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+)", out, re.M)
    if code != 0 or not m:
        res.error = f"wrk exit {code}: {out[-500:]}"
        return res
    total, bad_status, errors, dur_us = (int(m.group(i)) for i in range(1, 5))
    res.requests, res.failed, res.seconds = total - bad_status, bad_status + errors, dur_us / 1e6
    res.p50_us, res.p99_us, res.mean_us = (float(m.group(i)) for i in range(5, 8))
    return res
