"""What is measured: the paths, the plans (full / quick) and one measured case.

A case is (path, tensor size, concurrency, allocator env). Every gateway case runs in a
fresh ``oip-gateway serve`` process (tests/support/gateway.py) so that one case's
allocator state — heap kept, mmap threshold raised by glibc's dynamic rule — never
flatters or penalises the next. In that process:

1. two rounds of ``concurrency`` small (1 KB) requests open the connections and load every
   lazily imported code path;
2. the peak is reset (VmHWM := current RSS, /proc/<pid>/clear_refs) and that RSS is the base;
3. full-size warm-up requests — three, one for JSON (the first one's wall time is ``first_ms``);
   they count in the peak but not in CPU or latency, so those are steady state;
4. ``n`` full-size requests, ``concurrency`` in flight, are timed; CPU and page faults are the
   /proc counters' difference over them.

Peak growth is VmHWM after step 4 minus the base; ``x_payload`` is that growth divided by
the number of requests in flight and by the tensor size. ``retained`` is RSS after the run
minus the base (memory the allocator kept).
"""
from __future__ import annotations

import asyncio
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

from .. import procstat  # the load benchmark's /proc helpers: CPU of a process tree
from . import proc
from .drive import Client, GrpcClient, HttpClient, check_answer, run_requests
from .payloads import MODEL, Bodies

__all__ = ["DIRECT", "FULL", "MALLOC_ENV", "PATHS", "QUICK", "UNTUNED_ENV", "Path", "Plan", "measure_case",
           "start_gateway"]

MiB = 1024 * 1024

# glibc tunables for the allocator comparison (DESIGN.md "Measured"): allocations up to
# 256 MiB (the gateway's default max message) come from the heap instead of a fresh mmap,
# and up to 512 MiB of freed heap top stays mapped, so the next message reuses touched
# pages instead of page-faulting a new mapping in. Setting either also turns off glibc's
# dynamic mmap threshold.
# The gateway applies the same settings itself at start-up (gateway/malloc.py), so these
# are what the floors' bare servers get for their "tuned" rows.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(512 * 1024 * 1024)}
# The allocator comparison of gateway rows: the gateway as shipped vs its tuning turned off.
UNTUNED_ENV = {"OIP_GATEWAY_MALLOC_TUNING": "0"}


@dataclass(frozen=True)
class Path:
    name: str
    client: str  # "http" | "grpc": what the benchmark client speaks
    form: str  # "binary" | "json": the HTTP body form (gRPC is always raw)
    backend: str | None  # the gateway backend's protocol; None = straight to Triton, no gateway
    role: str  # "conversion" | "pass-through" | "direct"

    @property
    def json(self) -> bool:
        return self.form == "json"


PATHS = (
    Path("http_bin>grpc", "http", "binary", "grpc", "conversion"),
    Path("http_json>grpc", "http", "json", "grpc", "conversion"),
    Path("grpc>http", "grpc", "binary", "http", "conversion"),
    Path("http>http", "http", "binary", "http", "pass-through"),
    Path("grpc>grpc", "grpc", "binary", "grpc", "pass-through"),
)
DIRECT = (
    Path("triton:http_json", "http", "json", None, "direct"),
    Path("triton:http_bin", "http", "binary", None, "direct"),
    Path("triton:grpc", "grpc", "binary", None, "direct"),
)
CONVERSIONS = tuple(p for p in PATHS if p.role == "conversion")


