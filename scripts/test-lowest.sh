#!/usr/bin/env bash
# The lowest-versions run (docs/dependencies.md): every direct runtime dependency at the lowest
# version pyproject.toml allows, in .lowest-venv (git-ignored), then the unit tests and a core
# integration subset (the real gateway in front of the real Triton, HTTP and gRPC) there.
# scripts/test.sh runs it before the main suite; it can run alone. Extra arguments go to pytest.
#
# The floors are derived mechanically: each entry of [project].dependencies becomes
# name[extras]==its lower bound (>=, ~= or ==); an entry without one is an error. Transitive
# dependencies and the [test] extra resolve to their newest compatible releases.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.lowest-venv
# shellcheck source=scripts/_uv.sh
source scripts/_uv.sh

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" - "$WORK" <<'EOF'
import re
import sys
import tomllib
from pathlib import Path

work = Path(sys.argv[1])
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
floors = []
for dep in project["dependencies"]:
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)", dep)
    if m is None or ";" in dep:
        sys.exit(f"scripts/test-lowest.sh: cannot read a floor from {dep!r} (markers are not handled)")
    name, extras, spec = m.group(1), m.group(2) or "", m.group(3)
    lows = [s.strip()[2:].strip() for s in spec.split(",") if s.strip()[:2] in (">=", "~=", "==")]
    if len(lows) != 1:
        sys.exit(f"scripts/test-lowest.sh: {dep!r} has no single lower bound (>=, ~= or ==)")
    floors.append(f"{name}{extras}=={lows[0]}")
(work / "floors.txt").write_text("\n".join(floors) + "\n")
(work / "test.txt").write_text("\n".join(project["optional-dependencies"]["test"]) + "\n")
print("lowest run, direct runtime dependencies at their floors:", " ".join(floors))
EOF

if [ ! -x "$VENV/bin/python" ]; then
  "$UV" venv --quiet --python "$PYTHON" "$VENV"
fi
"$UV" pip compile --quiet --no-header --python "$VENV/bin/python" \
  "$WORK/floors.txt" "$WORK/test.txt" -o "$WORK/lowest.txt"
# sync, not install: a dependency dropped from pyproject.toml leaves this environment too.
"$UV" pip sync --quiet --python "$VENV/bin/python" "$WORK/lowest.txt"
# The project itself, pure Python: OIP_GATEWAY_COMPILE=0 makes setup.py build no extension.
# Extensions that `pip install -e .` left in the checkout (scripts/test.sh builds them first)
# are still what Python imports; tests/conftest.py refuses stale ones as in the main run.
OIP_GATEWAY_COMPILE=0 "$UV" pip install --quiet --python "$VENV/bin/python" --no-deps -e .

# Unit tests, all of them, and integration tests that start the real gateway in front of the
# built-in reference server and the real Triton and infer through it with tritonclient over HTTP
# and gRPC (sync and asyncio clients, pass-through and protocol conversion; ~35 s, most of it
# Triton starting), plus two workers behind shared ports with their Prometheus metrics.
INTEGRATION=(
  tests/integration/test_tritonclient_matrix.py
  tests/integration/test_process.py::test_two_workers_share_both_ports
  tests/integration/test_process.py::test_metrics_endpoint
)
# Left out here, each for a reason that is not the version of a runtime dependency:
EXCLUDE=(
  # The test hands dnspython's read_resolv_conf a pathlib.Path, which dnspython takes only from
  # 2.9 on; the gateway itself never calls it with one (it reads /etc/resolv.conf by name).
  --deselect tests/unit/test_dns.py::test_missing_resolv_conf_fails_on_use
  # Fixed-budget libFuzzer runs (~45 s of the budget here); the same targets run under
  # hypothesis in this file (test_*_structured), and in full in the main run.
  --deselect tests/unit/test_fuzz_targets.py::test_bounded_atheris_run
)
# OIP_GATEWAY_COMPILE=0: test_compiled's "the modules run compiled" belongs to the main run.
export CI="${CI:-1}" OIP_GATEWAY_COMPILE=0
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q tests/unit "${INTEGRATION[@]}" "${EXCLUDE[@]}" "$@"
