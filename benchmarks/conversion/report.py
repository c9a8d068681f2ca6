"""results.json + results.md, the targets' verdicts, and the table printed at the end."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["MEMORY_TARGET", "markdown", "targets", "write"]

MEMORY_TARGET = 1.5  # peak growth per in-flight request ≤ 1.5 × payload (binary / raw paths)
JSON_SIZES = (16, 64)  # the JSON → gRPC vs Triton-HTTP latency target


def _ok(row: dict[str, Any]) -> bool:
    return "error" not in row and "skipped" not in row


def _find(rows: list[dict[str, Any]], path: str, size: int, c: int = 1, malloc: bool = False) -> dict[str, Any] | None:
    for r in rows:
        if (r["path"], r["size_mib"], r["concurrency"], r["malloc_env"]) == (path, size, c, malloc) and _ok(r):
            return r
    return None


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    memory = []
    for r in rows:
        if r["role"] in ("conversion", "pass-through") and r["form"] != "json" and _ok(r):
            memory.append({
                "path": r["path"], "size_mib": r["size_mib"], "concurrency": r["concurrency"],
                "malloc_env": r["malloc_env"], "x_payload": r["x_payload"], "met": r["x_payload"] <= MEMORY_TARGET,
            })
    latency = []
    for size in JSON_SIZES:
        gw, direct = _find(rows, "http_json>grpc", size), _find(rows, "triton:http_json", size)
        if gw is None or direct is None:
            latency.append({"size_mib": size, "met": None, "why": "not measured"})
            continue
        ratio = gw["median_ms"] / direct["median_ms"]
        latency.append({"size_mib": size, "gateway_ms": gw["median_ms"], "triton_http_ms": direct["median_ms"],
                        "ratio": ratio, "met": ratio <= 1.0})
    return {"memory_x_payload_max": MEMORY_TARGET, "memory": memory, "json_to_grpc_latency": latency}


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(met: bool | None) -> str:
    return "–" if met is None else ("met" if met else "**missed**")


def _main_table(rows: list[dict[str, Any]], malloc: bool) -> list[str]:
    out = [
        "| path | MiB | c | n | median ms | min ms | first ms | CPU ms/req (usr+sys) | minflt/req "
        "| peak growth MiB | ÷ in-flight ÷ payload | retained MiB | ≤1.5× | Triton / client CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        if r["role"] == "direct" or r["malloc_env"] != malloc:
            continue
        head = f"| {r['path']} | {r['size_mib']} | {r['concurrency']} "
        if not _ok(r):
            out.append(head + f"| {r.get('error') or 'skipped: ' + r['skipped']} |" + " |" * 10)
            continue
        mem_target = "–" if r["form"] == "json" else _verdict(r["x_payload"] <= MEMORY_TARGET)
        out.append(
            head + f"| {r['n']} | {_f(r['median_ms'])} | {_f(r['min_ms'])} | {_f(r['first_ms'])} "
            f"| {_f(r['cpu_ms_per_req'])} ({_f(r['user_ms_per_req'])}+{_f(r['sys_ms_per_req'])}) "
            f"| {r['minflt_per_req']:.0f} | {_f(r['peak_growth_mib'])} | {_f(r['x_payload'], 2)} "
            f"| {_f(r['retained_mib'])} | {mem_target} | {_others(r)} |"
        )
    return out


def _others(r: dict[str, Any]) -> str:
    return f"{_f(r.get('triton_cpu_ms_per_req'), 0)} / {_f(r.get('client_cpu_ms_per_req'), 0)}"


def _direct_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| straight to Triton | MiB | n | median ms | min ms | first ms | Triton / client CPU ms/req |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["role"] != "direct":
            continue
        if not _ok(r):
            out.append(f"| {r['path']} | {r['size_mib']} | {r.get('error') or 'skipped'} | | | | |")
            continue
        out.append(f"| {r['path']} | {r['size_mib']} | {r['n']} | {_f(r['median_ms'])} | {_f(r['min_ms'])} "
                   f"| {_f(r['first_ms'])} | {_others(r)} |")
    return out


def _malloc_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| path | MiB | c | median ms (shipped → untuned) | CPU ms/req | minflt/req | ÷ in-flight ÷ payload "
        "| retained MiB |",
        "|---|---:|---:|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["malloc_env"] or not _ok(r):
            continue
        base = _find(rows, r["path"], r["size_mib"], r["concurrency"], False)
        if base is None:
            continue

        def pair(key: str, digits: int = 1, base: dict[str, Any] = base, r: dict[str, Any] = r) -> str:
            return f"{_f(base[key], digits)} → {_f(r[key], digits)}"

        out.append(
            f"| {r['path']} | {r['size_mib']} | {r['concurrency']} | {pair('median_ms')} | {pair('cpu_ms_per_req')} "
            f"| {base['minflt_per_req']:.0f} → {r['minflt_per_req']:.0f} | {pair('x_payload', 2)} "
            f"| {pair('retained_mib')} |"
        )
    return out


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], verdicts: dict[str, Any]) -> str:
    lines = [
        f"# Conversion benchmark — {meta['date']} ({meta['plan']} plan, {meta['wall_s']:.0f} s)",
        "",
        f"{meta['cpus']} CPUs · Python {meta['python']} · glibc {meta['glibc']} · "
        + " · ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        "Model `identity_FP32` on real Triton; one FP32 tensor of the given size each way. "
        "`c` = requests in flight. CPU, page faults and memory are the gateway process's "
        "(/proc); every row is a fresh gateway. `÷ in-flight ÷ payload` = (VmHWM − RSS after "
        "warm-up) / c / tensor bytes. See benchmarks/conversion/README.md.",
        "",
        "## Gateway paths (as shipped: allocator tuned by gateway/malloc.py)",
        "",
        *_main_table(rows, False),
        "",
        "## Straight to Triton (no gateway)",
        "",
        *_direct_table(rows),
        "",
        "## Targets",
        "",
        f"Memory growth per in-flight request ≤ {MEMORY_TARGET} × payload (binary / raw paths, gateway as shipped):",
        "",
    ]
    for m in verdicts["memory"]:
        if not m["malloc_env"]:
            lines.append(f"- {m['path']} {m['size_mib']} MiB c={m['concurrency']}: "
                         f"{m['x_payload']:.2f}× — {_verdict(m['met'])}")
    lines += ["", "Large JSON through the gateway to a gRPC backend no slower than straight to Triton's HTTP port "
              "(median, c=1):", ""]
    for t in verdicts["json_to_grpc_latency"]:
        if t["met"] is None:
            lines.append(f"- {t['size_mib']} MiB: {t['why']}")
        else:
            lines.append(f"- {t['size_mib']} MiB: gateway {t['gateway_ms']:.0f} ms vs Triton HTTP "
                         f"{t['triton_http_ms']:.0f} ms ({t['ratio']:.2f}×) — {_verdict(t['met'])}")
    if any(r["malloc_env"] for r in rows):
        env = " ".join(f"{k}={v}" for k, v in meta["malloc_env"].items())
        lines += ["", f"## Allocator: as shipped → `{env}` (glibc's defaults)", "", *_malloc_table(rows)]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts = targets(rows)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "targets": verdicts, "rows": rows}, indent=1))
    md = markdown(meta, rows, verdicts)
    (out_dir / "results.md").write_text(md)
    return md
