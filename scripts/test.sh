#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# CI runs exactly this command (.ci/run). Extra arguments go to pytest.
#
# - .venv: the project with its [test] extra (tritonclient, nvidia-pytriton
#   with Triton's server binary, hypothesis, pytest).
# - .mlserver-venv: MLServer in its own environment (its pins clash with ours);
#   built by tests/support/mlserver.py on first use.
# - CI=1 makes a backend that cannot start a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
export CI="${CI:-1}"
exec .venv/bin/python -m pytest "$@"
