"""The commands that build a test backend's own virtual environment (.kserve-venv, .mlserver-venv).

With uv there (the pinned one scripts/_uv.sh puts in .lock-venv for the lowest-versions run, or
one on PATH): ``uv venv`` and ``uv pip install``, which resolve and fetch in parallel — ~70 s per
environment with pip in CI, a few seconds with uv, the same versions. Without it: ``python -m
venv`` and pip, as before. Either way the requirements file alone decides what is installed.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["find_uv", "venv_commands"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def find_uv() -> str | None:
    pinned = REPO_ROOT / ".lock-venv" / "bin" / "uv"
    if os.access(pinned, os.X_OK):
        return str(pinned)
    return shutil.which("uv")


def venv_commands(venv_dir: Path, requirements: Path) -> list[list[str]]:
    """Commands that create ``venv_dir`` (which may already hold the install log) and install
    ``requirements`` into it, for this interpreter's Python."""
    python = str(venv_dir / "bin" / "python")
    uv = find_uv()
    if uv is not None:
        return [[uv, "venv", "--quiet", "--allow-existing", "--python", sys.executable, str(venv_dir)],
                [uv, "pip", "install", "--quiet", "--python", python, "-r", str(requirements)]]
    return [[sys.executable, "-m", "venv", str(venv_dir)],
            [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r", str(requirements)]]
