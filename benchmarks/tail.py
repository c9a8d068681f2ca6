"""Light-load tail latency of a fleet's gateway against a one-endpoint gateway, in alternating windows.

    .venv/bin/python -m benchmarks.tail [--sizes 1x1000,100x1000] [--balance least_queue]
                                        [--windows 6] [--window-seconds 10] [--rate 200] [--out DIR]

The control-plane benchmark (benchmarks/control_plane.py) measures each size once, minutes apart,
and a light load's p99 moves by ±30 % between such runs on a shared two-core machine — more than
the difference it is asked to show (issue: "p99 and max within 1.2 × those of a one-endpoint
pool"). Here the sizes alternate: one fake fleet per size (control_plane's helper process, all
started first and idle while no gateway polls them), then ``--windows`` times, for each size in
turn (the order reversed every other window), a fresh gateway (1 worker, defaults, the same config
as control_plane's) is started, waited for until it routes ``model-(M-1)``, left ``--settle-seconds``
(3) and loaded with ``--rate`` small JSON infers per second for ``--window-seconds``, open loop
(control_plane.open_loop: latency from each request's scheduled send time), then stopped. One
gateway runs at a time.

Pinned (unless ``--no-pin``, or on one CPU): the gateway's threads on the first CPU, the fakes and
this harness on the second. Unpinned, a slow request is as often the scheduler's doing as the
gateway's — a write to loopback wakes the fake, which takes the gateway's core for a few ms while
it answers a burst of index or metrics calls (strace: 1–4 ms loopback writes) — and the fleet's
fake is the busier one. Pinned, what is left is the gateway's own loop — and the client's: a
window's slowest requests were those the client itself sent late (its send lag, up to 14–22 ms,
with either fleet: the open loop counts from the scheduled time, so the client's own stall is
counted as the gateway's latency — the pooled max was the client's worst stall). The client,
which stands for a machine of its own, therefore runs its windows under SCHED_FIFO on its CPU
(``--no-client-fifo`` to leave it; where the kernel refuses, it runs as before and the report
says so), with its own garbage collector paused. Each window reports the client's send lag (how
late it sent against the schedule); the summary the median of the window maxima and the largest.

Reported per size: p50 / p99 / max of all windows' requests pooled, the median of the windows'
p99s, the gateway's cores under the load, and each of those ÷ the first size's (the baseline).
Output: ``<out>/results.json`` and ``<out>/results.md`` (printed too). Every wait is bounded.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .control_plane import _BODY, Client, CpuWindow, FakeFleet, HttpError, build_config, open_loop, parse_sizes

ROOT = Path(__file__).resolve().parent.parent


async def _routed(port: int, m: int, timeout: float) -> None:
    """Until the gateway answers an infer for the last routed model (it is then ready)."""
    client = Client(port)
    deadline = time.monotonic() + timeout
    last = "no answer"
    try:
        while time.monotonic() < deadline:
            try:
                status, body = await client.request("POST", f"/v2/models/model-{m - 1}/infer", _BODY, timeout=5)
                if status == 200:
                    return
                last = f"HTTP {status} {body[:200]!r}"
            except HttpError as exc:
                last = str(exc)
            await asyncio.sleep(0.1)
    finally:
        client.close()
    raise RuntimeError(f"gateway not routing after {timeout:g} s: {last}")


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it from theirs)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def _fifo(on: bool) -> bool:
    """This thread (the client's event loop) under SCHED_FIFO, or back to the default policy;
    False when the kernel refuses."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        return False
    return True


def _cpus(args: argparse.Namespace) -> tuple[set[int], set[int]] | None:
    """(the gateway's CPU, everyone else's), or None: not pinned. Asked once, before this
    process is pinned (its own affinity is one CPU after that)."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if args.pin and len(cpus) >= 2 else None


async def _window(fleet: FakeFleet, n: int, m: int, balance: str, args: argparse.Namespace,
                  seed: int, pins: tuple[set[int], set[int]] | None) -> dict[str, Any]:
    from tests.support.gateway import GatewayProcess

    work = Path(tempfile.mkdtemp(prefix="oip-tail-"))
    gw = GatewayProcess(build_config(fleet.ports, m, balance, None), work, name=f"gw-{n}x{m}")
    try:
        await asyncio.to_thread(gw.start, 60.0)
        assert gw.proc is not None
        if pins is not None:
            _pin(gw.proc.pid, pins[0])
        await _routed(gw.ports["http"], m, 60.0)
        await asyncio.sleep(args.settle_seconds)
        load = Client(gw.ports["http"])
        rng = random.Random(seed)
        paths = [f"/v2/models/model-{rng.randrange(m)}/infer" for _ in range(int(args.rate * args.window_seconds) + 1)]

        async def send(i: int, timeout: float) -> tuple[int, bytes]:
            return await load.request("POST", paths[i], _BODY, timeout=timeout)

        cpu = CpuWindow(gw.proc.pid, fleet.pid).start()
        # The client's own collector stays out of the window (a full collection of this process
        # is a pause of milliseconds, counted as the gateway's latency by the open loop).
        gc.collect()
        gc.freeze()
        gc.disable()
        fifo = args.client_fifo and _fifo(True)
        try:
            out = await open_loop(send, args.rate, args.window_seconds, timeout=10, keep=True)
        finally:
            if fifo:
                _fifo(False)
            gc.enable()
            gc.unfreeze()
        out["cpu"] = cpu.stop()
        load.close()
        return out
    finally:
        await asyncio.to_thread(gw.stop)
        shutil.rmtree(work, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = parse_sizes(args.sizes)
    fleets = [await asyncio.to_thread(FakeFleet, n, m, "pending") for n, m in sizes]
    pins = _cpus(args)
    if pins is not None:
        for pid in [os.getpid(), *(fleet.pid for fleet in fleets)]:
            _pin(pid, pins[1])
    fifo = args.client_fifo and _fifo(True)
    if fifo:
        _fifo(False)
    runs: dict[str, dict[str, Any]] = {f"{n}x{m}": {"windows": [], "lat_ms": [], "clean_ms": []} for n, m in sizes}
    started = time.monotonic()
    try:
        for w in range(args.windows):
            order = list(range(len(sizes))) if w % 2 == 0 else list(reversed(range(len(sizes))))
            for i in order:
                n, m = sizes[i]
                res = await _window(fleets[i], n, m, args.balance, args, seed=w, pins=pins)
                key = f"{n}x{m}"
                lat = res.pop("lat_ms")
                runs[key]["lat_ms"].extend(lat)
                runs[key]["clean_ms"].extend(res.pop("clean_ms"))
                runs[key]["windows"].append(res)
                print(f"  window {w + 1}/{args.windows} {key}: p50 {res.get('p50_ms', float('nan')):.2f} ms, p99 "
                      f"{res.get('p99_ms', float('nan')):.2f} ms, max {res.get('max_ms', float('nan')):.1f} ms, "
                      f"errors {res['errors']}, gateway {res['cpu']['gateway_cores']:.3f} cores", flush=True)
    finally:
        for fleet in fleets:
            fleet.stop()
    summary = {}
    for key, r in runs.items():
        lat = np.array(r.pop("lat_ms"))
        kept = np.array(r.pop("clean_ms"))
        wins = r["windows"]
        summary[key] = {
            "requests": int(lat.size), "errors": sum(x["errors"] for x in wins),
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()), "window_p99_median_ms": float(np.median([x["p99_ms"] for x in wins])),
            "window_max_median_ms": float(np.median([x["max_ms"] for x in wins])),
            "gateway_cores": float(np.median([x["cpu"]["gateway_cores"] for x in wins])),
            "send_lag_max_median_ms": float(np.median([x["send_lag_max_ms"] for x in wins])),
            "send_lag_max_ms": float(max(x["send_lag_max_ms"] for x in wins)),
            "clean_requests": int(kept.size), "clean_p99_ms": float(np.percentile(kept, 99)),
            "clean_max_ms": float(kept.max()),
            "clean_window_max_median_ms": float(np.median([x["clean_max_ms"] for x in wins])),
            "other_cores": float(np.median([x["cpu"]["other_cores"] for x in wins]))}
    return {"meta": {"date": datetime.date.today().isoformat(), "command": "python -m benchmarks.tail " +
                     " ".join(sys.argv[1:]), "commit": _commit(), "balance": args.balance, "rate": args.rate,
                     "windows": args.windows, "window_seconds": args.window_seconds, "client_fifo": fifo,
                     "pinned": None if pins is None else [sorted(pins[0]), sorted(pins[1])],
                     "total_s": time.monotonic() - started},
            "summary": summary, "runs": runs}


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (work tree with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def report(doc: dict[str, Any]) -> str:
    meta, summary = doc["meta"], doc["summary"]
    base = next(iter(summary.values()))
    out = [f"# Light-load tail: fleet vs one endpoint ({meta['date']})", "",
           f"Commit {meta['commit']}. Command: `{meta['command']}`. {meta['windows']} alternating windows of "
           f"{meta['window_seconds']:g} s per size, {meta['rate']:g} small JSON infers/s open loop, a fresh gateway "
           f"(balance `{meta['balance']}`, defaults) per window; "
           + (f"gateway pinned to CPU {meta['pinned'][0]}, fakes and harness to {meta['pinned'][1]}; "
              if meta.get("pinned") else "not pinned; ")
           + ("the client under SCHED_FIFO; " if meta.get("client_fifo") else "the client at the default priority; ")
           + f"{meta['total_s'] / 60:.1f} min. Ratios ÷ the first row. Method: benchmarks/tail.py.", "",
           "| endpoints × routes | requests (errors) | p50 ms | p99 ms (×) | max ms (×) | window p99 median ms (×) "
           "| window max median ms (×) | gateway cores | client send lag: window max median / max ms |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for key, s in summary.items():
        n, m = key.split("x")

        def x(name: str, s: dict[str, Any] = s) -> str:
            return f"{s[name]:.2f} ({s[name] / base[name]:.2f})"

        out.append(f"| {n} × {int(m):,} | {s['requests']} ({s['errors']}) | {s['p50_ms']:.2f} | {x('p99_ms')} | "
                   f"{x('max_ms')} | {x('window_p99_median_ms')} | {x('window_max_median_ms')} | "
                   f"{s['gateway_cores']:.3f} | {s.get('send_lag_max_median_ms', float('nan')):.1f} / "
                   f"{s.get('send_lag_max_ms', float('nan')):.1f} |")
    if "clean_max_ms" in base:
        out += ["", "Without the requests a stall of the client overlapped (a request it sent more than 2 ms late "
                "marks one: control_plane.open_loop):", "",
                "| endpoints × routes | requests kept | p99 ms (×) | max ms (×) | window max median ms (×) |",
                "|---|--:|--:|--:|--:|"]
        for key, s in summary.items():
            n, m = key.split("x")
            out.append(f"| {n} × {int(m):,} | {s['clean_requests']} | "
                       + " | ".join(f"{s[k]:.2f} ({s[k] / base[k]:.2f})"
                                    for k in ("clean_p99_ms", "clean_max_ms", "clean_window_max_median_ms")) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tail", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1x1000,100x1000",
                   help="comma list of ENDPOINTSxROUTES; the first is the baseline")
    p.add_argument("--balance", default="least_queue", choices=("round_robin", "least_request", "least_queue"))
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--window-seconds", type=float, default=10.0)
    p.add_argument("--settle-seconds", type=float, default=3.0)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave every process on every CPU")
    p.add_argument("--no-client-fifo", dest="client_fifo", action="store_false",
                   help="leave the client at the default scheduling policy")
    p.add_argument("--out", default=None, help="default benchmarks/results/<date>-tail")
    args = p.parse_args(argv)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover
        pass
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{datetime.date.today().isoformat()}-tail"
    out.mkdir(parents=True, exist_ok=True)
    doc = asyncio.run(run(args))
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    text = report(doc)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
