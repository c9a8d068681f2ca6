#!/usr/bin/env bash
# Installs the gateway into .venv and runs `oip-gateway demo`: the gateway on
# Triton's default ports (HTTP 8000, gRPC 8001, metrics 8002) in front of the
# built-in reference V2 server. Extra arguments go to `oip-gateway demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The locked runtime dependencies (hash-checked: requirements/lock.txt), then the gateway itself.
.venv/bin/python -m pip install --quiet --require-hashes -r requirements/lock.txt
.venv/bin/python -m pip install --quiet --no-deps -e .
exec .venv/bin/oip-gateway demo "$@"
