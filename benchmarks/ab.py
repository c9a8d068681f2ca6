"""A/B benchmark of two revisions of the gateway on one machine, in one run:

    .venv/bin/python -m benchmarks.ab --before <git-rev> [--after DIR|REV] [--workloads a,b]
        [--concurrency 1,16] [--duration 3] [--rounds 4] [--max-ratio 1.05]

The before/after evidence for a hot-path change: does it cost more CPU per request?

* **Trees.** ``--before``, a git revision, is checked out with ``git worktree add --detach`` into a
  temporary directory and its extensions compiled there, removed at the end; or it names a
  directory, measured as it is (its extensions as built there: the log lists them). ``--after``
  is the current working tree by default (uncommitted changes included), or another directory,
  or a revision checked out like ``--before``. Both gateways run from this interpreter (the project's .venv) with
  ``PYTHONPATH=<tree>`` and ``cwd=<tree>``; before anything is measured, ``import gateway`` is
  run with exactly that environment and must resolve inside the tree (the editable install
  would otherwise win), and ``python -m gateway check`` must accept the config in both trees.
* **Setup.** One real Triton (tests/support/triton.py) serves both. Per gateway backend protocol
  (HTTP backend for the HTTP workloads, gRPC backend for the gRPC ones, as in benchmarks/run.py) each
  tree runs one gateway (``--workers``, default 1) on the same minimal config
  (``targets.gateway_routes_config``: listen, health, backends, routes — keys every revision
  since the benchmark harness existed understands). All four gateways stay up for the whole run.
* **Alternation.** For each round, for each workload × concurrency, before then after; the next
  round after then before (A B | B A | A B …), so drift of the machine and order effects land
  on both. Use an even number of rounds. Each cell is measured exactly like benchmarks/run.py
  (``run.measure``: h2load, CPU of the gateway's process tree from /proc over the steady window,
  req/s, p50). Ratios after/before are taken within a round, then the median over rounds.
* **Foreign CPU.** As in the harness, CPU used on the machine by anything other than the
  measured gateway, Triton, the load generator and this process, as a fraction of the machine;
  the idle gateways' (small: health checks) CPU is taken out of it and recorded on its own.

Output: the markdown table (printed), ``benchmarks/results/<date>-ab/results.md`` and
``results.json`` (every run, the summary, both trees' revisions and dirty files).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from gateway.grpcengine import unchosen
from tests.support.compiled import extensions
from tests.support.procs import terminate, wait_for
from tests.support.triton import TritonServer

from . import report
from .procstat import cpu_seconds
from .repository import model_repository, routed_models
from .run import log, measure, run_duration
from .targets import Target, gateway_routes_config
from .workloads import WORKLOADS, verify, write_bodies

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SIDES = ("before", "after")
DEFAULT_WORKLOADS = "http_json_small,grpc_small"


# ------------------------------------------------------------------------------------------ trees


def _git(*args: str, cwd: Path = REPO) -> str:
    # --no-optional-locks: never take index.lock for a stat refresh; others use this repository.
    return subprocess.run(["git", "--no-optional-locks", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclass
class Tree:
    side: str
    path: Path
    spec: str  # what was asked for: a revision or a directory
    commit: str = ""
    dirty: list[str] = field(default_factory=list)  # `git status --porcelain` lines of the tree
    diff_sha256: str = ""  # of `git diff HEAD` (tracked changes), to tell runs on different edits apart
    worktree: bool = False  # materialised here: removed at the end
    gateway_file: str = ""
    compiled: list[str] = field(default_factory=list)  # modules imported as built extensions (setup.py)

    def env(self) -> dict[str, str]:
        # Without this harness's own grpc engine choice (gateway/grpcengine.py): each tree's
        # gateway makes its own (or none, before it existed).
        return dict(unchosen(dict(os.environ)), PYTHONPATH=str(self.path))


def materialise(side: str, rev: str, root: Path) -> Tree:
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = root / side
    log(f"{side}: git worktree add --detach {path} {rev} ({commit[:10]})")
    _git("worktree", "add", "--detach", str(path), commit)
    build_extensions(side, path)
    return Tree(side, path, rev, worktree=True)


def build_extensions(side: str, path: Path) -> None:
    """Compile a checked-out tree's hot-path modules in place, as its install would (setup.py,
    mypyc; revisions before it existed have none): a revision is measured as it ships."""
    if not (path / "setup.py").exists():
        return
    log(f"{side}: compiling the tree's extensions (setup.py build_ext --inplace)")
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{side}: building the extensions failed:\n{done.stderr[-3000:]}")


def remove_worktree(tree: Tree) -> None:
    try:
        _git("worktree", "remove", "--force", str(tree.path))
    except subprocess.CalledProcessError as exc:
        log(f"git worktree remove {tree.path} failed ({exc.stderr.strip()}); deleting it and pruning")
        shutil.rmtree(tree.path, ignore_errors=True)
        _git("worktree", "prune")


def describe(tree: Tree) -> None:
    """Record the tree's commit and local changes; check ``import gateway`` resolves inside it."""
    tree.commit = _git("rev-parse", "HEAD", cwd=tree.path)
    tree.dirty = [line for line in _git("status", "--porcelain", cwd=tree.path).splitlines() if line]
    diff = subprocess.run(["git", "--no-optional-locks", "diff", "HEAD"], cwd=tree.path, check=True,
                          capture_output=True).stdout
    tree.diff_sha256 = hashlib.sha256(diff).hexdigest() if diff else ""
    probe = subprocess.run([sys.executable, "-c", "import gateway; print(gateway.__file__)"], cwd=tree.path,
                           env=tree.env(), check=True, capture_output=True, text=True)
    tree.gateway_file = probe.stdout.strip()
    tree.compiled, stale = extensions(tree.path)
    if stale:
        raise SystemExit(f"{tree.side}: compiled extensions older than their sources ({', '.join(stale)}): "
                         "rebuild them (`pip install -e .` in that tree) or they are measured instead of the edits")
    if not Path(tree.gateway_file).resolve().is_relative_to(tree.path.resolve()):
        raise SystemExit(f"{tree.side}: `import gateway` with PYTHONPATH={tree.path} gave {tree.gateway_file}, "
                         "not the tree's copy")
    log(f"{tree.side}: {tree.path} at {tree.commit[:10]}"
        f"{f' + {len(tree.dirty)} changed/untracked file(s)' if tree.dirty else ''}; gateway = {tree.gateway_file}; "
        f"compiled: {', '.join(tree.compiled) or 'none'}")


