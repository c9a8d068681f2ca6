"""One HTTP JSON inference to a gRPC backend crosses few modules, and none twice: out from the
client's connection to the gRPC call, and back to the write of its answer (the walk that
docs/architecture.md describes). Measured from Python frames in a process of its own
(tests/integration/walk_probe.py: every module from source, the demo's reference V2 server
behind the gateway on real sockets).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
MOST = 6  # modules out and back (docs/architecture.md, "One request, module by module")


def test_json_to_grpc_crosses_at_most_six_modules_and_none_twice():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, str(REPO / "tests" / "integration" / "walk_probe.py")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    walk = orjson.loads(run.stdout.strip().splitlines()[-1])
    assert walk["status"] == 200
    out, back = walk["out"], walk["back"]
    assert out, "the probe saw no gRPC call"
    assert out[0].startswith("frontend/"), f"the walk starts at the listener: {out}"
    assert not out[-1].startswith("frontend/"), f"the gRPC call is the backend's: {out}"
    assert len(set(out)) == len(out), f"a module entered twice on the way out (a detour): {' → '.join(out)}"
    crossed = set(out) | set(back)
    assert len(crossed) <= MOST, f"{len(crossed)} modules out and back: out {out}, back {sorted(back)}"
