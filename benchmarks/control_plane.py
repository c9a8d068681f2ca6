"""What the gateway's control plane costs as endpoints × routes grow: health checks, repository-index
polling and (``least_queue``) metrics scraping, with no client traffic.

    .venv/bin/python -m benchmarks.control_plane [--sizes 10x100,100x1000,300x10000]
        [--balance round_robin,least_queue] [--idle-seconds 20] [--rate 200 --load-seconds 10]
        [--ready-timeout 120] [--out DIR]
    .venv/bin/python -m benchmarks.control_plane --report-from DIR    # redo results.md from results.json

For each size ``NxM`` one helper process (this module run with ``--fake-server``, uvloop) plays N
fake V2 endpoints on loopback, each on its own port (port 0, read back), HTTP/1.1 keep-alive:
``GET /v2/health/live`` and ``/v2/health/ready`` → 200, ``GET /v2`` → Triton's server metadata
(the checker reads the server family from it), ``POST /v2/repository/index`` → the M models
``[{"name": "model-i", "version": "1", "state": "READY"}, ...]``, ``GET /v2/models/<m>/ready`` → 200,
``GET /metrics`` → a Triton-style page with ``nv_inference_pending_request_count{model="model-i",
version="1"} 0`` for the M models (``--metrics-style triton`` adds Triton's other per-model families,
~10 × the page), ``POST /v2/models/<m>/infer`` → a small V2 JSON answer. Every answer except the
infer one is precomputed once per M, so the fake side costs little; its CPU is measured and
reported anyway (``fake cores``). It timestamps each control-plane request it gets (CLOCK_MONOTONIC,
shared with the harness), which is how health-round length and staleness are measured from outside.

For each balance a fresh gateway (``tests/support/gateway.py``, 1 worker) serves one HTTP backend
``fleet`` of the N endpoints with M exact routes ``model-0`` … ``model-(M-1)``; everything else
is the gateway's default — ``health`` too (interval 2 s, timeout 1 s; the test helper's faster
setting is removed), and ``queue_metrics.interval_s`` 0.5 s (least_queue endpoints are written
``{address, metrics_port}`` with the metrics port = the endpoint's own port, where the fake serves
``/metrics``). Then, in order:

1. **start-up to ready**: from just before the process is started until ``GET /v2/health/ready``
   answers 200 *and* an infer request for ``model-(M-1)`` is routed and answered 200 (polled every
   0.1 s, each call bounded). Past ``--ready-timeout`` the size is "never ready" and the run goes on
   with the idle measurement (no load probe). Also: when the listeners opened (port file).
2. ``--settle-seconds`` (5) of nothing, then the **idle window** (``--idle-seconds``, 20): utime +
   stime of the gateway's process tree (``/proc/<pid>/stat``) over wall time = idle cores; the same
   for the fake process, for this harness, and for the machine (``/proc/stat``) — ``other cores`` is
   the machine minus those three (another user of the machine shows up there). RSS: the tree's
   VmRSS at the end of the window (steady) and its VmHWM (peak, start-up included). From the fake's
   timestamps, from ready (or giving up) to the end of the idle window (no client traffic):
   **health period** (time between two server-live checks of the same endpoint: p50 and max over
   endpoints), **round length** ≈ period − interval_s (a round is followed by an interval_s pause
   and checks each endpoint once; it should take ≤ interval_s), **index age max** (the longest any
   endpoint went without a repository-index call: how stale its model state got) and, least_queue,
   the **scrape period** / age per endpoint (0.5 s asked); see ``health_timing``. The gateway does
   not export a health-round series; its ``oip_gateway_*`` scrape / ready / endpoint series are
   recorded in results.json. Every call the fake endpoints saw goes to ``logs/<run>.events.json``
   (``--report-from`` recomputes the health analysis from those files).
3. **event-loop hold probe** (``--probe-seconds`` 10 at ``--probe-rate`` 50/s): ``GET
   /v2/health/live`` on the gateway, open loop; the gateway answers it itself (~1 ms), so the rest
   of its latency is time the event loop was busy with something else: the max bounds the longest
   time one control-plane step held the loop (an upper bound: when the loop is busy all the time —
   a high p50 — several steps queue up ahead of a ping). No external probe sees single steps.
4. **light-load latency probe** (``--rate`` 200/s for ``--load-seconds`` 10): small JSON infers
   (2 × 16 FP32, ~300 B) spread over the M models at random, open loop at a fixed rate with this
   module's own keep-alive HTTP/1.1 client (latency counted from each request's scheduled send
   time, so a stall is not hidden); p50 / p99 / max and errors.

The gateway's log is summarised (lines per level, the most frequent warning/error messages) and
kept under ``<out>/logs/``. Output: ``<out>/results.json`` and ``<out>/results.md`` (printed too);
default ``benchmarks/results/<date>-control-plane``. Every wait is bounded.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .procstat import cpu_seconds, system_busy_seconds, tree_pids

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_HEALTH_INTERVAL_S = 2.0  # the gateway's default health.interval_s (docs/config.md)
GATEWAY_SCRAPE_INTERVAL_S = 0.5  # its default queue_metrics.interval_s

# =============================================================================================
# Fake V2 endpoints (the helper process)
# =============================================================================================

_META = orjson.dumps({"name": "triton", "version": "2.51.0", "extensions": [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging"]})
_OUT_DATA = orjson.dumps([float(i) for i in range(16)])
# Event kinds the fake records (the harness reads them by these codes).
K_LIVE, K_READY, K_META, K_INDEX, K_MREADY, K_METRICS, K_OTHER = range(7)
KIND_NAMES = ("live", "ready", "meta", "index", "model_ready", "metrics", "other")


def _answer(status: int, body: bytes, ctype: bytes = b"application/json") -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
            % (status, reason, ctype, len(body)) + body)


def metrics_page(m: int, style: str) -> bytes:
    """Triton's /metrics text: ``pending`` — the pending-request family only (what least_queue
    reads) plus a few machine-level lines; ``triton`` — also Triton's other per-model families."""
    lines: list[str] = []
    families = [("nv_inference_pending_request_count", "gauge",
                 "Instantaneous number of pending requests awaiting execution per-model.")]
    if style == "triton":
        families = [
            ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
            ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
            ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
            ("nv_inference_exec_count", "counter", "Number of model executions performed"),
            ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds"),
            ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds"),
            ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds"),
            ("nv_inference_compute_infer_duration_us", "counter",
             "Cumulative compute inference duration in microseconds"),
            ("nv_inference_compute_output_duration_us", "counter",
             "Cumulative inference compute output duration in microseconds"),
        ] + families
    for name, kind, text in families:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f'{name}{{model="model-{i}",version="1"}} 0' for i in range(m))
    lines += ["# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]", "# TYPE nv_cpu_utilization gauge",
              "nv_cpu_utilization 0.01", "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
              "# TYPE nv_cpu_memory_total_bytes gauge", "nv_cpu_memory_total_bytes 25276968960"]
    return ("\n".join(lines) + "\n").encode()


