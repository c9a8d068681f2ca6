"""Instructions the gateway executes per request, counted (not timed): a measure of the hot
path that does not move with the machine's noise.

    .venv/bin/python -m benchmarks.instructions [--before REV] [--after DIR|REV]
        [--body small] [--concurrency 16] [--requests 500,2500]

Why: on this shared 2-vCPU machine the load benchmark's small-HTTP cell moves ±10-20 % between
runs, so a change worth 2 % of the gateway's Python cannot be seen there, nor by
benchmarks/inproc.py (±20 %). ``valgrind --tool=callgrind`` counts the instructions a program
executes in user space: the same binary with the same input gives the same count, whatever else
the machine is doing (two runs of one tree agree to ~0.01 %).

How: benchmarks/inproc.py (a real gateway, a canned backend and a keep-alive client on one
event loop) runs under callgrind with ``--only via`` (requests through the gateway) and again
with ``--only direct`` (the same client against the backend), each at two request counts; the
difference of the two counts over the difference of requests is the cost of one request without
start-up, warm-up or shutdown. The gateway's share is via − direct. Each tree's gateway is
imported from the tree (``--before`` / ``--after`` as in benchmarks/ab.py: a revision is checked
out with ``git worktree add``), the harness is this checkout's.

What it does not see: system calls' cost in the kernel, cache and branch misses (where the load
benchmark finds each µs of Python costing ~2.5 µs: docs/design-notes.md). It judges changes to
the Python on the path; benchmarks/ab.py remains the judge of CPU per request.

Needs valgrind (Debian ``valgrind``). Takes about a minute per tree (2 cores).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gateway.grpcengine import unchosen

from .ab import REPO, Tree, describe, remove_worktree, resolve_tree
from .inproc import BODIES

__all__ = ["count", "main"]

_COLLECTED = re.compile(r"Collected : (\d+)")
GRPC = "grpc_small"  # benchmarks/inproc_grpc.py: a third side, grpcio's bare pass-through (the floor)


def _shim(tree: Tree, root: Path) -> Path:
    """A directory whose ``benchmarks`` is this checkout's harness; the tree comes after it on
    the path, so ``gateway`` is the tree's."""
    shim = root / f"shim-{tree.side}"
    shim.mkdir(exist_ok=True)
    link = shim / "benchmarks"
    if not link.exists():
        link.symlink_to(REPO / "benchmarks", target_is_directory=True)
    return shim


def _env(tree: Tree, shim: Path) -> dict[str, str]:
    # (each tree's gateway chooses grpc's socket engine for itself: gateway/grpcengine.py)
    return dict(unchosen(dict(os.environ)), PYTHONPATH=f"{shim}{os.pathsep}{tree.path}")


def _check_imports(tree: Tree, shim: Path) -> None:
    """``gateway`` must come from the tree and ``benchmarks`` from this checkout (run from the shim:
    ``python -m`` puts the working directory first on the path)."""
    probe = subprocess.run([sys.executable, "-c", "import gateway, benchmarks.inproc as b; print(gateway.__file__); "
                            "print(b.__file__)"], cwd=shim, env=_env(tree, shim), check=True, capture_output=True,
                           text=True)
    gateway_file, harness = (Path(line).resolve() for line in probe.stdout.split())
    if not gateway_file.is_relative_to(tree.path.resolve()) or not harness.is_relative_to(REPO):
        raise SystemExit(f"{tree.side}: gateway from {gateway_file}, harness from {harness}")


def _run(tree: Tree, shim: Path, only: str, requests: int, body: str, concurrency: int) -> int:
    harness = ["benchmarks.inproc_grpc"] if body == GRPC else ["benchmarks.inproc", "--body", body]
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m", *harness,
           "--only", only, "--requests", str(requests), "--batches", "1", "--concurrency", str(concurrency)]
    proc = subprocess.run(cmd, cwd=shim, env=_env(tree, shim), capture_output=True, text=True, timeout=1800)
    found = _COLLECTED.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{tree.side}: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
                         f"\n{proc.stdout[-1000:]}")
    return int(found[-1])


def count(tree: Tree, root: Path, body: str, concurrency: int, requests: tuple[int, int]) -> dict[str, float]:
    """Instructions per request through the gateway (``via``), direct, and the gateway's own."""
    shim = _shim(tree, root)
    _check_imports(tree, shim)
    low, high = requests
    out: dict[str, float] = {}
    with ThreadPoolExecutor(2) as pool:  # (two cores: the two counts of one side at once)
        for only in ("via", "direct", "floor") if body == GRPC else ("via", "direct"):
            a, b = pool.map(_run, (tree, tree), (shim, shim), (only, only), (low, high), (body, body),
                            (concurrency, concurrency))
            out[only] = (b - a) / (high - low)
    out["gateway"] = out["via"] - out["direct"]
    if "floor" in out:
        out["own"] = out["via"] - out["floor"]  # the gateway's code on top of grpcio's pass-through
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a git revision or a directory to compare with (optional)")
    parser.add_argument("--after", default=str(REPO), help="a directory or revision (default: this checkout)")
    parser.add_argument("--body", choices=(*BODIES, GRPC), default="small",
                        help=f"{GRPC}: benchmarks/inproc_grpc.py, which also counts grpcio's bare pass-through")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", default="500,2500", help="the two request counts (default 500,2500)")
    args = parser.parse_args(argv)
    low, high = (int(x) for x in args.requests.split(","))
    if not 0 < low < high:
        parser.error("--requests: two counts, the first smaller")
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        root = Path(tmp)
        trees = []
        try:
            if args.before:
                trees.append(resolve_tree("before", args.before, root))
            trees.append(resolve_tree("after", args.after, root))
            results = []
            for tree in trees:
                describe(tree)
                results.append((tree, count(tree, root, args.body, args.concurrency, (low, high))))
        finally:
            for tree in trees:
                if tree.worktree:
                    remove_worktree(tree)
    print(f"\nInstructions per request ({args.body}, c={args.concurrency}, callgrind, "
          f"{low} → {high} requests):\n")
    floor = args.body == GRPC
    extra_head = " floor | gateway − floor |" if floor else ""
    print("| tree | revision | through the gateway | direct | gateway |" + extra_head)
    print("|---|---|--:|--:|--:|" + ("--:|--:|" if floor else ""))
    for tree, r in results:
        rev = tree.commit[:10] + (" + changes" if tree.dirty else "")
        extra = f" {r['floor'] - r['direct']:,.0f} | {r['own']:,.0f} |" if floor else ""
        print(f"| {tree.side} | {rev} | {r['via']:,.0f} | {r['direct']:,.0f} | {r['gateway']:,.0f} |{extra}")
    if len(results) == 2:
        before, after = results[0][1]["gateway"], results[1][1]["gateway"]
        print(f"\ngateway after ÷ before: {after / before:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
