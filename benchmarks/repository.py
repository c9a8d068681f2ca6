"""The load benchmark's Triton model repository: the test models, plus ``add_sub_x2`` when a
workload needs it.

``add_sub`` (tests/models/triton/add_sub) is a Python-backend model with one instance and no
batching, so Triton runs its requests one at a time, each through IPC with the stub process. On
a 2-core machine the req/s of a small call at c=16 / 64 is then set largely by how often that one
serial stage waits for a core, which the proxy in front only moves indirectly.
``add_sub_x2`` is the same model with two instances (``instance_group`` count 2; Triton model
configuration, "Instance Groups"): no serial stage, so req/s follows the CPU every process on the
machine spends per call, the proxy's among them.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support.triton import MODEL_REPOSITORY

from .targets import REAL_MODELS

__all__ = ["TWO_INSTANCES", "model_repository", "routed_models"]

TWO_INSTANCES = "add_sub_x2"
_SOURCE = "add_sub"


def _two_instances(config: str) -> str:
    """add_sub's config.pbtxt, renamed and with two CPU instances."""
    text, named = re.subn(r'^name: "add_sub"$', f'name: "{TWO_INSTANCES}"', config, flags=re.M)
    text, counted = re.subn(r"count: 1\b", "count: 2", text)
    if (named, counted) != (1, 1):
        raise RuntimeError(f"{MODEL_REPOSITORY / _SOURCE / 'config.pbtxt'}: expected one name and one "
                           f"instance count to rewrite, found {named} and {counted}")
    return text


def model_repository(root: Path, models: set[str]) -> Path:
    """The test repository itself when ``models`` needs nothing else; otherwise ``root`` holding a
    link to each test model and a copy of add_sub as ``add_sub_x2``."""
    if TWO_INSTANCES not in models:
        return MODEL_REPOSITORY
    root.mkdir(parents=True, exist_ok=True)
    for model in MODEL_REPOSITORY.iterdir():
        if model.is_dir():
            (root / model.name).symlink_to(model, target_is_directory=True)
    target = root / TWO_INSTANCES
    (target / "1").mkdir(parents=True)
    (target / "config.pbtxt").write_text(_two_instances((MODEL_REPOSITORY / _SOURCE / "config.pbtxt").read_text()))
    # A copy, not a link: the stub's __pycache__ then lands in the scratch repository.
    shutil.copy(MODEL_REPOSITORY / _SOURCE / "1" / "model.py", target / "1" / "model.py")
    return root


def routed_models(models: set[str]) -> tuple[str, ...]:
    """The models a benchmark's gateway routes: the usual ones and any other a workload names."""
    return (*REAL_MODELS, *sorted(models - set(REAL_MODELS)))
