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
# libnghttp2's header, for the gateway's own HTTP/2 (gateway/h2, built by setup.py): installed
# when missing and apt can; without it gRPC runs on grpcio (the same behaviour, more CPU).
if [ ! -e /usr/include/nghttp2/nghttp2.h ] && command -v apt-get >/dev/null; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=(sudo -n); fi
  { "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends libnghttp2-dev; } >/dev/null 2>&1 \
    || echo "note: libnghttp2-dev not installed: gRPC runs on grpcio" >&2
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The locked runtime dependencies (hash-checked: requirements/lock.txt), then the gateway itself.
.venv/bin/python -m pip install --quiet --require-hashes -r requirements/lock.txt
.venv/bin/python -m pip install --quiet --no-deps -e .
exec .venv/bin/oip-gateway demo "$@"
