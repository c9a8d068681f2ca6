# shellcheck shell=bash
# Sourced by scripts/lock.sh and scripts/test-lowest.sh (from the repository root): puts uv, at
# the version pinned here, in .lock-venv (git-ignored) and sets UV to it. uv is installed from
# PyPI by pip; bump UV_VERSION to move every user of it at once.
UV_VERSION=0.13.9
UV=.lock-venv/bin/uv
if [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  "${PYTHON:-python3}" -m venv .lock-venv
  .lock-venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