class _Fake:
    """Shared state of the fake endpoints: precomputed answers and the event log."""

    def __init__(self, m: int, style: str) -> None:
        self.models = {f"model-{i}".encode() for i in range(m)}
        index = orjson.dumps([{"name": f"model-{i}", "version": "1", "state": "READY"} for i in range(m)])
        self.index = _answer(200, index)
        self.metrics = _answer(200, metrics_page(m, style), b"text/plain; version=0.0.4; charset=utf-8")
        self.ok = _answer(200, b"")
        self.meta = _answer(200, _META)
        self.not_found = _answer(404, b'{"error":"not found"}')
        self.events: list[tuple[float, int, int]] = []
        self.infers = 0
        self.sizes = {"index_bytes": len(index), "metrics_bytes": len(self.metrics)}

    def infer(self, model: bytes) -> bytes:
        if model not in self.models:
            return _answer(404, b'{"error":"Request for unknown model: \'%s\' is not found"}' % model)
        return _answer(200, b'{"model_name":"%s","model_version":"1","outputs":[{"name":"OUTPUT0",'
                            b'"datatype":"FP32","shape":[1,16],"data":%s}]}' % (model, _OUT_DATA))


class _FakeProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection of fake endpoint ``ep`` (-1: the control port)."""

    def __init__(self, fake: _Fake, ep: int) -> None:
        self.fake = fake
        self.ep = ep
        self.buf = bytearray()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # (set at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 1 << 20:
                    self.transport.close()
                return
            head = bytes(buf[:end])
            lower = head.lower()
            length = 0
            i = lower.find(b"\r\ncontent-length:")
            if i >= 0:
                j = lower.find(b"\r\n", i + 2)
                length = int(head[i + 17: j if j >= 0 else len(head)])
            if b"\r\ntransfer-encoding:" in lower:
                self.transport.write(_answer(400, b'{"error":"chunked bodies are not supported here"}'))
                self.transport.close()
                return
            total = end + 4 + length
            if len(buf) < total:
                return
            line_end = head.find(b"\r\n")
            method, path = head[:line_end if line_end >= 0 else len(head)].split(b" ", 2)[:2]
            del buf[:total]
            self.transport.write(self.answer(method, path))

    def answer(self, method: bytes, path: bytes) -> bytes:
        fake = self.fake
        if self.ep < 0:
            return self.control(path)
        now = time.monotonic()
        if path.startswith(b"/v2/models/"):
            parts = path.split(b"/")
            if parts[-1] == b"infer" and method == b"POST":
                fake.infers += 1
                return fake.infer(parts[3])
            if parts[-1] == b"ready":
                fake.events.append((now, self.ep, K_MREADY))
                return fake.ok if parts[3] in fake.models else fake.not_found
        elif path == b"/metrics":
            fake.events.append((now, self.ep, K_METRICS))
            return fake.metrics
        elif path == b"/v2/repository/index" and method == b"POST":
            fake.events.append((now, self.ep, K_INDEX))
            return fake.index
        elif path == b"/v2/health/live":
            fake.events.append((now, self.ep, K_LIVE))
            return fake.ok
        elif path == b"/v2/health/ready":
            fake.events.append((now, self.ep, K_READY))
            return fake.ok
        elif path == b"/v2":
            fake.events.append((now, self.ep, K_META))
            return fake.meta
        fake.events.append((now, self.ep, K_OTHER))
        return fake.not_found

    def control(self, path: bytes) -> bytes:
        fake = self.fake
        if path == b"/drain":
            events, fake.events = fake.events, []
            return _answer(200, orjson.dumps({"events": events, "infers": fake.infers}))
        if path == b"/stats":
            return _answer(200, orjson.dumps({"pid": os.getpid(), "infers": fake.infers, **fake.sizes}))
        return self.fake.not_found


async def _fake_main(n: int, m: int, style: str) -> None:
    loop = asyncio.get_running_loop()
    fake = _Fake(m, style)
    servers = []
    ports = []
    for ep in range(-1, n):
        server = await loop.create_server(functools.partial(_FakeProtocol, fake, ep), "127.0.0.1", 0, backlog=1024)
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)

    def stdin_readable() -> None:  # the harness closes our stdin (or dies): stop
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            done.set()

    loop.add_reader(sys.stdin.fileno(), stdin_readable)
    sys.stdout.write(json.dumps({"control": ports[0], "ports": ports[1:], "pid": os.getpid(), **fake.sizes}) + "\n")
    sys.stdout.flush()
    await done.wait()
    for server in servers:
        server.close()


class FakeFleet:
    """The helper process, seen from the harness."""

    def __init__(self, n: int, m: int, style: str, timeout: float = 60.0) -> None:
        argv = [sys.executable, "-m", "benchmarks.control_plane", "--fake-server", f"{n}x{m}", "--metrics-style", style]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        line = _readline_bounded(self.proc, timeout)
        info = json.loads(line)
        self.pid: int = self.proc.pid
        self.ports: list[int] = info["ports"]
        self.control: int = info["control"]
        self.sizes = {k: info[k] for k in ("index_bytes", "metrics_bytes")}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)


def _readline_bounded(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"fake endpoints did not start within {timeout}s (exit {proc.poll()})")
        if sel.select(min(left, 0.5)):
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:  # (EOF: the process is exiting; poll() says so next turn)
                time.sleep(0.05)
                continue
            buf += chunk
    sel.close()
    return buf.split(b"\n", 1)[0]


# =============================================================================================
# /proc readings
# =============================================================================================

def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes, summed over the process tree."""
    rss = hwm = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, hwm


