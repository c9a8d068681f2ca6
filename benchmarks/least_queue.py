"""Does ``balance: least_queue`` keep traffic off a slow Triton, and what does its scraper cost?

    .venv/bin/python -m benchmarks.least_queue [--requests N] [--concurrency C] [--out DIR]

Two real Tritons (nvidia-pytriton's binary, tests/support/triton.py) serve the same model,
``sleepy`` (benchmarks/models/sleepy: FP32 INPUT0 [-1] -> OUTPUT0 after sleeping ``sleep_ms``, one
instance, so requests beyond the one executing wait in Triton's queue). The repositories are
generated into a temporary directory and differ only in ``sleep_ms``: ~2 ms (fast Triton) and
~20 ms (slow Triton).

For each balance mode (round_robin, least_request, least_queue) a fresh gateway (1 worker) serves
one gRPC backend of both Tritons, and a closed loop of ``--concurrency`` C callers sends ``--requests``
N ``ModelInfer`` calls through the gateway's gRPC listener (grpc.aio, one channel, pre-serialized
request bytes), stopping early past ``--time-limit`` seconds. Per mode:

* slow share: the slow Triton's ``inference_count`` delta / both deltas (Triton's own statistics,
  ``GET /v2/models/sleepy/stats``, read after a warm-up and after the load has drained);
* req/s: successful calls / (last completion - first send);
* p50 / p90 / p99: latency of the successful calls as the client saw them;
* mean queue wait per Triton (statistics ``queue.ns / queue.count``) and the mean and max of
  ``nv_inference_pending_request_count`` sampled from each Triton's /metrics every 0.2 s;
* CPU of the gateway and of other processes on the machine during the run (``foreign``: a busy
  machine shows up there).

Then the scraper's own cost: a round_robin gateway and a least_queue gateway (scrape interval
``--idle-interval``, 0.1 s) run side by side with no traffic; their CPU over ``--idle-seconds``
(10 s) is reported as CPU ms per second, measured over the same window so machine noise hits both,
together with the gateway's own scrape series from its /metrics (any ``oip_gateway_*`` series
whose name mentions scrape, queue or pending).

Finally the fallback check: least_queue gateways whose metrics ports point at a closed port (a
socket bound and never listening, held for the duration: connections are refused) — once for both
endpoints, once for the fast one only — must answer every request.

``--external C2`` adds a second scenario: C2 more callers send straight to the fast Triton during
each mode's run, traffic the gateway does not see in its own in-flight counts but sees in Triton's
queue. Those calls are subtracted from the fast Triton's count for the slow share.

The Tritons are started with ``--metrics-port 0`` each, so a single ``queue_metrics.port`` cannot
reach both: the least_queue backends name each endpoint as ``{address: host:grpc_port, metrics_port:
port}``.

Output: ``benchmarks/results/<date>-least-queue/`` (``results.md``, ``results.json``, the gateway
configs and logs under ``logs/``); the markdown is printed too.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer

from .procstat import cpu_seconds, settle, system_busy_seconds

HERE = Path(__file__).resolve().parent
# The tree whose gateway package runs: the gateway processes start with this process's cwd and
# sys.path, so they import the same one (python -m puts the working directory first).
GATEWAY_TREE = Path(importlib.util.find_spec("gateway").origin or ".").resolve().parent.parent
SLEEPY = HERE / "models" / "sleepy"
MODEL = "sleepy"
BACKEND = "fleet"
MODES = ("round_robin", "least_request", "least_queue")
METHOD = "/inference.GRPCInferenceService/ModelInfer"
RPC_TIMEOUT_S = 30.0
_SLEEP_LINE = re.compile(r'(key:\s*"sleep_ms"\s*value:\s*\{\s*string_value:\s*")[^"]*(")')


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ models


def sleepy_repository(root: Path, name: str, sleep_ms: float) -> Path:
    """A Triton model repository ``root/name`` holding ``sleepy`` with ``sleep_ms`` set; its path."""
    text, count = _SLEEP_LINE.subn(lambda m: f"{m.group(1)}{sleep_ms!r}{m.group(2)}",
                                   (SLEEPY / "config.pbtxt").read_text())
    if count != 1:
        raise RuntimeError(f"{SLEEPY / 'config.pbtxt'} has no single sleep_ms parameter to set")
    repo = root / name
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(text)
    # A copy, not a symlink: the stub's __pycache__ then lands in the temporary repository.
    shutil.copy(SLEEPY / "1" / "model.py", repo / MODEL / "1" / "model.py")
    return repo


def infer_request(elements: int = 16) -> tuple[bytes, bytes]:
    """A serialized ModelInferRequest for sleepy and the raw bytes OUTPUT0 must echo."""
    from tritonclient.grpc import service_pb2

    data = np.arange(elements, dtype=np.float32).tobytes()
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.append(elements)
    req.raw_input_contents.append(data)
    return req.SerializeToString(), data


def check_response(raw: bytes, expected: bytes) -> None:
    from tritonclient.grpc import service_pb2

    resp = service_pb2.ModelInferResponse.FromString(raw)
    if resp.model_name != MODEL or list(resp.raw_output_contents) != [expected]:
        raise RuntimeError(f"unexpected answer from sleepy: {resp}")


# ------------------------------------------------------------------------------------ Triton views


def _http_get(hostport: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    host, port = hostport.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class Stats:
    """The parts of Triton's statistics for sleepy that the report uses (cumulative)."""

    inference_count: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    fail_count: int = 0

    def __sub__(self, other: Stats) -> Stats:
        return Stats(*(a - b for a, b in zip(asdict(self).values(), asdict(other).values())))


