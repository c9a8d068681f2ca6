"""Allocator tuning applies on glibc and respects the opt-out and explicit settings."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from gateway.malloc import tune_malloc; print(tune_malloc(256 << 20))"


def run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_applies_on_glibc():
    assert run({}) == "True"


def test_opt_out_and_explicit_env_win():
    assert run({"OIP_GATEWAY_MALLOC_TUNING": "0"}) == "False"
    assert run({"MALLOC_MMAP_THRESHOLD_": "131072"}) == "False"