def own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuWindow:
    """CPU of the gateway tree, the fake, this harness and the machine between start() and stop()."""

    def __init__(self, gateway_pid: int, fake_pid: int) -> None:
        self.pids = (gateway_pid, fake_pid)

    def _read(self) -> tuple[float, float, float, float, float]:
        return (time.monotonic(), cpu_seconds(self.pids[0]), cpu_seconds(self.pids[1]),
                own_cpu_seconds(), system_busy_seconds())

    def start(self) -> CpuWindow:
        self.t0 = self._read()
        return self

    def stop(self) -> dict[str, float]:
        t1 = self._read()
        wall = t1[0] - self.t0[0]
        gw, fake, own, busy = ((t1[i] - self.t0[i]) / wall for i in range(1, 5))
        return {"wall_s": wall, "gateway_cores": gw, "fake_cores": fake, "harness_cores": own,
                "other_cores": max(0.0, busy - gw - fake - own), "machine_cores": busy}


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.max_rss = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.wait(self.every):
            self.max_rss = max(self.max_rss, memory(self.pid)[0])

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)


# =============================================================================================
# A small asyncio HTTP/1.1 keep-alive client
# =============================================================================================

class HttpError(Exception):
    pass


class Client:
    """Keep-alive connections to one host:port, one request in flight on each; a connection
    that fails or times out is closed, never reused."""

    def __init__(self, port: int, host: str = "127.0.0.1", max_idle: int = 512) -> None:
        self.host, self.port, self.max_idle = host, port, max_idle
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0

    async def request(self, method: str, path: str, body: bytes = b"", *, timeout: float = 5.0,
                      ctype: str = "application/json") -> tuple[int, bytes]:
        conn = self.idle.pop() if self.idle else None
        try:
            return await asyncio.wait_for(self._exchange(conn, method, path, body, ctype), timeout)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise HttpError(f"{method} {path}: no answer within {timeout:g}s") from exc
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise HttpError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None, method: str,
                        path: str, body: bytes, ctype: str) -> tuple[int, bytes]:
        if conn is None:
            conn = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
            self.opened += 1
        reader, writer = conn
        ok = False
        try:
            head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            if body or method == "POST":
                head += f"content-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
            writer.write(head.encode() + b"\r\n" + body)
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            if "content-length" in headers:
                data = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    chunks.append(chunk[:-2])
                data = b"".join(chunks)
            else:
                data = await reader.read()  # to the end (no keep-alive)
                headers["connection"] = "close"
            ok = headers.get("connection", "").lower() != "close"
            return status, data
        finally:
            if ok and len(self.idle) < self.max_idle:
                self.idle.append(conn)
            else:
                writer.close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


# A request sent this late means the client itself was not running on time (a stall of its own).
STALL_S = 0.002


async def open_loop(send, rate: float, seconds: float, timeout: float, keep: bool = False) -> dict[str, Any]:
    """``send(i)`` at a fixed rate for ``seconds``, not waiting for answers (open loop). Latency
    counts from each request's scheduled time. ``keep``: the answered requests' latencies too
    (``lat_ms``), and those of the requests no stall of the client overlapped (``clean_ms``).

    The client's own stalls: a request sent more than ``STALL_S`` late shows the client was not
    running from its scheduled time until it sent it (its loop busy, or the process descheduled);
    an open loop's lateness is never the server's doing. A request in flight at any moment of
    such a stall may have been answered in time and read late: ``clean_*`` leave those out."""
    # (time.monotonic, not loop.time(): uvloop's clock has millisecond steps.)
    n = max(1, int(rate * seconds))
    lat = np.full(n, np.nan)
    lag = np.full(n, np.nan)  # how late the harness sent it (its own timers): part of the latency
    errors: list[str] = []
    start = time.monotonic() + 0.05

    pending = n
    finished = asyncio.Event()

    async def one(i: int, at: float) -> None:
        nonlocal pending
        lag[i] = time.monotonic() - at
        try:
            status, _ = await send(i, timeout)
            if status == 200:
                lat[i] = time.monotonic() - at
            else:
                errors.append(f"HTTP {status}")
        except HttpError as exc:
            errors.append(str(exc).split(": ", 1)[-1])
        finally:
            pending -= 1
            if not pending:
                finished.set()

    # The tasks are kept (a task only weakly referenced may be collected) and awaited through a
    # count: gathering them would hold the loop for a step per task (~8 ms for 2,000) just as
    # the last requests are sent and answered — their latency, counted as the gateway's.
    tasks = []
    for i in range(n):
        at = start + i / rate
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, at)))
    await finished.wait()
    answered = ~np.isnan(lat)
    ok = lat[answered] * 1000
    sched = start + np.arange(n) / rate
    clean = answered.copy()
    for s in np.flatnonzero(lag > STALL_S):  # (few): [its schedule, its send] the client stood still
        clean &= ~((sched <= sched[s] + lag[s]) & (sched + np.nan_to_num(lat, nan=timeout) >= sched[s]))
    kept = lat[clean] * 1000
    out: dict[str, Any] = {"sent": n, "ok": int(ok.size), "errors": len(errors),
                           "error_kinds": _top(errors, 5), "send_lag_p50_ms": float(np.nanmedian(lag) * 1000),
                           "send_lag_max_ms": float(np.nanmax(lag) * 1000), "stalls": int((lag > STALL_S).sum()),
                           "clean": int(kept.size)}
    if ok.size:
        out.update(p50_ms=float(np.percentile(ok, 50)), p90_ms=float(np.percentile(ok, 90)),
                   p99_ms=float(np.percentile(ok, 99)), max_ms=float(ok.max()), mean_ms=float(ok.mean()),
                   max_at_s=float(np.nanargmax(lat) / rate))  # (when the slowest was sent, from the start)
    if kept.size:
        out.update(clean_p99_ms=float(np.percentile(kept, 99)), clean_max_ms=float(kept.max()))
    if keep:
        out["lat_ms"] = ok.tolist()
        out["clean_ms"] = kept.tolist()
    return out