def model_stats(triton: TritonServer) -> Stats:
    status, body = _http_get(triton.http_url, f"/v2/models/{MODEL}/stats")
    if status != 200:
        raise RuntimeError(f"stats of {triton.http_url}: HTTP {status} {body[:200]!r}")
    entry = json.loads(body)["model_stats"][0]
    inf = entry["inference_stats"]
    return Stats(
        inference_count=int(entry["inference_count"]),
        queue_count=int(inf["queue"]["count"]), queue_ns=int(inf["queue"]["ns"]),
        compute_count=int(inf["compute_infer"]["count"]), compute_ns=int(inf["compute_infer"]["ns"]),
        fail_count=int(inf["fail"]["count"]),
    )


_PENDING = re.compile(r'^nv_inference_pending_request_count\{[^}]*model="sleepy"[^}]*\}\s+(\S+)', re.M)


def pending(triton: TritonServer) -> float | None:
    """Triton's ``nv_inference_pending_request_count`` for sleepy (None when absent)."""
    status, body = _http_get(triton.metrics_url, "/metrics")
    if status != 200:
        return None
    m = _PENDING.search(body.decode(errors="replace"))
    return float(m.group(1)) if m else None


class PendingSampler:
    """Samples each Triton's pending count every ``interval`` in a thread while the block runs."""

    def __init__(self, tritons: dict[str, TritonServer], interval: float = 0.2) -> None:
        self.tritons, self.interval = tritons, interval
        self.samples: dict[str, list[float]] = {k: [] for k in tritons}
        self.missing = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name, triton in self.tritons.items():
                try:
                    value = pending(triton)
                except OSError:
                    value = None
                if value is None:
                    self.missing += 1
                else:
                    self.samples[name].append(value)

    def __enter__(self) -> PendingSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict[str, dict[str, float | None]]:
        return {k: {"mean": float(np.mean(v)) if v else None, "max": float(np.max(v)) if v else None,
                    "samples": len(v)} for k, v in self.samples.items()}


def tritons_idle(tritons: dict[str, TritonServer], timeout: float = 60.0) -> float:
    """Wait (bounded) until no request is pending on either Triton and their counts stand still."""
    began = time.monotonic()
    last: list[int] = []

    def quiet() -> bool:
        nonlocal last
        counts = [model_stats(t).inference_count for t in tritons.values()]
        still = counts == last
        last = counts
        return still and all((pending(t) or 0) == 0 for t in tritons.values())

    wait_for(quiet, timeout=timeout, interval=0.25, what="both Tritons idle")
    return time.monotonic() - began


# ---------------------------------------------------------------------------------------- gateway


@dataclass
class ClosedPort:
    """A TCP port bound and never listening: connecting to it is refused, and nobody can take it
    while this object holds it (no guessing of free ports)."""

    sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))

    def __post_init__(self) -> None:
        self.sock.bind(("127.0.0.1", 0))

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def fleet_config(mode: str, tritons: dict[str, TritonServer], *, interval: float,
                 metrics_ports: dict[str, int] | None = None) -> dict[str, Any]:
    """One gRPC backend of both Tritons balanced by ``mode``. least_queue names each endpoint with its
    own metrics port (``metrics_ports`` overrides them, e.g. with a closed port)."""
    backend: dict[str, Any] = {"protocol": "grpc", "balance": mode, "timeout_s": 60}
    if mode == "least_queue":
        ports = {name: t.metrics_port for name, t in tritons.items()} | (metrics_ports or {})
        backend["endpoints"] = [{"address": t.grpc_url, "metrics_port": ports[name]} for name, t in tritons.items()]
        backend["queue_metrics"] = {"interval_s": interval}
    else:
        backend["endpoints"] = [t.grpc_url for t in tritons.values()]
    # Health checks every second: the same for every mode, so they cancel in the idle comparison.
    return gateway_config({BACKEND: backend}, [{"model": MODEL, "backend": BACKEND}],
                          health={"interval_s": 1.0, "timeout_s": 1.0})


