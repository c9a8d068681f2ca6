#!/usr/bin/env bash
# Regenerates the hash-pinned lock files from pyproject.toml (docs/dependencies.md); run it after
# any change to [project].dependencies or the [test] extra, and commit what it writes:
#
#   requirements/test-lock.txt  the runtime dependencies and the [test] extra: what scripts/test.sh
#                               installs into .venv (pip install --require-hashes).
#   requirements/lock.txt       the runtime dependencies alone, at the versions of test-lock.txt:
#                               what deploy/Dockerfile installs, so the image runs what was tested.
#
# Target: CPython 3.11 on Linux x86_64 (manylinux 2.35 for the tests: nvidia-pytriton's wheels
# need it; 2.28 for the image). Pins already in the files are kept where they still fit; extra
# arguments go to both `uv pip compile` runs, e.g. `bash scripts/lock.sh --upgrade` (everything to
# the newest allowed) or `--upgrade-package grpcio`. uv comes from scripts/_uv.sh (.lock-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_uv.sh
source scripts/_uv.sh

COMMON=(--quiet --generate-hashes --python-version 3.11 --custom-compile-command "bash scripts/lock.sh")
mkdir -p requirements
"$UV" pip compile pyproject.toml --extra test "${COMMON[@]}" --python-platform x86_64-manylinux_2_35 \
  -o requirements/test-lock.txt "$@"
"$UV" pip compile pyproject.toml "${COMMON[@]}" --python-platform x86_64-manylinux_2_28 \
  --constraints requirements/test-lock.txt -o requirements/lock.txt "$@"
echo "scripts/lock.sh: wrote requirements/test-lock.txt ($(grep -c '^[a-z0-9]' requirements/test-lock.txt) packages)" \
  "and requirements/lock.txt ($(grep -c '^[a-z0-9]' requirements/lock.txt) packages)"