def _top(items: list[str], k: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:k])


# =============================================================================================
# What the fake's timestamps say
# =============================================================================================

def health_timing(events: list[list[float]], n: int, interval: float, w0: float, w1: float, *,
                  origin: float | None = None, scrapes: bool = True) -> dict[str, Any]:
    """What the fake endpoints saw of the checker within the window [w0, w1], from every event of the
    gateway's life (an endpoint's previous check may lie before the window).

    Per kind (server-live checks, repository-index calls, least_queue metrics scrapes) and endpoint,
    the times of its calls; then: the *period* (time between two consecutive calls to one endpoint,
    for pairs ending in the window: p50 and max over all endpoints), the round length estimated as
    period − interval_s (a round is followed by an interval_s pause, and each endpoint is checked
    once a round), and the *max age*: the longest an endpoint went without such a call anywhere in
    the window, counting from its call before the window and, at the window's end, its last call
    (an endpoint never called at all ages from ``origin``, the gateway's start, or else the window's
    start: flagged as a lower bound) — how stale its state got. Scrapes only with ``scrapes``."""
    times: dict[int, dict[int, list[float]]] = {K_LIVE: {}, K_INDEX: {}, K_METRICS: {}}
    start = w0 if origin is None else origin
    counts = [0] * len(KIND_NAMES)
    for t, ep, kind in events:
        kind = int(kind)
        if w0 <= t <= w1:
            counts[kind] += 1
        if kind in times:
            times[kind].setdefault(int(ep), []).append(t)
    out: dict[str, Any] = {"window_s": w1 - w0, "counts_in_window": dict(zip(KIND_NAMES, counts))}
    for kind, name in ((K_LIVE, "live"), (K_INDEX, "index"), (K_METRICS, "scrape")):
        per_ep = times[kind]
        if kind == K_METRICS and not (scrapes or per_ep):
            continue
        gaps: list[float] = []
        ages: list[float] = []
        called = 0
        for ep in range(n):
            ts = sorted(per_ep.get(ep, []))
            before = [t for t in ts if t < w0]
            inside = [t for t in ts if w0 <= t <= w1]
            called += bool(inside)
            prev = before[-1] if before else None
            age = 0.0
            for t in inside:
                if prev is not None:
                    gaps.append(t - prev)
                age = max(age, t - (prev if prev is not None else start))
                prev = t
            age = max(age, w1 - (prev if prev is not None else start))
            ages.append(age)
        out[f"{name}_endpoints_called"] = called
        out[f"{name}_max_age_s"] = float(max(ages))
        out[f"{name}_max_age_is_lower_bound"] = any(not per_ep.get(ep) for ep in range(n))
        if gaps:
            g = np.array(gaps)
            out[f"{name}_period_p50_s"] = float(np.median(g))
            out[f"{name}_period_max_s"] = float(g.max())
            if kind != K_METRICS:
                out[f"{name}_round_p50_s"] = max(0.0, float(np.median(g)) - interval)
                out[f"{name}_round_max_s"] = max(0.0, float(g.max()) - interval)
    return out