def gateway_metrics(gw: GatewayProcess) -> str:
    status, body = _http_get(gw.metrics_url, "/metrics")
    if status != 200:
        raise RuntimeError(f"gateway /metrics: HTTP {status}")
    return body.decode(errors="replace")


_SCRAPE_SERIES = re.compile(r"^(oip_gateway_\w*(?:scrape|queue|pending)\w*)(\{[^}]*\})?\s+(\S+)$", re.M)


def scrape_series(text: str) -> dict[str, float]:
    """The gateway's own series about backend metrics scraping (whatever their names turn out to be)."""
    return {f"{m.group(1)}{m.group(2) or ''}": float(m.group(3)) for m in _SCRAPE_SERIES.finditer(text)
            if not m.group(1).endswith("_created")}


def wait_gateway_ready(gw: GatewayProcess, endpoints: int, timeout: float = 60.0) -> None:
    """Bounded wait until the gateway reports ``endpoints`` healthy endpoints in the backend."""
    pattern = re.compile(rf'^oip_gateway_endpoint_healthy\{{[^}}]*backend="{BACKEND}"[^}}]*\}}\s+1(\.0)?$', re.M)
    wait_for(lambda: len(pattern.findall(gateway_metrics(gw))) >= endpoints, timeout=timeout,
             interval=0.1, what=f"{endpoints} healthy endpoints in the gateway")


def start_gateway(config: dict[str, Any], logs: Path, name: str, workers: int) -> GatewayProcess:
    gw = GatewayProcess(config, logs, name=name, workers=workers)
    gw.start(timeout=60)
    return gw


def gateway_log_problems(gw: GatewayProcess) -> list[str]:
    try:
        lines = gw.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if re.search(r"Traceback|ERROR|Exception|error", ln)][:20]


# ------------------------------------------------------------------------------------------- load


