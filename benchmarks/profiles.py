"""py-spy profiles of a gateway worker under load.

While h2load drives a workload, two ``py-spy record --nonblocking`` samplers run side by side
on the worker: one writes a flame graph (``<workload>.svg``), the other collapsed stacks
(``<workload>.txt``, py-spy's ``raw`` format) from which the hot spots are counted:

* self %: samples whose innermost Python frame is the function (time spent in it, or in C code
  it called, e.g. grpc's core or orjson);
* total %: samples with the function anywhere on the stack.

Percentages are of the samples in which a thread was active (py-spy drops idle samples).
A ``py-spy dump`` snapshot is saved too (``<workload>.dump.txt``).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from .loadgen import run_h2load
from .targets import Target
from .workloads import Workload

__all__ = ["hotspots", "profile_workload"]


def _frame_key(frame: str) -> str:
    # py-spy raw frames look like "handle (gateway/frontend/http.py:42)"; drop the line number.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, _line = where.rpartition(":")
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    path = path.replace(str(Path.cwd()) + "/", "")
    return f"{name} ({path})" if path else name


def hotspots(collapsed: Path, top: int = 10) -> dict:
    self_c: Counter[str] = Counter()
    total_c: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        samples += n
        keys = [_frame_key(f) for f in frames]
        self_c[keys[-1]] += n
        for k in set(keys):
            total_c[k] += n
    pct = lambda c: [{"function": k, "pct": round(100 * v / samples, 1)} for k, v in c.most_common(top)]
    own = Counter({k: v for k, v in total_c.items() if k.split(" (", 1)[-1].startswith("gateway/")
                   and not k.startswith(("<module>", "main ", "cmd_serve ", "_serve_one "))})
    return {"samples": samples, "self": pct(self_c), "total": pct(total_c), "gateway_total": pct(own)}


def _pyspy() -> str | None:
    """py-spy from this virtualenv's bin directory (not always on PATH), else from PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def profile_workload(wl: Workload, target: Target, body: Path, headers, directory: Path, *, concurrency: int,
                     seconds: float) -> dict:
    pyspy = _pyspy()
    if pyspy is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    directory.mkdir(parents=True, exist_ok=True)
    url = f"http://{target.grpc_url if wl.protocol == 'grpc' else target.http_url}{wl.path}"
    load = threading.Thread(target=run_h2load, args=(url, body, headers),
                            kwargs=dict(h1=wl.protocol == "http", concurrency=concurrency,
                                        duration=seconds + 2))
    load.start()
    errors: list[str] = []
    svg, raw, dump = (directory / f"{wl.name}{ext}" for ext in (".svg", ".txt", ".dump.txt"))
    try:
        time.sleep(1.0)  # let the load settle
        base = [pyspy, "record", "--nonblocking", "-r", "250", "-d", str(int(seconds)), "-p", str(target.pid)]
        procs = [
            subprocess.Popen([*base, "-f", "flamegraph", "-o", str(svg)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT),
            subprocess.Popen([*base, "-f", "raw", "-o", str(raw)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT),
        ]
        d = subprocess.run([pyspy, "dump", "--nonblocking", "-p", str(target.pid)], capture_output=True,
                           text=True, timeout=30, check=False)
        dump.write_text(d.stdout + d.stderr)
        for p in procs:
            o, _ = p.communicate(timeout=seconds + 60)
            if p.returncode != 0:
                errors.append(o.decode(errors="replace")[-500:])
    finally:
        load.join()
    if errors or not raw.exists():
        return {"error": "; ".join(errors) or "no profile written"}
    result = hotspots(raw)
    result.update(svg=svg.name, collapsed=raw.name, dump=dump.name, concurrency=concurrency, seconds=seconds,
                  pid=target.pid)
    return result
