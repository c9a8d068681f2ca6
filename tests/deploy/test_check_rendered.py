"""``oip-gateway check`` of every config the chart renders, as a user runs it on a laptop or
in CI (issue 37): the files the pod reads from mounted Secrets and the variables it gets from
them do not exist here. Without ``--strict`` each is one note and the check passes; with
``--strict`` (as ``serve`` loads a config) each is an error naming its key.

The cases, the rendering and the reading of the objects are tests/deploy/test_chart.py's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_chart import (  # noqa: F401 - fixtures: the rendered cases, helm present
    _helm_installed,
    case,
    config_file_refs,
    container,
    one,
    rendered,
    secret_file,
    values_dir,
)
from tests.support import helm as h


def _key(where: list[Any]) -> str:
    """["auth", "keys", 0, "key", "file"] → "auth.keys[0].key.file" (the loader's naming)."""
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def pod_only(config: dict[str, Any], objs: list[dict[str, Any]]) -> dict[str, str]:
    """Key → what the note names, for every file (from a mounted Secret or ConfigMap) and
    environment variable (from a Secret) the rendered config makes the gateway read."""
    out = {}
    for where, _, path in config_file_refs(config):
        secret_file(path, objs)  # mounted in the pod
        assert not os.path.exists(path), f"{path} exists on this machine: the test cannot tell"
        out[_key(where)] = path
    env = {e["name"] for e in container(objs).get("env", [])}
    refs = [(f"backends.{name}.check_headers.{header}.env", spec["env"])
            for name, backend in config["backends"].items()
            for header, spec in (backend.get("check_headers") or {}).items() if "env" in spec]
    refs += [(f"auth.keys[{i}].key.env", k["key"]["env"])
             for i, k in enumerate((config.get("auth") or {}).get("keys") or ()) if "env" in k["key"]]
    for key, var in refs:
        assert var in env, f"{key}: {var} is not in the container's env"
        out[key] = f"environment variable {var}"
    return out


def check(path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # Only PATH: none of the pod's variables, as on a laptop or a CI runner.
    return subprocess.run([sys.executable, "-m", "gateway", "check", *flags, str(path)], capture_output=True,
                          text=True, timeout=60, cwd=h.ROOT, env={"PATH": os.environ.get("PATH", "")})


def test_rendered_config_checks_here(case: tuple[str, list[Path]], tmp_path: Path) -> None:
    objs = rendered(case)
    text = one(objs, "ConfigMap")["data"]["config.yaml"]  # exactly what the pod reads
    config = yaml.safe_load(text)
    expected = pod_only(config, objs)
    path = tmp_path / "config.yaml"
    path.write_text(text)

    proc = check(path)
    assert proc.returncode == 0, f"oip-gateway check refused the rendered config:\n{proc.stdout}{proc.stderr}"
    notes = sorted(line for line in proc.stdout.splitlines() if line.startswith("note: "))
    assert notes == sorted(f"note: {key}: {what} not present here (checked inside the pod)"
                           for key, what in expected.items()), proc.stdout
    assert ("not present here, not checked (--strict requires them)" in proc.stdout) == bool(expected)

    proc = check(path, "--strict")
    if not expected:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    assert proc.returncode == 1, f"--strict accepted files and variables absent here:\n{proc.stdout}"
    errors = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert sorted(e.split(": ")[0] for e in errors) == sorted(expected), proc.stderr
    assert proc.stderr.splitlines()[-1] == f"{path}: {len(expected)} problem(s)"
