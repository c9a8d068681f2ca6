"""The real ``helm`` (pinned and checksum-verified by scripts/install-helm.sh) and what the
chart tests do with it: render the chart into parsed objects, lint it, and validate every
object against Kubernetes' OpenAPI schemas (PyPI ``kubernetes-validate``, strict mode).
"""
from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHART",
    "EXAMPLES",
    "HELM_VERSION",
    "INSTALLER",
    "K8S_VERSIONS",
    "OPERATOR_KINDS",
    "ROOT",
    "HelmFailed",
    "HelmUnavailable",
    "by_kind",
    "helm",
    "helm_binary",
    "lint",
    "render",
    "schema_problems",
]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "oip-gateway"
EXAMPLES = ROOT / "deploy" / "examples"
INSTALLER = ROOT / "scripts" / "install-helm.sh"
HELM_VERSION = "v4.1.4"  # scripts/install-helm.sh pins it (with its sha256)

# Kinds of the Prometheus Operator's CRDs: not in Kubernetes' own schemas, so
# kubernetes-validate cannot check them; the tests check them structurally instead.
OPERATOR_KINDS = frozenset({("monitoring.coreos.com/v1", "ServiceMonitor"),
                            ("monitoring.coreos.com/v1", "PrometheusRule")})


def _k8s_versions() -> tuple[str, ...]:
    import kubernetes_validate

    # The oldest release the chart supports (Chart.yaml kubeVersion) and the newest schemas
    # kubernetes-validate carries.
    return ("1.30", kubernetes_validate.latest_version())


K8S_VERSIONS = _k8s_versions()


class HelmUnavailable(RuntimeError):
    """scripts/install-helm.sh could not install helm here (no npm, no registry)."""


class HelmFailed(AssertionError):
    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        self.proc = proc
        self.output = proc.stdout + proc.stderr


@functools.cache
def helm_binary() -> Path:
    """Path of the pinned helm, installed on first use (the script returns at once when it is)."""
    proc = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OIP_TOOLS_DIR": str(ROOT / ".tools" / "bin")})
    if proc.returncode != 0:
        raise HelmUnavailable(f"scripts/install-helm.sh failed: {proc.stderr.strip()[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1]) / "helm"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # An empty HELM_* environment: no user repositories, plugins or kubeconfig leak in.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "HELM_CACHE_HOME": "/tmp/oip-helm-cache", "HELM_CONFIG_HOME": "/tmp/oip-helm-config",
           "HELM_DATA_HOME": "/tmp/oip-helm-data", "KUBECONFIG": "/dev/null"}
    proc = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=60, env=env)
    if check and proc.returncode != 0:
        raise HelmFailed(args, proc)
    return proc


def _value_args(values: Iterable[Path | str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out += ["-f", str(v)]
    return out


def render(*values: Path | str, release: str = "gw", namespace: str = "models") -> list[dict[str, Any]]:
    """``helm template`` of the chart with these values files: the parsed objects, in order."""
    proc = helm("template", release, str(CHART), "--namespace", namespace, *_value_args(values))
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def lint(*values: Path | str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return helm("lint", "--strict", str(CHART), *_value_args(values), check=check)


def by_kind(objs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objs:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def schema_problems(obj: dict[str, Any], versions: Sequence[str] = K8S_VERSIONS) -> list[str]:
    """What Kubernetes' OpenAPI schemas (strict: no unknown fields) say against ``obj``,
    for each version; [] when it is valid. Raises for kinds the schemas do not hold."""
    import kubernetes_validate

    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    problems = []
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{where} (Kubernetes {version}): {path}: {exc.message}")
    return problems
