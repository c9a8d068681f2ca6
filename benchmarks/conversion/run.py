"""Conversion benchmark: the gateway's CPU, peak memory and latency per conversion path,
against one real Triton (benchmarks/conversion/README.md). Cases run in order within the
plan's time budget; ``--profile`` instead profiles the large conversions and measures the
floors of the gateway's stack.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path as FsPath
from typing import Any

from tests.support.triton import TritonServer, triton_available

from . import proc, report
from .cases import (
    CONVERSIONS,
    DIRECT,
    FULL,
    MALLOC_ENV,
    PATHS,
    QUICK,
    UNTUNED_ENV,
    MiB,
    Path,
    Plan,
    make_client,
    measure_case,
    start_gateway,
)
from .floor import markdown as floor_markdown
from .floor import measure_floors
from .payloads import Bodies, build
from .profile import Recorder, ThreadCpu, perf, perf_summary, perf_text, py_spy, summarize

__all__ = ["main"]

RESULTS = FsPath(__file__).resolve().parent / "results"
REPO = str(FsPath(__file__).resolve().parents[2])


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cases(plan: Plan, only: set[str] | None) -> Iterator[tuple[Path, int, int, bool]]:
    def chosen(path: Path) -> bool:
        return only is None or path.name in only

    for size in plan.sizes_mb:
        for path in filter(chosen, PATHS):
            for c in plan.concurrency:
                yield path, size, c, False
        if size in plan.direct_sizes_mb:
            for path in filter(chosen, DIRECT):
                yield path, size, 1, False
        if size in plan.malloc_sizes_mb:
            for path in filter(chosen, CONVERSIONS):
                for c in plan.malloc_concurrency:
                    yield path, size, c, True


async def _run_case(
    plan: Plan, triton: TritonServer, workdir: FsPath, index: int, path: Path, size: int, c: int, malloc: bool,
    bodies: Bodies, small: Bodies, deadline: float,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "path": path.name, "role": path.role, "form": path.form, "size_mib": size, "payload_bytes": bodies.nbytes,
        "body_bytes": len(bodies.grpc if path.client == "grpc" else bodies.http_body(path.form)),
        "concurrency": c, "malloc_env": malloc,
    }
    if time.monotonic() > deadline:
        row["skipped"] = "budget"
        return row
    gw = None
    try:
        if path.backend is not None:
            gw = await asyncio.to_thread(start_gateway, triton, path, workdir, f"gw{index:02d}",
                                         UNTUNED_ENV if malloc else None)
            address = gw.http_url if path.client == "http" else gw.grpc_url
        else:
            address = triton.http_url if path.client == "http" else triton.grpc_url
        client = make_client(path, address)
        try:
            row.update(await asyncio.wait_for(
                measure_case(client, path, bodies, small, gw.proc.pid if gw and gw.proc else None,
                             plan.count(path, size, c), c, plan.request_timeout_s,
                             triton.proc.pid if triton.proc else None),
                plan.case_timeout_s,
            ))
        finally:
            await client.close()
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        if gw is not None:
            row["gateway_log"] = gw.log_tail(10)
    finally:
        if gw is not None:
            await asyncio.to_thread(gw.stop)
    return row


def _summary(row: dict[str, Any]) -> str:
    env = " untuned-allocator" if row["malloc_env"] else ""
    head = f"{row['path']:<18} {row['size_mib']:>3} MiB c={row['concurrency']}{env}"
    if "skipped" in row or "error" in row:
        return f"{head}: {row.get('error') or 'skipped (' + row['skipped'] + ')'}"
    text = f"{head}: median {row['median_ms']:.1f} ms (n={row['n']})"
    if "cpu_ms_per_req" in row:
        text += (f", CPU {row['cpu_ms_per_req']:.1f} ms/req, peak +{row['peak_growth_mib']:.0f} MiB "
                 f"= {row['x_payload']:.2f}× payload per in-flight")
    return text


async def _run_plan(plan: Plan, triton: TritonServer, workdir: FsPath, began: float,
                    only: set[str] | None) -> list[dict[str, Any]]:
    deadline = began + plan.budget_s
    small = build(1024)
    rows: list[dict[str, Any]] = []
    bodies: Bodies | None = None
    for i, (path, size, c, malloc) in enumerate(_cases(plan, only)):
        if bodies is None or bodies.nbytes != size * MiB:
            bodies = None
            bodies = build(size * MiB)
        row = await _run_case(plan, triton, workdir, i, path, size, c, malloc, bodies, small, deadline)
        _log(f"[{time.monotonic() - began:5.0f}s] {_summary(row)}")
        rows.append(row)
    return rows


def _meta(plan: Plan, triton: TritonServer, wall: float) -> dict[str, Any]:
    versions = {}
    for dist in ("grpcio", "protobuf", "aiohttp", "uvicorn", "starlette", "uvloop", "orjson", "numpy",
                 "nvidia-pytriton"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {
        "date": dt.date.today().isoformat(),
        "plan": plan.name,
        "wall_s": wall,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "glibc": (os.confstr("CS_GNU_LIBC_VERSION") or "? ?").split()[-1],
        "kernel": platform.release(),
        "versions": versions,
        "malloc_env": UNTUNED_ENV,
        "triton_startup_s": triton.startup_seconds,
        "plan_detail": {k: v for k, v in vars(plan).items() if k != "name"},
    }


async def _profile(plan: Plan, triton: TritonServer, workdir: FsPath, out_dir: FsPath, size: int,
                   n: int) -> dict[str, Any]:
    spy, perf_exe = py_spy(), perf()
    if spy is None:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    if perf_exe is None:
        _log("perf is not available: profiling with py-spy only")
    out_dir.mkdir(parents=True, exist_ok=True)
    bodies, small = build(size * MiB), build(1024)
    found: dict[str, Any] = {}
    for malloc in (False, True):
        for path in CONVERSIONS:
            name = path.name.replace(">", "-to-") + ("-untuned" if malloc else "")
            gw = await asyncio.to_thread(start_gateway, triton, path, workdir, f"prof-{name}",
                                         UNTUNED_ENV if malloc else None)
            try:
                pid = gw.proc.pid  # type: ignore[union-attr]
                client = make_client(path, gw.http_url if path.client == "http" else gw.grpc_url)
                try:
                    count = max(2, n // 3) if path.json else n
                    # Warm up (connections, imports, full-size requests) before sampling.
                    await measure_case(client, path, small, small, None, 2, 1, plan.request_timeout_s)
                    for _ in range(1 if path.json else 3):
                        await client.infer(bodies, plan.request_timeout_s)
                    recorders = [Recorder.py_spy(spy, pid, out_dir / f"{name}.pyspy.txt")]
                    if perf_exe is not None:
                        recorders.append(Recorder.perf(perf_exe, pid, out_dir / f"{name}.perf.data"))
                    await asyncio.sleep(1.0)  # the profilers attach
                    threads, c0 = ThreadCpu(pid), proc.counters(pid)
                    t = time.perf_counter()
                    for _ in range(count):
                        await client.infer(bodies, plan.request_timeout_s)
                    wall = time.perf_counter() - t
                    cpu, d = threads.delta(), proc.counters(pid) - c0
                    for rec in recorders:
                        await asyncio.to_thread(rec.stop)
                finally:
                    await client.close()
            finally:
                await asyncio.to_thread(gw.stop)
            summary: dict[str, Any] = {
                "requests": count, "wall_ms_per_req": wall * 1e3 / count, "cpu_ms_per_req": d.cpu_s * 1e3 / count,
                "sys_ms_per_req": d.sys_s * 1e3 / count, "minflt_per_req": d.minflt / count,
                "thread_cpu_ms_per_req": {k: v * 1e3 / count for k, v in cpu.items() if v > 0},
            }
            if (out_dir / f"{name}.pyspy.txt").exists():
                summary["py_spy"] = summarize(out_dir / f"{name}.pyspy.txt", REPO)
            data = out_dir / f"{name}.perf.data"
            if perf_exe is not None and data.exists():
                summary["perf"] = await asyncio.to_thread(perf_summary, perf_exe, data)
                await asyncio.to_thread(perf_text, perf_exe, data, out_dir / f"{name}.perf.txt")
                data.unlink()
            for log in out_dir.glob(f"{name}.*.log"):
                log.unlink()
            found[name] = summary
            _log(f"profiled {name}: {summary['wall_ms_per_req']:.0f} ms/req, CPU {summary['cpu_ms_per_req']:.0f} "
                 f"ms/req, page faults {summary.get('perf', {}).get('page_fault_share', 0) * 100:.0f}% of samples")
    _log("floors: bare grpc.aio and uvicorn echo servers")
    floors = await measure_floors(workdir, MALLOC_ENV, size * MiB)
    (out_dir / "profile.json").write_text(json.dumps({"profiles": found, "floors": floors}, indent=1))
    (out_dir / "profile.md").write_text(
        _profile_markdown(size, found)
        + f"\n## Floors: the same stack echoing {size} MiB with no gateway logic\n\n"
        + "See benchmarks/conversion/floor.py. Any gateway path on these libraries costs at least this.\n\n"
        + floor_markdown(floors)
    )
    return found


def _profile_markdown(size: int, found: dict[str, Any]) -> str:
    lines = [f"# Profiles of the gateway, {size} MiB FP32 (identity_FP32 on Triton)", "",
             "py-spy: share of non-idle samples of the Python threads, by the deepest Python line "
             "(→ the leaf below it). perf: share of all samples of the gateway process (every thread, "
             "kernel included).", ""]
    for name, s in found.items():
        lines += [f"## {name}", "",
                  f"{s['requests']} requests: {s['wall_ms_per_req']:.0f} ms wall, {s['cpu_ms_per_req']:.0f} ms CPU "
                  f"({s['sys_ms_per_req']:.0f} ms sys), {s['minflt_per_req']:.0f} minor faults per request; "
                  "CPU by thread: " + ", ".join(f"{k} {v:.0f} ms" for k, v in s["thread_cpu_ms_per_req"].items()),
                  ""]
        if "perf" in s:
            pf = s["perf"]
            lines += [f"perf: {pf['page_fault_share'] * 100:.0f}% of samples in the page-fault path, "
                      f"{pf['memcpy_share'] * 100:.0f}% under memcpy/memmove (faults inside included); "
                      "top self:", ""]
            lines += [f"- {share * 100:4.1f}% {what}" for what, share in pf["self"]] + [""]
        if "py_spy" in s:
            ps = s["py_spy"]
            lines += [f"py-spy ({ps['busy_samples']} busy samples), deepest Python line:", ""]
            lines += [f"- {share * 100:4.1f}% {frame}" for frame, share in ps["deepest_python_line"]] + [""]
            lines += ["gateway/ lines, inclusive:", ""]
            lines += [f"- {share * 100:4.1f}% {frame}" for frame, share in ps["gateway_inclusive"]] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.conversion", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1 and 16 MiB only, fewer requests (≤ 2 min)")
    ap.add_argument("--out", type=FsPath, default=None,
                    help="results directory (default: results/<date>[/quick|/profile])")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the table: py-spy and perf on the gateway during the large conversion "
                         "paths, and the floors of its stack (bare grpc.aio / uvicorn echo servers)")
    ap.add_argument("--profile-size", type=int, default=64, help="tensor MiB for --profile (default 64)")
    ap.add_argument("--profile-requests", type=int, default=8, help="binary requests sampled per path")
    ap.add_argument("--paths", default=None,
                    help="comma-separated subset of: " + ", ".join(p.name for p in PATHS + DIRECT))
    ap.add_argument("--sizes", default=None, help="comma-separated MiB subset of the plan's sizes, e.g. 64")
    args = ap.parse_args(argv)

    reason = triton_available()
    if reason is not None:
        _log(f"Triton cannot run here: {reason}")
        return 2
    plan = QUICK if args.quick else FULL
    if args.sizes:
        sizes = tuple(int(x) for x in args.sizes.split(","))
        plan = dataclasses.replace(
            plan, sizes_mb=sizes,
            binary_n={s: plan.binary_n.get(s, FULL.binary_n.get(s, 3)) for s in sizes},
            json_n={s: plan.json_n.get(s, FULL.json_n.get(s, 2)) for s in sizes},
        )
    only = set(args.paths.split(",")) if args.paths else None
    if only is not None and (unknown := only - {p.name for p in PATHS + DIRECT}):
        ap.error(f"unknown paths: {', '.join(sorted(unknown))}")
    out_dir = args.out or RESULTS / dt.date.today().isoformat() / ("profile" if args.profile else
                                                                   "quick" if args.quick else "")
    began = time.monotonic()
    workdir = FsPath(tempfile.mkdtemp(prefix="bench-conversion-"))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    # Triton's stub processes get ~3 GB of shared memory traffic at 64 MiB c=4; its defaults suffice.
    triton = TritonServer(startup_timeout=120.0)
    triton.start(workdir / "triton")
    try:
        _log(f"Triton up in {triton.startup_seconds:.1f}s: http {triton.http_url}, grpc {triton.grpc_url}")
        if args.profile:
            asyncio.run(_profile(plan, triton, workdir, out_dir, args.profile_size, args.profile_requests))
            print((out_dir / "profile.md").read_text())
            return 0
        rows = asyncio.run(_run_plan(plan, triton, workdir, began, only))
    finally:
        triton.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    md = report.write(out_dir, _meta(plan, triton, time.monotonic() - began), rows)
    print(md)
    _log(f"wrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")
    failed = [r for r in rows if "error" in r]
    return 1 if failed else 0
