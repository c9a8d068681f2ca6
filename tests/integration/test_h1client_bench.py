"""benchmarks/h1client.py — the microbenchmark that keeps the hand-written HTTP/1.1 client
(gateway/backends/h1/) justified against aiohttp — runs end to end: both clients get every
answer whole from its canned backend process, and it reports a CPU figure for each. (Numbers
are not judged here: the suite never asserts on timing.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_h1client_benchmark_measures_both_clients(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.h1client", "--requests", "60", "--rounds", "2",
         "--bodies", "small,1m", "--concurrency", "1,4", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["body"], r["concurrency"], r["client"]) for r in rows} == {
        (b, c, k) for b in ("small", "1m") for c in (1, 4) for k in ("gateway", "aiohttp")}
    assert all(r["cpu_us"] > 0 and len(r["rounds_us"]) == 2 and r["req_s"] > 0 for r in rows)
    table = (out / "results.md").read_text()
    assert "gateway ÷ aiohttp" in table and table.count("\n| small |") == 2 and table.count("\n| 1m |") == 2