def health_from_file(path: Path, n: int, interval: float, balance: str) -> dict[str, Any] | None:
    """``health`` again from a run's saved logs/<run>.events.json (times since the gateway started)."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    phases = doc["phases_s"]
    w0 = phases.get("ready", phases.get("gave_up"))
    w1 = phases.get("idle_end")
    if w0 is None or w1 is None:
        return None
    codes = {name: i for i, name in enumerate(KIND_NAMES)}
    events = [[t / 1000, int(ep), codes[kind]] for kind, eps in doc["calls"].items()
              for ep, ts in eps.items() for t in ts]
    return health_timing(events, n, interval, w0, w1, origin=0.0, scrapes=balance == "least_queue")


def compact_events(events: list[list[float]], t0: float) -> dict[str, dict[str, list[float]]]:
    """{kind: {endpoint: [ms since the gateway started, ...]}} for logs/<run>.events.json."""
    out: dict[str, dict[str, list[float]]] = {}
    for t, ep, kind in events:
        out.setdefault(KIND_NAMES[int(kind)], {}).setdefault(str(int(ep)), []).append(round((t - t0) * 1000, 1))
    return out


# =============================================================================================
# One (size, balance) run
# =============================================================================================

_BODY = orjson.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [float(i) for i in range(16)]},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \S+ (\w+) ([\w.]+)\[\d+\]: (.*)$")


def build_config(ports: list[int], m: int, balance: str, health_interval: float | None) -> dict[str, Any]:
    from tests.support.gateway import gateway_config

    if balance == "least_queue":  # the fake serves /metrics on the endpoint's own port
        endpoints: list[Any] = [{"address": f"127.0.0.1:{p}", "metrics_port": p} for p in ports]
    else:
        endpoints = [f"127.0.0.1:{p}" for p in ports]
    backend: dict[str, Any] = {"protocol": "http", "endpoints": endpoints}
    if balance != "round_robin":
        backend["balance"] = balance
    cfg = gateway_config({"fleet": backend}, [{"model": f"model-{i}", "backend": "fleet"} for i in range(m)])
    cfg.pop("health", None)  # the gateway's own defaults (the test helper checks every 0.5 s)
    if health_interval is not None:
        cfg["health"] = {"interval_s": health_interval}
    return cfg


def summarise_log(text: str) -> dict[str, Any]:
    levels: dict[str, int] = {}
    templates: dict[tuple[str, str], int] = {}
    examples: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        mt = _LOG_LINE.match(line)
        if not mt:
            continue
        level, name, msg = mt.groups()
        levels[level] = levels.get(level, 0) + 1
        key = (level, name + ": " + re.sub(r"\d+(\.\d+)?", "N", msg)[:200])
        templates[key] = templates.get(key, 0) + 1
        examples.setdefault(key, msg[:300])
    top = sorted(templates.items(), key=lambda kv: (kv[0][0] == "INFO", -kv[1]))[:12]
    return {"lines_per_level": levels,
            "top": [{"level": k[0], "count": c, "template": k[1], "example": examples[k]} for k, c in top]}


def gateway_series(text: str) -> dict[str, float]:
    """The gateway's own series about health, readiness and queue scraping (summed over labels,
    ``oip_gateway_endpoint_healthy`` as the count of healthy endpoints)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("oip_gateway_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not re.search(r"health|ready|scrape|queue|round|check|endpoint", name):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
        if name.endswith("_created"):
            continue
        if name == "oip_gateway_route_ready":
            out["route_ready_routes"] = out.get("route_ready_routes", 0) + 1
            out["route_ready_sum"] = out.get("route_ready_sum", 0) + value
            continue
        out[name] = out.get(name, 0.0) + value
    return out


async def _drain(fake: Client) -> dict[str, Any]:
    _, body = await fake.request("GET", "/drain", timeout=30)
    return orjson.loads(body)


async def run_one(fleet: FakeFleet, n: int, m: int, balance: str, args: argparse.Namespace,
                  logs: Path) -> dict[str, Any]:
    from tests.support.gateway import GatewayProcess

    name = f"gw-{n}x{m}-{balance}"
    res: dict[str, Any] = {"size": f"{n}x{m}", "endpoints": n, "routes": m, "balance": balance}
    interval = args.health_interval or GATEWAY_HEALTH_INTERVAL_S
    ctl = Client(fleet.control)
    await _drain(ctl)
    events: list[list[float]] = []  # everything the fake endpoints saw of this gateway

    async def drain() -> None:
        events.extend((await _drain(ctl))["events"])

    phases: dict[str, float] = {}
    res["phases_s"] = phases  # (seconds since the gateway process was started)
    work = Path(tempfile.mkdtemp(prefix="oip-cp-"))
    gw = GatewayProcess(build_config(fleet.ports, m, balance, args.health_interval), work, name=name)
    sampler: RssSampler | None = None
    try:
        t0 = time.monotonic()

        def mark(what: str) -> float:
            now = time.monotonic()
            phases[what] = round(now - t0, 3)
            return now

        try:
            await asyncio.to_thread(gw.start, args.ready_timeout)
        except RuntimeError as exc:
            res["start_error"] = str(exc).splitlines()[0]
            res["ready"] = False
            res["log_tail"] = gw.log_tail(20)
            return res
        assert gw.proc is not None
        pid = gw.proc.pid
        sampler = RssSampler(pid)
        sampler.start()
        t_listen = mark("listening")
        res["listening_s"] = t_listen - t0
        http = Client(gw.ports["http"])
        deadline = t0 + args.ready_timeout
        ready_at = routed_at = None
        last = f"--ready-timeout ({args.ready_timeout:g} s) passed before the first poll"
        while time.monotonic() < deadline and routed_at is None:
            try:
                if ready_at is None:
                    status, body = await http.request("GET", "/v2/health/ready",
                                                      timeout=min(5, deadline - time.monotonic()))
                    if status == 200:
                        ready_at = time.monotonic()
                    else:
                        last = f"ready: HTTP {status}"
                if ready_at is not None:
                    status, body = await http.request("POST", f"/v2/models/model-{m - 1}/infer", _BODY,
                                                      timeout=min(5, deadline - time.monotonic()))
                    if status == 200:
                        routed_at = time.monotonic()
                    else:
                        last = f"infer model-{m - 1}: HTTP {status} {body[:200]!r}"
            except (HttpError, ValueError) as exc:
                last = str(exc)
            if routed_at is None:
                await asyncio.sleep(0.1)
            if gw.proc.poll() is not None:
                last = f"gateway exited with {gw.proc.returncode}"
                break
        res["ready"] = routed_at is not None
        if ready_at is not None:
            res["health_ready_s"] = ready_at - t0
        if routed_at is not None:
            res["startup_s"] = routed_at - t0
        else:
            res["not_ready_reason"] = last
        t_ready = mark("ready" if res["ready"] else "gave_up")
        await drain()
        first = health_timing(events, n, interval, t0, t_ready, scrapes=balance == "least_queue")
        res["startup_health"] = {k: v for k, v in first.items() if k.startswith("counts") or k.endswith("_called")}
        print(f"  {name}: listening {res['listening_s']:.1f} s, "
              + (f"ready {res['startup_s']:.1f} s" if res["ready"] else f"NEVER READY ({last})"), flush=True)
        if gw.proc.poll() is not None:
            res["exit"] = gw.proc.returncode
            return res

        # -- idle window ---------------------------------------------------------------
        await asyncio.sleep(args.settle_seconds)
        mark("idle_start")
        window = CpuWindow(pid, fleet.pid).start()
        await asyncio.sleep(args.idle_seconds)
        idle = window.stop()
        t_idle_end = mark("idle_end")
        rss, hwm = memory(pid)
        await drain()
        res["idle"] = idle
        res["rss_steady_mb"] = rss / 1e6
        res["rss_peak_mb"] = max(hwm, sampler.max_rss) / 1e6
        # Health timing from ready (or giving up) to the end of the idle window: no client traffic.
        h = res["health"] = health_timing(events, n, interval, t_ready, t_idle_end, origin=t0,
                                          scrapes=balance == "least_queue")
        nan = float("nan")
        print(f"  {name}: idle {idle['gateway_cores']:.3f} cores (fake {idle['fake_cores']:.3f}, other "
              f"{idle['other_cores']:.2f}), RSS {rss / 1e6:.0f} MB (peak {res['rss_peak_mb']:.0f}), health period "
              f"p50 {h.get('live_period_p50_s', nan):.2f} s max {h.get('live_period_max_s', nan):.2f} s, "
              f"index age max {h.get('index_max_age_s', nan):.1f} s", flush=True)
        try:
            metrics = Client(gw.ports["metrics"])
            _, page = await metrics.request("GET", "/metrics", timeout=30)
            res["gateway_series"] = gateway_series(page.decode("utf-8", "replace"))
            metrics.close()
        except HttpError as exc:
            res["gateway_series_error"] = str(exc)

        # -- event-loop hold probe -----------------------------------------------------------
        if args.probe_seconds > 0:
            ping = Client(gw.ports["http"])

            async def send_ping(i: int, timeout: float) -> tuple[int, bytes]:
                return await ping.request("GET", "/v2/health/live", timeout=timeout)

            mark("ping_start")
            window = CpuWindow(pid, fleet.pid).start()
            res["hold_probe"] = await open_loop(send_ping, args.probe_rate, args.probe_seconds, timeout=10)
            res["hold_probe"]["cpu"] = window.stop()
            mark("ping_end")
            ping.close()
            await drain()

        # -- light-load latency probe -------------------------------------------------------
        if args.load_seconds > 0 and res["ready"]:
            load = Client(gw.ports["http"])
            rng = random.Random(1)
            models = [f"/v2/models/model-{rng.randrange(m)}/infer"
                      for _ in range(int(args.rate * args.load_seconds) + 1)]

            async def send_infer(i: int, timeout: float) -> tuple[int, bytes]:
                return await load.request("POST", models[i], _BODY, timeout=timeout)

            mark("load_start")
            window = CpuWindow(pid, fleet.pid).start()
            res["load"] = await open_loop(send_infer, args.rate, args.load_seconds, timeout=10)
            res["load"]["cpu"] = window.stop()
            mark("load_end")
            res["load"]["connections"] = load.opened
            load.close()
            await drain()
            lo = res["load"]
            print(f"  {name}: load {args.rate:g}/s: p50 {lo.get('p50_ms', float('nan')):.1f} ms, p99 "
                  f"{lo.get('p99_ms', float('nan')):.1f} ms, max {lo.get('max_ms', float('nan')):.1f} ms, "
                  f"errors {lo['errors']}", flush=True)
        res["rss_peak_mb"] = max(res.get("rss_peak_mb", 0), memory(pid)[1] / 1e6, sampler.max_rss / 1e6)
        http.close()
        return res
    finally:
        if sampler is not None:
            sampler.stop()
        t_stop = time.monotonic()
        await asyncio.to_thread(gw.stop)
        res["stop_s"] = time.monotonic() - t_stop
        try:
            await drain()
            if events:
                (logs / f"{name}.events.json").write_bytes(orjson.dumps(
                    {"t0": "gateway process start, times in ms", "phases_s": phases,
                     "calls": compact_events(events, t0)}))
        except (HttpError, NameError):
            pass
        ctl.close()
        try:
            text = gw.log_path.read_text(errors="replace")
            res["log"] = summarise_log(text)
            lines = text.splitlines()
            if len(lines) > 4000:  # keep the head and tail of a flood
                lines = lines[:2000] + [f"... {len(lines) - 4000} lines left out ..."] + lines[-2000:]
            (logs / f"{name}.log").write_text("\n".join(lines) + "\n")
        except OSError:
            pass
        shutil.rmtree(work, ignore_errors=True)


# =============================================================================================
# Report
# =============================================================================================

def _f(v: Any, fmt: str, missing: str = "–") -> str:
    return missing if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, fmt)


