"""Model repositories for fleet tests: add_sub under other names, each slow to load.

A fleet test restarts a Triton whose models take seconds to load, to prove the gateway keeps
traffic away from it until they are ready. Each generated model is exactly ``add_sub``
(tests/models/triton/add_sub): its config.pbtxt with the name replaced and one ``parameters``
entry added (``load_delay_s``), and as model.py a symlink to
tests/models/triton_slow_template/model.py, which subclasses add_sub's own model and sleeps
``load_delay_s`` in ``initialize``.
"""
from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .triton import MODEL_REPOSITORY

__all__ = ["SLOW_TEMPLATE", "slow_repository"]

SLOW_TEMPLATE = MODEL_REPOSITORY.parent / "triton_slow_template" / "model.py"
_ADD_SUB_CONFIG = MODEL_REPOSITORY / "add_sub" / "config.pbtxt"
_NAME_LINE = re.compile(r'^name:\s*"add_sub"\s*$', re.MULTILINE)
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _config(name: str, load_delay_s: float) -> str:
    text, count = _NAME_LINE.subn(f'name: "{name}"', _ADD_SUB_CONFIG.read_text())
    if count != 1:
        raise RuntimeError(f"{_ADD_SUB_CONFIG} has no single 'name: \"add_sub\"' line to rename")
    # Read by the template's initialize() from the model config Triton hands it (args["model_config"]).
    parameter = f'parameters: {{ key: "load_delay_s" value: {{ string_value: "{load_delay_s!r}" }} }}'
    return text.rstrip("\n") + "\n" + parameter + "\n"


def slow_repository(root: Path, models: Sequence[str], load_delay_s: float) -> Path:
    """Build a Triton model repository in a new directory under ``root``; return its path.

    Each of ``models`` behaves like add_sub and takes ``load_delay_s`` seconds to load.
    """
    if not models:
        raise ValueError("slow_repository needs at least one model name")
    if load_delay_s < 0:
        raise ValueError(f"load_delay_s must be >= 0, got {load_delay_s}")
    for name in models:
        if not _MODEL_NAME.match(name) or name in (".", ".."):
            raise ValueError(f"not a usable model name: {name!r}")
    if len(set(models)) != len(models):
        raise ValueError(f"duplicate model names in {list(models)}")
    Path(root).mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="slow-repository-", dir=root))
    for name in models:
        version = repo / name / "1"
        version.mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_config(name, float(load_delay_s)))
        (version / "model.py").symlink_to(SLOW_TEMPLATE)
    return repo