@dataclass(frozen=True)
class Plan:
    name: str
    sizes_mb: tuple[int, ...]
    concurrency: tuple[int, ...]
    binary_n: dict[int, int]  # size -> measured requests at concurrency 1 (binary / raw bodies)
    json_n: dict[int, int]
    direct_sizes_mb: tuple[int, ...]  # sizes with Triton-direct baselines
    malloc_sizes_mb: tuple[int, ...]  # sizes of the MALLOC_* comparison (conversion paths)
    malloc_concurrency: tuple[int, ...]
    budget_s: float  # cases that would start after this are skipped (and say so)
    request_timeout_s: float = 120.0
    case_timeout_s: float = 240.0

    def count(self, path: Path, size_mb: int, concurrency: int) -> int:
        n = (self.json_n if path.json else self.binary_n)[size_mb]
        return -(-max(n, concurrency) // concurrency) * concurrency  # whole rounds of `concurrency`


FULL = Plan(
    name="full",
    sizes_mb=(1, 16, 64),
    concurrency=(1, 4),
    binary_n={1: 60, 16: 12, 64: 8},
    json_n={1: 10, 16: 4, 64: 3},
    direct_sizes_mb=(1, 16, 64),
    malloc_sizes_mb=(16, 64),
    malloc_concurrency=(1, 4),
    budget_s=450.0,
)
QUICK = Plan(
    name="quick",
    sizes_mb=(1, 16),
    concurrency=(1, 4),
    binary_n={1: 30, 16: 4},
    json_n={1: 4, 16: 2},
    direct_sizes_mb=(16,),
    malloc_sizes_mb=(16,),
    malloc_concurrency=(1,),
    budget_s=100.0,
    request_timeout_s=60.0,
    case_timeout_s=90.0,
)


def _http_status(address: str, path: str) -> int | None:
    import http.client

    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def start_gateway(triton: Any, path: Path, workdir: FsPath, name: str, env: dict[str, str] | None) -> GatewayProcess:
    """A fresh single-process gateway routing ``identity_FP32`` to Triton's ``path.backend`` port."""
    address = triton.http_url if path.backend == "http" else triton.grpc_url
    backends = {"triton": {"protocol": path.backend, "endpoints": [address], "timeout_s": 180.0}}
    # Health rounds every 5 s: a round's CPU is a few HTTP/gRPC calls, noise beside a 1 MB request.
    config = gateway_config(backends, [{"model": MODEL, "backend": "triton"}],
                            health={"interval_s": 5.0, "timeout_s": 2.0})
    gw = GatewayProcess(config, workdir, name=name, env=env)
    gw.start(timeout=30.0)
    try:
        wait_for(lambda: _http_status(gw.http_url, "/v2/health/ready") == 200, timeout=30.0,
                 what=f"{name} readiness")
    except Exception:
        gw.stop()
        raise
    return gw


def make_client(path: Path, address: str) -> Client:
    return GrpcClient(address) if path.client == "grpc" else HttpClient(address, path.form)


def _others(triton_pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of Triton's process tree (server + Python-backend stubs) and of this client."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (procstat.cpu_seconds(triton_pid) if triton_pid else 0.0), ru.ru_utime + ru.ru_stime


async def measure_case(
    client: Client, path: Path, bodies: Bodies, small: Bodies, pid: int | None, n: int, concurrency: int,
    timeout: float, triton_pid: int | None = None,
) -> dict[str, Any]:
    for _ in range(2):
        answers = await asyncio.gather(*(client.infer(small, timeout) for _ in range(concurrency)))
        check_answer(answers[0], small, path.form)
    del answers
    row: dict[str, Any] = {}
    if pid is not None:
        before = proc.memory(pid)
        row["peak_reset"] = proc.reset_peak(pid)
        base = proc.memory(pid)["rss"] if row["peak_reset"] else max(before.values())
    # Full-size warm-ups: the first few large requests of a fresh process run slower
    # (at 64 MiB the first three took ~2x the steady state here), so binary cases get three.
    for i in range(1 if path.json else 3):
        t = time.perf_counter()
        answer = await client.infer(bodies, timeout)
        if i == 0:
            row["first_ms"] = (time.perf_counter() - t) * 1e3
            check_answer(answer, bodies, path.form)
            row["answer_bytes"] = len(answer)
        del answer
    c0 = proc.counters(pid) if pid is not None else None
    t0, k0 = _others(triton_pid)
    lat = await run_requests(lambda: client.infer(bodies, timeout), n, concurrency)
    t1, k1 = _others(triton_pid)
    row.update(
        n=n,
        median_ms=statistics.median(lat) * 1e3,
        min_ms=min(lat) * 1e3,
        max_ms=max(lat) * 1e3,
        latencies_ms=[round(x * 1e3, 1) for x in lat],
        triton_cpu_ms_per_req=(t1 - t0) * 1e3 / n if triton_pid else None,
        client_cpu_ms_per_req=(k1 - k0) * 1e3 / n,
    )
    if pid is not None and c0 is not None:
        d = proc.counters(pid) - c0
        mem = proc.memory(pid)
        growth = mem["hwm"] - base
        row.update(
            cpu_ms_per_req=d.cpu_s * 1e3 / n,
            user_ms_per_req=d.user_s * 1e3 / n,
            sys_ms_per_req=d.sys_s * 1e3 / n,
            minflt_per_req=d.minflt / n,
            base_rss_mib=base / MiB,
            peak_growth_mib=growth / MiB,
            x_payload=growth / concurrency / bodies.nbytes,
            retained_mib=(mem["rss"] - base) / MiB,
        )
    return row