def _dur(a: float | None, b: float | None) -> str:
    """"a / b" in ms when both are under a second, else in s."""
    if a is None or b is None:
        return "–"
    return f"{a * 1000:.0f} / {b * 1000:.0f} ms" if b < 1 else f"{a:.2f} / {b:.2f} s"


def _rss(mb: float | None) -> str:
    if mb is None:
        return "–"
    return f"{mb / 1000:.1f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def _lat(d: dict[str, Any], p99: bool) -> str:
    """p50 [/ p99] / max of an open_loop result, with its failures."""
    if not d:
        return "–"
    if "p50_ms" not in d:
        return f"no answer ({d['errors']} / {d['sent']} failed)"
    text = f"{d['p50_ms']:.1f} / " + (f"{d['p99_ms']:.1f} / " if p99 else "") + f"{d['max_ms']:.0f} ms"
    return text + (f" ({d['errors']} / {d['sent']} failed)" if d.get("errors") else "")


def _age(h: dict[str, Any], name: str) -> str:
    age = h.get(f"{name}_max_age_s")
    if age is None:
        return "–"
    return (">" if h.get(f"{name}_max_age_is_lower_bound") else "") + (f"{age:.1f} s" if age < 100 else f"{age:.0f} s")


def report(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    interval = meta.get("health_interval", GATEWAY_HEALTH_INTERVAL_S)
    out = [f"# Control-plane cost vs endpoints × routes ({meta['date']})", "",
           f"Run {meta['started']} on {meta['cpus']} CPUs ({meta['cpu_model']}), Linux {meta['kernel']}, Python "
           f"{meta['python']}; gateway from `{meta['root']}`, commit {meta['commit']}"
           f"{' (work tree with uncommitted changes)' if meta.get('dirty') else ''}. Command: `{meta['command']}`. "
           f"Full run: {meta.get('total_s', 0) / 60:.1f} min.", "",
           f"One gateway (1 worker, defaults: health every {interval:g} s, timeout 1 s; least_queue scrapes every "
           "0.5 s) in front of one HTTP backend of N fake V2 endpoints on loopback (one helper process), each "
           "answering health, a repository index of M ready models and a Triton-style metrics page "
           f"(`{meta['metrics_style']}`); M exact routes. No client traffic from ready to the end of the idle "
           f"window ({meta['settle_seconds']:g} s settling, then {meta['idle_seconds']:g} s measured). Method: "
           "benchmarks/README.md, \"Control-plane cost\".", "",
           "| endpoints × routes | balance | idle cores | RSS steady (peak) | start-up to ready | "
           f"health period p50 / max | round p50 / max (period − {interval:g} s) | index age max | "
           "loop ping p50 / max | "
           f"{meta['rate']:g} req/s p50 / p99 / max |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in doc["runs"]:
        h = r.get("health", {})
        lo = r.get("load", {})
        ping = r.get("hold_probe", {})
        if r.get("ready"):
            start = f"{r['startup_s']:.1f} s"
        elif "start_error" in r:
            start = "did not start"
        else:
            start = f"never ready (> {meta['ready_timeout']:g} s)"
        hold = _lat(ping, p99=False)
        load = _lat(lo, p99=True)
        if not lo and r.get("ready") is False and "idle" in r:
            load = "not run (not ready)"
        out.append(
            f"| {r['endpoints']:,} × {r['routes']:,} | {r['balance']} | "
            f"{_f(r.get('idle', {}).get('gateway_cores'), '.3f')} | "
            f"{_rss(r.get('rss_steady_mb'))} ({_rss(r.get('rss_peak_mb'))}) | {start} | "
            f"{_f(h.get('live_period_p50_s'), '.2f')} / {_f(h.get('live_period_max_s'), '.2f')} s | "
            f"{_dur(h.get('live_round_p50_s'), h.get('live_round_max_s'))} | {_age(h, 'index')} | "
            f"{hold} | {load} |")
    out += ["", "Details:", "",
            "| endpoints × routes | balance | listening | /v2/health/ready 200 | fake cores (idle) | "
            "other cores (idle) | "
            "endpoints called live / index / scrape | live age max | scrape period p50 / max | scrape age max | "
            "ping p50 / p99 / max | gateway cores under load | log lines WARNING / ERROR | SIGTERM to exit |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in doc["runs"]:
        h = r.get("health", {})
        idle = r.get("idle", {})
        ping = r.get("hold_probe", {})
        levels = r.get("log", {}).get("lines_per_level", {})
        scrape = (f"{h['scrape_period_p50_s']:.2f} / {h['scrape_period_max_s']:.2f} s" if "scrape_period_p50_s" in h
                  else "–")
        called = " / ".join(str(h.get(f"{k}_endpoints_called", "–")) for k in ("live", "index", "scrape"))
        pingt = _lat(ping, p99=True)
        out.append(
            f"| {r['endpoints']:,} × {r['routes']:,} | {r['balance']} | {_f(r.get('listening_s'), '.1f')} s | "
            f"{_f(r.get('health_ready_s'), '.1f')} s | {_f(idle.get('fake_cores'), '.3f')} | "
            f"{_f(idle.get('other_cores'), '.2f')} | {called} (of {r['endpoints']}) | {_age(h, 'live')} | {scrape} | "
            f"{_age(h, 'scrape')} | {pingt} | "
            f"{_f(r.get('load', {}).get('cpu', {}).get('gateway_cores'), '.2f')} | "
            f"{levels.get('WARNING', 0)} / {levels.get('ERROR', 0)} | {_f(r.get('stop_s'), '.1f')} s |")
    notes = []
    for r in doc["runs"]:
        for t in r.get("log", {}).get("top", []):
            if t["level"] != "INFO":
                notes.append(f"- `{r['size']} {r['balance']}`: {t['count']} × {t['level']} `{t['example'][:160]}`")
        if not r.get("ready"):
            why = r.get("not_ready_reason") or r.get("start_error")
            notes.append(f"- `{r['size']} {r['balance']}`: not ready — {why}")
    if notes:
        out += ["", "Gateway log (most frequent warnings/errors; full logs under `logs/`):", ""] + notes[:40]
    out += ["", "idle cores: the gateway's CPU seconds per second over the idle window (0.005 = 0.5 % of a core). "
            "RSS: VmRSS at the end of the idle window (VmHWM). "
            "From ready to the end of the idle window, as the fake endpoints saw it: health period — time between "
            "two server-live checks of one endpoint (p50, max over all endpoints); round — that period less "
            f"interval_s (a round should take ≤ {interval:g} s); index age max — the longest any endpoint went "
            "without a repository-index call, i.e. how stale its model state got (> : some endpoint was never asked "
            "since the gateway started); scrape — the same for least_queue's metrics reads (0.5 s asked). "
            "loop ping: `GET /v2/health/live` on the gateway at "
            f"{meta['probe_rate']:g}/s for {meta['probe_seconds']:g} s, open loop, answered by the gateway itself: "
            "its max bounds the longest time one step held the event loop (less the ~1 ms a ping costs); a high "
            "median means the loop is busy all the time. Latency: small JSON infers, open loop, from the scheduled "
            "send time (10 s timeout: a failure is one that got no answer in time). "
            "other cores: the machine's busy CPU minus gateway, fake endpoints and harness — another user of the "
            "machine.", ""]
    return "\n".join(out)


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    cpu_model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"date": now.strftime("%Y-%m-%d"), "started": now.strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "cpu_model": cpu_model, "kernel": platform.release(),
            "python": platform.python_version(), "root": str(ROOT), "commit": sh("git", "rev-parse", "--short", "HEAD"),
            "dirty": bool(sh("git", "status", "--porcelain", "--untracked-files=no")),
            "command": "python -m benchmarks.control_plane " + " ".join(sys.argv[1:]),
            "sizes": args.sizes, "balance": args.balance, "idle_seconds": args.idle_seconds,
            "settle_seconds": args.settle_seconds, "rate": args.rate, "load_seconds": args.load_seconds,
            "probe_rate": args.probe_rate, "probe_seconds": args.probe_seconds, "ready_timeout": args.ready_timeout,
            "metrics_style": args.metrics_style, "health_interval": args.health_interval or GATEWAY_HEALTH_INTERVAL_S}


# =============================================================================================
# Command line
# =============================================================================================

def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n, _, m = part.strip().lower().partition("x")
        if not n.isdigit() or not m.isdigit() or int(n) < 1 or int(m) < 1:
            raise argparse.ArgumentTypeError(f"expected NxM (endpoints x routes), got {part!r}")
        out.append((int(n), int(m)))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.control_plane", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="10x100,100x1000,300x10000",
                   help="comma list of ENDPOINTSxROUTES (each endpoint serves all the routed models)")
    p.add_argument("--balance", default="round_robin,least_queue",
                   help="comma list of round_robin, least_request, least_queue")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="idle window (no client traffic)")
    p.add_argument("--settle-seconds", type=float, default=5.0, help="wait between ready and the idle window")
    p.add_argument("--rate", type=float, default=200.0, help="light-load probe: small JSON infers per second")
    p.add_argument("--load-seconds", type=float, default=10.0, help="light-load probe duration (0: skip)")
    p.add_argument("--probe-rate", type=float, default=50.0, help="event-loop hold probe: pings per second")
    p.add_argument("--probe-seconds", type=float, default=10.0, help="event-loop hold probe duration (0: skip)")
    p.add_argument("--ready-timeout", type=float, default=120.0,
                   help="seconds from process start; a gateway not ready by then is reported 'never ready'")
    p.add_argument("--metrics-style", choices=("pending", "triton"), default="pending",
                   help="fake /metrics page: the pending-request family only, or Triton's per-model families too")
    p.add_argument("--health-interval", type=float, default=None,
                   help="set health.interval_s (default: leave it to the gateway's default, 2 s)")
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/<date>-control-plane)")
    p.add_argument("--report-from", default=None, metavar="DIR", help="rewrite DIR/results.md from DIR/results.json")
    p.add_argument("--fake-server", default=None, metavar="NxM", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fake_server is None and args.report_from is None:
        args.size_list = parse_sizes(args.sizes)
        args.balance_list = [b.strip() for b in args.balance.split(",") if b.strip()]
        for b in args.balance_list:
            if b not in ("round_robin", "least_request", "least_queue"):
                p.error(f"--balance: unknown {b!r}")
    return args


async def run_all(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"meta": _meta(args), "runs": []}
    started = time.monotonic()
    for n, m in args.size_list:
        print(f"{n} endpoints x {m} routes: starting the fake endpoints", flush=True)
        fleet = await asyncio.to_thread(FakeFleet, n, m, args.metrics_style)
        try:
            for balance in args.balance_list:
                t = time.monotonic()
                res = await run_one(fleet, n, m, balance, args, logs)
                res["fake"] = fleet.sizes
                res["run_s"] = time.monotonic() - t
                doc["runs"].append(res)
                (out / "results.json").write_text(json.dumps(doc, indent=1))
                await asyncio.sleep(2)  # let the machine settle between gateways
        finally:
            fleet.stop()
    doc["meta"]["total_s"] = time.monotonic() - started
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover
        pass
    if args.fake_server is not None:
        (n, m), = parse_sizes(args.fake_server)
        asyncio.run(_fake_main(n, m, args.metrics_style))
        return 0
    if args.report_from is not None:
        d = Path(args.report_from)
        doc = json.loads((d / "results.json").read_text())
        interval = doc["meta"].get("health_interval", GATEWAY_HEALTH_INTERVAL_S)
        for r in doc["runs"]:  # the health analysis again, from the calls the fake endpoints saw
            h = health_from_file(d / "logs" / f"gw-{r['size']}-{r['balance']}.events.json", r["endpoints"],
                                 interval, r["balance"])
            if h is not None:
                r["health"] = h
        (d / "results.json").write_text(json.dumps(doc, indent=1))
        text = report(doc)
        (d / "results.md").write_text(text)
        print(text)
        return 0
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{date}-control-plane"
    out.mkdir(parents=True, exist_ok=True)
    doc = asyncio.run(run_all(args, out))
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    text = report(doc)
    (out / "results.md").write_text(text)
    print(text)
    print(f"wrote {out}/results.md, results.json, logs/ ({doc['meta']['total_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
