#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# CI runs exactly this command (.ci/run). Extra arguments go to pytest.
#
# - .venv: the project with its [test] extra (tritonclient, nvidia-pytriton
#   with Triton's server binary, hypothesis, pytest, mypy — run on gateway/
#   before the tests, settings in pyproject.toml).
# - .mlserver-venv: MLServer in its own environment (its pins clash with ours);
#   built by tests/support/mlserver.py on first use.
# - CI=1 makes a backend that cannot start a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Debian packages the tests run for real: dnsmasq (tests/support/dnsmasq.py, the
# DNS server behind the DNS-discovery tests). We install dnsmasq-base, the
# package holding just /usr/sbin/dnsmasq: the "dnsmasq" package adds a system
# service that its postinst tries to start on port 53 (and to register with
# resolvconf), which we neither need nor want on a developer's machine. apt is
# skipped when the binary is already there (/usr/sbin is not on every PATH).
if ! command -v dnsmasq >/dev/null 2>&1 && [ ! -x /usr/sbin/dnsmasq ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo)
    else
      echo "scripts/test.sh: dnsmasq is missing and we are not root (no sudo) to install it" >&2
      exit 1
    fi
  fi
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends dnsmasq-base >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
export CI="${CI:-1}"
# Types first: a type error fails the run before the (minutes-long) suite starts.
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