# --------------------------------------------------------------------------------------- gateways


def _die_with_parent() -> None:
    # The gateway must not outlive this harness if it is killed: PR_SET_PDEATHSIG = 1.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class TreeGateway:
    """``python -m gateway serve`` from one tree: same interpreter, PYTHONPATH and cwd = the tree."""

    def __init__(self, tree: Tree, config: dict[str, Any], workdir: Path, name: str, workers: int) -> None:
        self.tree, self.name, self.workers = tree, name, workers
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port_file, self.log_path = workdir / f"{name}.ports.json", workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def check_config(self) -> None:
        p = subprocess.run([sys.executable, "-m", "gateway", "check", str(self.config_path)], cwd=self.tree.path,
                           env=self.tree.env(), capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{self.tree.side} ({self.tree.commit[:10]}) rejects the config {self.config_path}:\n"
                             f"{p.stdout}{p.stderr}")

    def start(self, timeout: float = 120.0) -> Target:
        self.port_file.unlink(missing_ok=True)
        preexec = _die_with_parent if threading.current_thread() is threading.main_thread() else None
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config_path),
                 "--workers", str(self.workers), "--port-file", str(self.port_file)],
                cwd=self.tree.path, env=self.tree.env(), stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=preexec)

        def ready() -> dict[str, int] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}")
            return json.loads(self.port_file.read_text()) if self.port_file.exists() else None

        try:
            self.ports = wait_for(ready, timeout=timeout, what=self.port_file.name)
        except Exception:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"gateway {self.name} ({self.tree.path}) did not start:\n{tail}") from None
        cwd = os.readlink(f"/proc/{self.proc.pid}/cwd")
        if Path(cwd).resolve() != self.tree.path.resolve():
            raise RuntimeError(f"gateway {self.name} runs in {cwd}, not {self.tree.path}")
        return Target(self.name, f"127.0.0.1:{self.ports['http']}", f"127.0.0.1:{self.ports['grpc']}",
                      self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None


# ---------------------------------------------------------------------------------------- measure


def ensure_h2load(install: bool) -> None:
    if shutil.which("h2load"):
        return
    if not install:
        raise SystemExit("h2load missing; install with: apt-get update && apt-get install -y nghttp2-client")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    log("installing nghttp2-client (h2load) …")
    subprocess.run([*sudo, "apt-get", "update"], check=True)
    subprocess.run([*sudo, "apt-get", "install", "-y", "nghttp2-client"], check=True,
                   env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def run_ab(names: list[str], targets: dict[tuple[str, str], Target], triton_pid: int, bodies,
           concurrency: list[int], *, rounds: int, duration: float, max_duration: float, warmup: float,
           loadgen: str, max_foreign: float | None, retries: int) -> list[dict]:
    """``targets[(backend, side)]``; returns one row per measurement (plus verification failures).

    A pair (before + after of one round and cell) during which other processes used more than
    ``max_foreign`` of the machine is measured again, up to ``retries`` times; the noisy rows stay
    in the list marked ``discarded`` (the last attempt is kept, marked ``noisy``).
    """
    runs: list[dict] = []
    all_pids = [t.pid for t in targets.values()]
    live: list[str] = []
    for name in names:
        wl = WORKLOADS[name]
        body, headers = bodies[name]
        whys = {side: verify(wl, _url(wl, targets[(wl.backend, side)]), body, headers) for side in SIDES}
        if any(whys.values()):
            for side, why in whys.items():
                if why:
                    log(f"  {name} via {side}: NOT MEASURED, verification failed: {why}")
                    runs.append({"workload": name, "side": side, "concurrency": None, "round": None,
                                 "error": f"verification failed: {why}"})
        else:
            live.append(name)
    rps_seen: dict[tuple[str, int], float] = {}
    for r in range(rounds):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        for name in live:
            wl = WORKLOADS[name]
            body, headers = bodies[name]
            for c in concurrency:
                # Same duration on both sides: sized from the slower side of the earlier rounds.
                prev = rps_seen.get((name, c)) or rps_seen.get((name, max([x for x in concurrency if x < c],
                                                                           default=0)))
                d = run_duration(duration, max_duration, c, prev)
                for attempt in range(retries + 1):
                    pair = []
                    for side in order:
                        t = targets[(wl.backend, side)]
                        if r == 0 and attempt == 0 and warmup > 0 and (prev is None or c / prev < warmup / 2):
                            measure(wl, t, triton_pid, body, headers, concurrency=c, duration=warmup,
                                    loadgen=loadgen)
                        row = _measure_one(wl, t, [p for p in all_pids if p != t.pid], triton_pid, body, headers,
                                           c, d, loadgen)
                        row.update(workload=name, side=side, concurrency=c, round=r, attempt=attempt)
                        pair.append(row)
                        if row["rps"] > 0:
                            rps_seen[(name, c)] = min(rps_seen.get((name, c), float("inf")), row["rps"])
                        log(f"  r{r} {name:18s} c={c:<3d} {side:6s} {d:4.1f}s {row['rps']:8.1f} req/s  "
                            f"p50 {row['p50_us'] / 1000:7.2f} ms  {row['cpu_us_per_req']:7.0f} µs CPU/req  "
                            f"foreign {100 * row['foreign_cpu_frac']:3.0f}%"
                            f"{'  ERROR ' + row['error'][:200] if row['error'] else ''}")
                    worst = max(x["foreign_cpu_frac"] for x in pair)
                    noisy = max_foreign is not None and worst > max_foreign
                    last = attempt == retries
                    for x in pair:
                        x["discarded"], x["noisy"] = noisy and not last, noisy
                    runs.extend(pair)
                    if not noisy:
                        break
                    log(f"    other processes used {100 * worst:.0f}% of the machine (> {100 * max_foreign:.0f}%): "
                        + ("kept, no retries left" if last else "measuring the pair again"))
    return runs


def _measure_one(wl, t: Target, idle_pids: list[int | None], triton_pid: int, body, headers, c: int, d: float,
                 loadgen: str) -> dict:
    """``run.measure``, with the idle gateways' CPU taken out of the foreign CPU and recorded."""
    idle0 = sum(cpu_seconds(p) for p in idle_pids)
    row = measure(wl, t, triton_pid, body, headers, concurrency=c, duration=d, loadgen=loadgen)
    idle = sum(cpu_seconds(p) for p in idle_pids) - idle0
    row["idle_gateways_cpu_s"] = idle
    row["foreign_cpu_frac"] = max(0.0, row["foreign_cpu_frac"] - idle / row["wall_s"] / (os.cpu_count() or 1))
    return row


def _url(wl, t: Target) -> str:
    return t.grpc_url if wl.protocol == "grpc" else t.http_url


# ---------------------------------------------------------------------------------------- summary


def _med(values) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return median(vals) if vals else None


def summarise(runs: list[dict], names: list[str], concurrency: list[int]) -> list[dict]:
    out = []
    for name in names:
        for c in concurrency:
            cell = [r for r in runs if r["workload"] == name and r["concurrency"] == c]
            rows = [r for r in cell if not r.get("discarded")]
            if not rows:
                continue
            side = {s: [r for r in rows if r["side"] == s] for s in SIDES}
            ratios = []
            for rnd in sorted({r["round"] for r in rows}):
                pair = {r["side"]: r for r in rows if r["round"] == rnd and not r["error"]}
                if len(pair) == 2 and pair["before"]["cpu_us_per_req"]:
                    ratios.append(pair["after"]["cpu_us_per_req"] / pair["before"]["cpu_us_per_req"])
            s: dict[str, Any] = {"workload": name, "concurrency": c, "rounds": len(ratios),
                                 "cpu_ratio": _med(ratios), "cpu_ratios": ratios,
                                 "foreign_cpu_frac": _med(r["foreign_cpu_frac"] for r in rows),
                                 "foreign_cpu_frac_max": max(r["foreign_cpu_frac"] for r in rows),
                                 "pairs_remeasured": sum(1 for r in cell if r.get("discarded")) // 2,
                                 "pairs_noisy_kept": sum(1 for r in rows if r.get("noisy")) // 2}
            for sd in SIDES:
                s[sd] = {k: _med(r[k] for r in side[sd]) for k in ("cpu_us_per_req", "rps", "p50_us", "p99_us")}
                s[sd]["failed"] = sum(r["failed"] for r in side[sd])
                s[sd]["errors"] = [r["error"] for r in side[sd] if r["error"]]
                s[sd]["peak_rss_mb"] = max((r["peak_rss_mb"] or 0) for r in side[sd]) if side[sd] else None
            out.append(s)
    return out


def _f(v, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def _div(v: float | None, by: float) -> float | None:
    return None if v is None else v / by


def _foreign(s: dict) -> str:
    pct = lambda v: _f(_div(v, 0.01), "{:.0f}%")
    text = f"{pct(s['foreign_cpu_frac'])} ({pct(s['foreign_cpu_frac_max'])})"
    if s["pairs_remeasured"]:
        text += f", {s['pairs_remeasured']} pair(s) redone"
    if s["pairs_noisy_kept"]:
        text += f", ⚠ {s['pairs_noisy_kept']} noisy kept"
    return text


def markdown(meta: dict, summary: list[dict], max_ratio: float | None) -> str:
    t = meta["trees"]
    desc = {sd: f"`{t[sd]['spec']}` = {t[sd]['commit'][:10]}"
                + (f" + {len(t[sd]['dirty'])} uncommitted file(s)" if t[sd]["dirty"] else "") for sd in SIDES}
    lines = [
        f"A/B run {meta['date']} on {meta['cpus']} × {meta['cpu']}, Python {meta['python']}, "
        f"grpcio {meta['packages'].get('grpcio')}, {meta['h2load']}.",
        f"before: {desc['before']}; after: {desc['after']}; gateway with {meta['workers']} worker(s), "
        f"one Triton shared by both.",
        f"{meta['rounds']} round(s) × {meta['duration_s']:g} s per measurement, alternating A B | B A …; "
        "µs/req, req/s and p50 are medians over rounds, the ratio is the median of the per-round ratios "
        "after ÷ before (range in brackets).",
        "",
        "| workload | c | before µs/req | after µs/req | after/before | before req/s | after req/s | "
        "before p50 ms | after p50 ms | foreign CPU median (max) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for s in summary:
        b, a = s["before"], s["after"]
        rng = (f" ({min(s['cpu_ratios']):.2f}–{max(s['cpu_ratios']):.2f})" if len(s["cpu_ratios"]) > 1 else "")
        flag = " ⚠" if b["failed"] or a["failed"] or b["errors"] or a["errors"] else ""
        over = " **>**" if max_ratio and s["cpu_ratio"] and s["cpu_ratio"] > max_ratio else ""
        lines.append(
            f"| {s['workload']}{flag} | {s['concurrency']} | {_f(b['cpu_us_per_req'])} | {_f(a['cpu_us_per_req'])} | "
            f"{_f(s['cpu_ratio'], '{:.3f}')}{rng}{over} | {_f(b['rps'])} | {_f(a['rps'])} | "
            f"{_f(_div(b['p50_us'], 1000), '{:.2f}')} | {_f(_div(a['p50_us'], 1000), '{:.2f}')} | "
            f"{_foreign(s)} |")
    busy = [s["foreign_cpu_frac"] for s in summary if s["foreign_cpu_frac"] is not None]
    if busy and median(busy) > 0.05:
        lines += ["", f"⚠ Other processes used a median {100 * median(busy):.0f}% of the machine's CPU during the "
                  "runs: treat small differences as noise (more rounds help; the ratios are paired per round; "
                  "pairs above `--max-foreign` were measured again, see results.json)."]
    if meta["rounds"] % 2:
        lines += ["", "⚠ Odd number of rounds: one order (before first) is measured once more than the other."]
    if max_ratio:
        worst = max((s["cpu_ratio"] for s in summary if s["cpu_ratio"] is not None), default=None)
        verdict = "within" if worst is not None and worst <= max_ratio else "**ABOVE**"
        lines += ["", f"Largest CPU ratio {_f(worst, '{:.3f}')}: {verdict} the limit {max_ratio:g}."]
    for s in summary:
        for sd in SIDES:
            if s[sd]["failed"] or s[sd]["errors"]:
                lines.append(f"- ⚠ {s['workload']} c={s['concurrency']} {sd}: {s[sd]['failed']} failed requests; "
                             f"{'; '.join(e[:200] for e in s[sd]['errors'])}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- main


def _clean(o: Any) -> Any:
    """NaN (h2load gave no latencies) → null, as in report.write."""
    if isinstance(o, float) and o != o:
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def resolve_tree(side: str, spec: str, root: Path) -> Tree:
    """A directory as it is (its extensions as built there), else a git revision checked out."""
    p = Path(spec)
    if p.is_dir():
        return Tree(side, p.resolve(), spec)
    return materialise(side, spec, root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True,
                    help="git revision of the baseline (checked out as a worktree), or a directory")
    ap.add_argument("--after", default=str(REPO),
                    help="a directory (default: this working tree, uncommitted changes included) or a git revision")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS, help=f"comma list of: {', '.join(WORKLOADS)}")
    ap.add_argument("--concurrency", default="1,16", help="comma list (default 1,16)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (default 3)")
    ap.add_argument("--max-duration", type=float, default=12.0, help="cap for slow workloads (default 12)")
    ap.add_argument("--rounds", type=int, default=4, help="alternation rounds, even (default 4)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per gateway and cell (default 1)")
    ap.add_argument("--workers", type=int, default=1, help="gateway worker processes (default 1)")
    ap.add_argument("--loadgen", choices=("h2load", "wrk"), default="h2load")
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="measure a before/after pair again when other processes used more than this fraction "
                         "of the machine during it (default 0.10; 0 = never)")
    ap.add_argument("--retries", type=int, default=2, help="how often a noisy pair is measured again (default 2)")
    ap.add_argument("--max-ratio", type=float,
                    help="exit 1 when a cell's median CPU ratio after/before exceeds this (e.g. 1.05)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install h2load when missing")
    ap.add_argument("--out", type=Path, help="results directory (default benchmarks/results/<date>-ab)")
    ap.add_argument("--note", help="a remark stored with the results")
    args = ap.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {list(WORKLOADS)}")
    concurrency = sorted({int(c) for c in args.concurrency.split(",")})
    if args.loadgen == "wrk" and not shutil.which("wrk"):
        ap.error("--loadgen wrk: wrk is not installed (apt-get install -y wrk)")
    ensure_h2load(install=not args.no_install)

    # SIGTERM unwinds like Ctrl-C, so the worktrees and the processes are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.now(UTC)
    out = args.out or HERE / "results" / (started.strftime("%Y-%m-%d") + "-ab")
    scratch = Path(tempfile.mkdtemp(prefix="oip-ab-"))
    log(f"results → {out}; scratch in {scratch}; interpreter {sys.executable}")
    trees: list[Tree] = []
    gateways: list[TreeGateway] = []
    needed = {WORKLOADS[n].model for n in names}
    triton = TritonServer(model_repository(scratch / "models", needed))
    ok = False
    try:
        trees.append(resolve_tree("before", args.before, scratch))
        trees.append(resolve_tree("after", args.after, scratch))
        for tree in trees:
            describe(tree)
        bodies = write_bodies(names, scratch / "bodies")
        log("starting Triton …")
        triton.start(scratch / "triton")
        log(f"Triton up in {triton.startup_seconds:.1f} s: http {triton.http_url} grpc {triton.grpc_url}")
        targets: dict[tuple[str, str], Target] = {}
        for backend in sorted({WORKLOADS[n].backend for n in names}):
            cfg = gateway_routes_config(backend, triton.http_url, triton.grpc_url, models=routed_models(needed))
            for tree in trees:
                gw = TreeGateway(tree, cfg, scratch / "gateways", f"{tree.side}-{backend}", args.workers)
                gw.check_config()
                gateways.append(gw)
                targets[(backend, tree.side)] = gw.start()
                log(f"gateway {gw.name} up: pid {gw.proc.pid if gw.proc else '?'} http {gw.ports['http']} "
                    f"grpc {gw.ports['grpc']}")
        runs = run_ab(names, targets, triton.pid, bodies, concurrency, rounds=args.rounds, duration=args.duration,
                      max_duration=max(args.duration, args.max_duration), warmup=args.warmup, loadgen=args.loadgen,
                      max_foreign=None if args.max_foreign <= 0 else args.max_foreign, retries=args.retries)
        ok = True
    finally:
        for gw in gateways:
            gw.stop()
        triton.stop()
        for tree in trees:
            if tree.worktree:
                remove_worktree(tree)
        if not ok:
            log(f"failed; gateway logs kept in {scratch / 'gateways'}")

    meta = report.machine_info()
    meta.update(
        date=started.strftime("%Y-%m-%d %H:%M UTC"), rounds=args.rounds, duration_s=args.duration,
        max_duration_s=args.max_duration, warmup_s=args.warmup, max_foreign=args.max_foreign,
        retries=args.retries, workers=args.workers, loadgen=args.loadgen,
        workloads=names, concurrency=concurrency, note=args.note, interpreter=sys.executable,
        trees={t.side: {k: str(v) if isinstance(v, Path) else v for k, v in asdict(t).items()} for t in trees},
        elapsed_s=round((datetime.now(UTC) - started).total_seconds()),
        command="python -m benchmarks.ab " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    summary = summarise([r for r in runs if r["concurrency"] is not None], names, concurrency)
    md = markdown(meta, summary, args.max_ratio)
    out.mkdir(parents=True, exist_ok=True)
    result = _clean({"meta": meta, "summary": summary, "runs": runs})
    (out / "results.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    (out / "results.md").write_text(f"# oip-gateway A/B — {meta['date']}\n\n{md}")
    print(md)
    shutil.rmtree(scratch, ignore_errors=True)
    log(f"done in {meta['elapsed_s']} s; results in {out}")
    if args.max_ratio and any(s["cpu_ratio"] is not None and s["cpu_ratio"] > args.max_ratio for s in summary):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