@dataclass
class LoadOutcome:
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    issued: int = 0
    seconds: float = 0.0  # first send to last completion
    aborted: bool = False  # stopped by the time limit before N were sent
    latencies_s: list[float] = field(default_factory=list, repr=False)
    external_ok: int = 0
    external_errors: int = 0

    def percentile_ms(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s else None

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0


async def _closed_loop(target: str, body: bytes, n: int, concurrency: int, time_limit: float,
                       external: tuple[str, int] | None = None) -> LoadOutcome:
    """``concurrency`` callers send ``n`` calls in all, each waiting for its answer before the next;
    no call starts after ``time_limit`` s. ``external`` (target, callers): more callers, on their own
    channel, for as long as the main load runs."""
    out = LoadOutcome()
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + time_limit
    last_done = start
    done = asyncio.Event()

    async def caller(call: grpc.aio.UnaryUnaryMultiCallable) -> None:
        nonlocal last_done
        while out.issued < n and loop.time() < deadline:
            out.issued += 1
            t0 = time.perf_counter()
            try:
                await call(body, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                out.errors[exc.code().name] = out.errors.get(exc.code().name, 0) + 1
                continue
            out.latencies_s.append(time.perf_counter() - t0)
            out.ok += 1
            last_done = loop.time()

    async def outsider(call: grpc.aio.UnaryUnaryMultiCallable) -> None:
        while not done.is_set() and loop.time() < deadline:
            try:
                await call(body, timeout=RPC_TIMEOUT_S)
                out.external_ok += 1
            except grpc.aio.AioRpcError:
                out.external_errors += 1

    async with grpc.aio.insecure_channel(target) as channel, \
            grpc.aio.insecure_channel(external[0] if external else target) as side_channel:
        call = channel.unary_unary(METHOD)  # no (de)serializers: bytes in, bytes out
        side = [asyncio.ensure_future(outsider(side_channel.unary_unary(METHOD)))
                for _ in range(external[1] if external else 0)]
        callers = asyncio.gather(*(caller(call) for _ in range(concurrency)))
        try:
            await asyncio.wait_for(callers, timeout=time_limit + RPC_TIMEOUT_S + 5)
        except TimeoutError:
            out.aborted = True
        done.set()
        if side:
            await asyncio.wait_for(asyncio.gather(*side, return_exceptions=True), timeout=RPC_TIMEOUT_S + 5)
    out.aborted = out.aborted or out.issued < n
    out.seconds = last_done - start
    return out


def closed_loop(target: str, body: bytes, n: int, concurrency: int, time_limit: float,
                external: tuple[str, int] | None = None) -> LoadOutcome:
    return asyncio.run(_closed_loop(target, body, n, concurrency, time_limit, external))


def warm_up(gw: GatewayProcess, tritons: dict[str, TritonServer], body: bytes, expected: bytes,
            concurrency: int, timeout: float = 30.0) -> int:
    """Send through the gateway (checking one answer) until both Tritons have served some of it;
    bounded by ``timeout`` and 50 rounds. Returns the calls sent."""
    async def one() -> bytes:
        async with grpc.aio.insecure_channel(gw.grpc_url) as channel:
            return await channel.unary_unary(METHOD)(body, timeout=RPC_TIMEOUT_S)

    check_response(asyncio.run(one()), expected)
    before = {k: model_stats(t).inference_count for k, t in tritons.items()}
    sent, deadline = 1, time.monotonic() + timeout
    for _ in range(50):
        res = closed_loop(gw.grpc_url, body, 2 * concurrency, concurrency, time_limit=10)
        sent += res.issued
        if res.errors:
            raise RuntimeError(f"warm-up through the gateway failed: {res.errors}\n{gw.log_tail()}")
        if all(model_stats(t).inference_count > before[k] for k, t in tritons.items()) or \
                time.monotonic() > deadline:
            break
    return sent


# ------------------------------------------------------------------------------------------ parts


def run_mode(mode: str, tritons: dict[str, TritonServer], logs: Path, args: argparse.Namespace,
             body: bytes, expected: bytes, *, external: int = 0, tag: str = "") -> dict[str, Any]:
    name = f"gw-{mode}{tag}"
    gw = start_gateway(fleet_config(mode, tritons, interval=args.interval), logs, name, args.workers)
    try:
        assert gw.proc is not None
        wait_gateway_ready(gw, len(tritons))
        warm = warm_up(gw, tritons, body, expected, args.concurrency)
        scrape_waited = None
        if mode == "least_queue":
            # Bounded: until the gateway reports scrape series (if it exposes any) or 5 intervals.
            began = time.monotonic()
            try:
                wait_for(lambda: scrape_series(gateway_metrics(gw)), timeout=max(1.0, 5 * args.interval),
                         interval=0.05, what="scrape series")
            except TimeoutError:
                pass
            scrape_waited = time.monotonic() - began
        tritons_idle(tritons)
        before = {k: model_stats(t) for k, t in tritons.items()}
        cpu0 = {"gateway": cpu_seconds(gw.proc.pid), **{k: cpu_seconds(t.pid) for k, t in tritons.items()}}
        sys0, self0, wall0 = system_busy_seconds(), _self_cpu(), time.monotonic()
        with PendingSampler(tritons) as sampler:
            res = closed_loop(gw.grpc_url, body, args.requests, args.concurrency, args.time_limit,
                              external=(tritons["fast"].grpc_url, external) if external else None)
        wall = time.monotonic() - wall0
        cpu1 = {"gateway": cpu_seconds(gw.proc.pid), **{k: cpu_seconds(t.pid) for k, t in tritons.items()}}
        ours = sum(cpu1.values()) - sum(cpu0.values()) + _self_cpu() - self0
        foreign = max(0.0, system_busy_seconds() - sys0 - ours) / wall / (os.cpu_count() or 1)
        drained = tritons_idle(tritons)
        delta = {k: model_stats(t) - before[k] for k, t in tritons.items()}
        gw_metrics = gateway_metrics(gw)
        problems = gateway_log_problems(gw)
    finally:
        gw.stop()
    counted = {k: d.inference_count for k, d in delta.items()}
    counted["fast"] -= res.external_ok  # external calls went straight to the fast Triton
    total = sum(counted.values())
    result = {
        "mode": mode, "external_callers": external, "requests": args.requests, "concurrency": args.concurrency,
        "ok": res.ok, "errors": res.errors, "issued": res.issued, "aborted": res.aborted,
        "seconds": res.seconds, "rps": res.rps,
        "p50_ms": res.percentile_ms(50), "p90_ms": res.percentile_ms(90), "p99_ms": res.percentile_ms(99),
        "mean_ms": float(np.mean(res.latencies_s) * 1e3) if res.latencies_s else None,
        "served": counted, "slow_share": counted["slow"] / total if total else None,
        "triton_stats_delta": {k: asdict(d) for k, d in delta.items()},
        "mean_queue_ms": {k: d.queue_ns / d.queue_count / 1e6 if d.queue_count else None for k, d in delta.items()},
        "mean_compute_ms": {k: d.compute_ns / d.compute_count / 1e6 if d.compute_count else None
                            for k, d in delta.items()},
        "pending_sampled": sampler.summary(), "pending_missing_samples": sampler.missing,
        "external_ok": res.external_ok, "external_errors": res.external_errors,
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in cpu0}, "wall_s": wall, "foreign_cpu_frac": foreign,
        "drain_s": drained, "warmup_calls": warm, "scrape_wait_s": scrape_waited,
        "gateway_scrape_series": scrape_series(gw_metrics), "gateway_log_problems": problems,
    }
    log(f"{mode}{tag}: ok {res.ok}/{res.issued} errors {res.errors or 0} slow share "
        f"{_pct(result['slow_share'])} {res.rps:.0f} req/s p50 {_ms(result['p50_ms'])} p99 {_ms(result['p99_ms'])}"
        f" foreign {foreign:.0%}")
    return result


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def idle_cost(tritons: dict[str, TritonServer], logs: Path, args: argparse.Namespace) -> dict[str, Any]:
    """CPU per second of an idle round_robin gateway and an idle least_queue gateway scraping every
    ``args.idle_interval`` s, over the same window."""
    gws: dict[str, GatewayProcess] = {}
    try:
        for mode in ("round_robin", "least_queue"):
            gws[mode] = start_gateway(fleet_config(mode, tritons, interval=args.idle_interval), logs,
                                      f"gw-idle-{mode}", args.workers)
        for gw in gws.values():
            wait_gateway_ready(gw, len(tritons))
        pids = {m: gw.proc.pid for m, gw in gws.items() if gw.proc is not None}
        settled = settle(list(pids.values()), busy=0.2, timeout=30)
        series0 = scrape_series(gateway_metrics(gws["least_queue"]))
        cpu0 = {m: cpu_seconds(p) for m, p in pids.items()}
        tri0 = {k: cpu_seconds(t.pid) for k, t in tritons.items()}
        sys0, t0 = system_busy_seconds(), time.monotonic()
        # Consecutive windows, to see how much one window's figure moves; the totals are over all.
        windows: list[dict[str, float]] = []
        for _ in range(args.idle_rounds):
            w0, c0 = time.monotonic(), {m: cpu_seconds(p) for m, p in pids.items()}
            time.sleep(args.idle_seconds)  # the measurement window itself, not a synchronization
            w = time.monotonic() - w0
            windows.append({m: (cpu_seconds(p) - c0[m]) / w * 1e3 for m, p in pids.items()})
        window = time.monotonic() - t0
        cpu1 = {m: cpu_seconds(p) for m, p in pids.items()}
        tri1 = {k: cpu_seconds(t.pid) for k, t in tritons.items()}
        busy = system_busy_seconds() - sys0
        series1 = scrape_series(gateway_metrics(gws["least_queue"]))
        rr_series = scrape_series(gateway_metrics(gws["round_robin"]))
        problems = {m: gateway_log_problems(gw) for m, gw in gws.items()}
    finally:
        for gw in gws.values():
            gw.stop()
    ms_per_s = {m: (cpu1[m] - cpu0[m]) / window * 1e3 for m in pids}
    ours = sum(cpu1[m] - cpu0[m] for m in pids) + sum(tri1[k] - tri0[k] for k in tritons)
    result = {
        "window_s": window, "interval_s": args.idle_interval, "settle_s": settled,
        "cpu_ms_per_s": ms_per_s, "windows_cpu_ms_per_s": windows,
        "scraper_cpu_ms_per_s": ms_per_s["least_queue"] - ms_per_s["round_robin"],
        "triton_cpu_ms_per_s": {k: (tri1[k] - tri0[k]) / window * 1e3 for k in tritons},
        "foreign_cpu_frac": max(0.0, busy - ours) / window / (os.cpu_count() or 1),
        "clock_tick_ms": 1e3 / os.sysconf("SC_CLK_TCK"),
        "gateway_scrape_series_start": series0, "gateway_scrape_series_end": series1,
        "gateway_scrape_series_delta": {k: series1[k] - series0.get(k, 0.0) for k in series1},
        "round_robin_scrape_series": rr_series, "gateway_log_problems": problems,
    }
    log(f"idle: round_robin {ms_per_s['round_robin']:.1f} CPU ms/s, least_queue@{args.idle_interval}s "
        f"{ms_per_s['least_queue']:.1f} CPU ms/s (scraper ≈ {result['scraper_cpu_ms_per_s']:+.1f})")
    return result


def fallback_check(tritons: dict[str, TritonServer], logs: Path, args: argparse.Namespace, body: bytes,
                   expected: bytes) -> list[dict[str, Any]]:
    """least_queue with metrics ports that refuse connections: every request must still succeed."""
    out = []
    n = min(args.requests, args.fallback_requests)
    for label, down in (("both metrics ports closed", ("fast", "slow")), ("fast's metrics port closed", ("fast",))):
        with ExitStack() as stack:
            closed = {k: stack.enter_context(closing(ClosedPort())) for k in down}
            cfg = fleet_config("least_queue", tritons, interval=args.interval,
                               metrics_ports={k: c.port for k, c in closed.items()})
            gw = start_gateway(cfg, logs, f"gw-fallback-{'-'.join(down)}", args.workers)
            try:
                wait_gateway_ready(gw, len(tritons))
                warm_up(gw, tritons, body, expected, args.concurrency)
                tritons_idle(tritons)
                before = {k: model_stats(t) for k, t in tritons.items()}
                res = closed_loop(gw.grpc_url, body, n, args.concurrency, args.time_limit)
                tritons_idle(tritons)
                delta = {k: (model_stats(t) - before[k]).inference_count for k, t in tritons.items()}
                series = scrape_series(gateway_metrics(gw))
                problems = gateway_log_problems(gw)
            finally:
                gw.stop()
        total = sum(delta.values())
        item = {"case": label, "closed": list(down), "requests": n, "ok": res.ok, "errors": res.errors,
                "issued": res.issued, "passed": res.ok == n and not res.errors,
                "slow_share": delta["slow"] / total if total else None, "rps": res.rps,
                "p50_ms": res.percentile_ms(50), "p99_ms": res.percentile_ms(99),
                "gateway_scrape_series": series, "gateway_log_problems": problems}
        log(f"fallback ({label}): {res.ok}/{n} ok, errors {res.errors or 0}, slow share {_pct(item['slow_share'])}")
        out.append(item)
    return out


# ----------------------------------------------------------------------------------------- report


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def mode_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| mode | slow share | req/s | p50 ms | p90 ms | p99 ms |", "|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        note = "" if r["ok"] == r["requests"] and not r["errors"] else \
            f" ({r['ok']}/{r['requests']} ok{', errors ' + json.dumps(r['errors']) if r['errors'] else ''}" \
            f"{', time limit hit' if r['aborted'] else ''})"
        lines.append(f"| {r['mode']}{note} | {_pct(r['slow_share'])} | {r['rps']:.0f} | {_ms(r['p50_ms'])} | "
                     f"{_ms(r['p90_ms'])} | {_ms(r['p99_ms'])} |")
    return lines


def detail_table(rows: list[dict[str, Any]]) -> list[str]:
    external = any(r["external_callers"] for r in rows)
    lines = ["| mode | served fast / slow | mean queue wait ms fast / slow | pending (sampled) mean·max fast / slow "
             "| compute ms fast / slow | gateway CPU µs/req | foreign CPU |"
             + (" external req/s |" if external else ""),
             "|---|--:|--:|--:|--:|--:|--:|" + ("--:|" if external else "")]
    for r in rows:
        p = r["pending_sampled"]
        pend = " / ".join(f"{_num(p[k]['mean'])}·{_num(p[k]['max'], '{:.0f}')}" for k in ("fast", "slow"))
        q = " / ".join(_num(r["mean_queue_ms"][k]) for k in ("fast", "slow"))
        c = " / ".join(_num(r["mean_compute_ms"][k]) for k in ("fast", "slow"))
        cpu = r["cpu_s"]["gateway"] / r["ok"] * 1e6 if r["ok"] else None
        lines.append(f"| {r['mode']} | {r['served']['fast']} / {r['served']['slow']} | {q} | {pend} | {c} | "
                     f"{_num(cpu, '{:.0f}')} | {r['foreign_cpu_frac']:.0%} |"
                     + (f" {r['external_ok'] / r['seconds']:.0f} |" if external and r["seconds"] > 0 else ""))
    return lines


def render(results: dict[str, Any]) -> str:
    cfg = results["config"]
    out = [f"# least_queue vs round_robin vs least_request ({results['date']})", "",
           f"Run {results['started']} on {results['machine']['cpus']} CPUs ({results['machine']['cpu_model']}), "
           f"Linux {results['machine']['kernel']}, Python {results['machine']['python']}, grpcio "
           f"{results['machine']['grpcio']}; gateway from `{results.get('gateway_tree', '?')}`, commit "
           f"{results['gateway_commit']}"
           f"{' + uncommitted changes' if results['gateway_dirty'] else ''}.", "",
           f"Two Tritons serve `sleepy` (one instance each): fast sleeps {cfg['fast_sleep_ms']} ms, slow "
           f"{cfg['slow_sleep_ms']} ms per request. One gateway ({cfg['workers']} worker) per mode with one gRPC "
           f"backend of both; {cfg['requests']} `ModelInfer` calls, closed loop at concurrency {cfg['concurrency']} through "
           f"the gateway's gRPC listener (time limit {cfg['time_limit_s']:.0f} s per mode); least_queue scrapes "
           f"every {cfg['interval_s']} s. Slow share = the slow Triton's `inference_count` delta over both "
           "(Triton's own statistics).", ""]
    for scenario in results["scenarios"]:
        out += [f"## {scenario['title']}", "", *mode_table(scenario["modes"]), "",
                "Details (Triton statistics over the run; pending = `nv_inference_pending_request_count` sampled "
                "every 0.2 s by the harness):", "", *detail_table(scenario["modes"]), ""]
    idle = results.get("idle")
    if idle:
        out += ["## Scraper cost (idle gateways, no traffic)", "",
                f"**Scraper cost: {idle['scraper_cpu_ms_per_s']:+.1f} CPU ms per second** — least_queue scraping 2 "
                f"endpoints every {idle['interval_s']} s used {idle['cpu_ms_per_s']['least_queue']:.1f} CPU ms/s, an "
                f"idle round_robin gateway {idle['cpu_ms_per_s']['round_robin']:.1f} CPU ms/s "
                f"(same {idle['window_s']:.0f} s window, /proc utime+stime, resolution "
                f"{idle['clock_tick_ms']:.0f} ms per window ≈ {idle['clock_tick_ms'] / idle['window_s']:.1f} ms/s; "
                f"foreign CPU {idle['foreign_cpu_frac']:.0%}). Meanwhile the Tritons (answering those scrapes and "
                "both gateways' health checks, nothing else) used: "
                + ", ".join(f"{k} {v:.1f} CPU ms/s" for k, v in idle["triton_cpu_ms_per_s"].items()) + ".", ""]
        if len(idle.get("windows_cpu_ms_per_s", [])) > 1:
            out += [f"Per {idle['window_s'] / len(idle['windows_cpu_ms_per_s']):.0f} s window (CPU ms/s, least_queue − "
                    "round_robin): " + ", ".join(f"{w['least_queue']:.0f} − {w['round_robin']:.0f} = "
                                                 f"{w['least_queue'] - w['round_robin']:+.0f}"
                                                 for w in idle["windows_cpu_ms_per_s"]) + ".", ""]
        delta = idle["gateway_scrape_series_delta"]
        if delta:
            out += ["Gateway scrape series (least_queue gateway; value at the end, change over the window):", ""]
            out += [f"- `{k}` = {idle['gateway_scrape_series_end'][k]:g} (Δ {v:+g})" for k, v in sorted(delta.items())]
            out.append("")
        else:
            out += ["The gateway exposed no `oip_gateway_*` series about scraping (names with scrape, queue or "
                    "pending) on its metrics listener.", ""]
    fb = results.get("fallback")
    if fb:
        out += ["## Fallback: metrics port down", "",
                "least_queue with `metrics_port` pointing at a bound, never-listening port (connections refused):", "",
                "| case | requests ok | errors | slow share | req/s | p99 ms | result |",
                "|---|--:|--:|--:|--:|--:|---|"]
        for f in fb:
            out.append(f"| {f['case']} | {f['ok']}/{f['requests']} | {json.dumps(f['errors']) if f['errors'] else 0} | "
                       f"{_pct(f['slow_share'])} | {f['rps']:.0f} | {_ms(f['p99_ms'])} | "
                       f"{'pass' if f['passed'] else '**FAIL**'} |")
        out.append("")
        for f in fb:
            if f["gateway_scrape_series"]:
                out.append(f"- {f['case']}: " + ", ".join(f"`{k}` = {v:g}" for k, v in
                                                            sorted(f["gateway_scrape_series"].items())))
            if f["gateway_log_problems"]:
                out.append(f"- {f['case']}: gateway log lines mentioning errors: {len(f['gateway_log_problems'])} "
                           f"(first: `{f['gateway_log_problems'][0][:200]}`)")
        out.append("")
    if results.get("notes"):
        out += ["## Notes", "", *[f"- {n}" for n in results["notes"]], ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- main


def _machine() -> dict[str, Any]:
    model = ""
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "grpcio": grpc.__version__}


def _git(*cmd: str) -> str:
    import subprocess

    try:
        return subprocess.run(["git", *cmd], cwd=GATEWAY_TREE, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.least_queue", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000, help="calls per mode (default 4000)")
    ap.add_argument("--concurrency", type=int, default=16, help="callers in the closed loop (default 16)")
    ap.add_argument("--out", type=Path, default=None, help="results directory (default results/<date>-least-queue)")
    ap.add_argument("--time-limit", type=float, default=120.0, help="no call starts later than this per mode (s)")
    ap.add_argument("--fast-ms", type=float, default=2.0, help="sleep of the fast Triton (ms)")
    ap.add_argument("--slow-ms", type=float, default=20.0, help="sleep of the slow Triton (ms)")
    ap.add_argument("--interval", type=float, default=0.25, help="least_queue scrape interval under load (s)")
    ap.add_argument("--idle-interval", type=float, default=0.1, help="scrape interval for the idle cost (s)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle measurement window (s)")
    ap.add_argument("--idle-rounds", type=int, default=2, help="consecutive idle windows (default 2)")
    ap.add_argument("--fallback-requests", type=int, default=1000, help="calls per fallback case")
    ap.add_argument("--external", type=int, default=0,
                    help="also run a scenario with this many callers straight to the fast Triton (0: off)")
    ap.add_argument("--workers", type=int, default=1, help="gateway worker processes (default 1)")
    ap.add_argument("--modes", default=",".join(MODES), help="balance modes to run, comma separated")
    ap.add_argument("--skip", default="", help="parts to skip, comma separated: idle,fallback")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if unknown := set(args.modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}")
    args.skip = {s for s in args.skip.split(",") if s}
    if min(args.requests, args.concurrency, args.idle_rounds) < 1 or args.time_limit <= 0:
        ap.error("--requests, --concurrency, --idle-rounds and --time-limit must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    date = datetime.now().strftime("%F")
    out_dir = args.out or HERE / "results" / f"{date}-least-queue"
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    body, expected = infer_request()
    results: dict[str, Any] = {
        "date": date, "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(),
        "gateway_tree": str(GATEWAY_TREE),
        "gateway_commit": _git("rev-parse", "--short", "HEAD") or "none (not a git checkout)",
        "gateway_dirty": bool(_git("status", "--porcelain", "--", "gateway")),
        "config": {"requests": args.requests, "concurrency": args.concurrency, "time_limit_s": args.time_limit,
                   "fast_sleep_ms": args.fast_ms, "slow_sleep_ms": args.slow_ms, "interval_s": args.interval,
                   "idle_interval_s": args.idle_interval, "idle_seconds": args.idle_seconds,
                   "idle_rounds": args.idle_rounds,
                   "workers": args.workers, "external": args.external, "rpc_timeout_s": RPC_TIMEOUT_S},
        "scenarios": [], "notes": [],
    }
    tmp = Path(tempfile.mkdtemp(prefix="least-queue-"))
    tritons: dict[str, TritonServer] = {}
    try:
        for name, ms in (("fast", args.fast_ms), ("slow", args.slow_ms)):
            repo = sleepy_repository(tmp, name, ms)
            log(f"starting the {name} Triton (sleepy sleeps {ms} ms)")
            tritons[name] = TritonServer(repo).start(tmp / f"triton-{name}")
            log(f"  {tritons[name]!r}")
        results["tritons"] = {k: {"http": t.http_url, "grpc": t.grpc_url, "metrics": t.metrics_url}
                              for k, t in tritons.items()}
        if all(pending(t) is None for t in tritons.values()):
            results["notes"].append("Triton's /metrics has no nv_inference_pending_request_count for sleepy: "
                                    "least_queue has no queue to read and can only fall back.")
        scenarios = [("plain", 0, "Fast and slow Triton, all traffic through the gateway")]
        if args.external:
            scenarios.append(("external", args.external,
                              f"With {args.external} more callers straight to the fast Triton (not via the gateway)"))
        for key, external, title in scenarios:
            rows = [run_mode(m, tritons, logs, args, body, expected, external=external,
                             tag="" if key == "plain" else f"-{key}") for m in args.modes]
            results["scenarios"].append({"key": key, "title": title, "external": external, "modes": rows})
            _write(out_dir, results)
        if "idle" not in args.skip:
            results["idle"] = idle_cost(tritons, logs, args)
            _write(out_dir, results)
        if "fallback" not in args.skip:
            results["fallback"] = fallback_check(tritons, logs, args, body, expected)
    finally:
        for name, t in tritons.items():
            if t.log_path is not None and t.log_path.exists():
                shutil.copy(t.log_path, logs / f"triton-{name}.log")
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        results["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        try:
            _write(out_dir, results)
        except Exception as exc:  # never hide the error that got us here
            log(f"could not write the results: {exc!r}")
    print(render(results))
    log(f"wrote {out_dir / 'results.md'} and results.json")
    failed = any(not f["passed"] for f in results.get("fallback", [])) or any(
        r["errors"] for s in results["scenarios"] for r in s["modes"])
    return 1 if failed else 0


def _write(out_dir: Path, results: dict[str, Any]) -> None:
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out_dir / "results.md").write_text(render(results) + "\n")


if __name__ == "__main__":
    sys.exit(main())
