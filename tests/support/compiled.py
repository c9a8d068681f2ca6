"""The hot-path modules setup.py compiles with mypyc: which they are, whether the checkout's
extensions are what is imported, and whether one is older than its source (an edit not yet
rebuilt — the extension would shadow it: Python imports ``h1.*.so`` before ``h1.py``)."""
from __future__ import annotations

import ast
import os
import shutil
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def compiled_sources() -> list[Path]:
    """setup.py's COMPILED, read without running setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets):
            return [REPO / p for p in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no COMPILED list")


def extension_of(source: Path) -> Path | None:
    """The built extension of ``source`` in the checkout, if there is one."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    path = source.with_name(source.stem + suffix)
    return path if path.exists() else None


def extensions(root: Path = REPO) -> tuple[list[str], list[str]]:
    """(compiled modules, those older than their source) under ``root``/gateway/, as paths
    relative to ``root``."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built, stale = [], []
    for ext in sorted((root / "gateway").rglob("*" + suffix)):
        stem = ext.name[: -len(suffix)]
        source = ext.with_name(stem + ".py")
        if not source.exists():
            source = ext.with_name(stem + ".c")  # (a C extension: gateway/codec/_jsonskip.c, gateway/h2/_h2.c)
        if source.exists():
            name = str(source.relative_to(root))
            built.append(name)
            if source.stat().st_mtime_ns > ext.stat().st_mtime_ns:
                stale.append(name)
    return built, stale


def stale_extensions() -> list[str]:
    """Extensions under gateway/ older than their source."""
    return extensions()[1]


def compiling_expected() -> bool:
    """Whether setup.py compiles here (a C compiler, OIP_GATEWAY_COMPILE not 0)."""
    if os.environ.get("OIP_GATEWAY_COMPILE", "1") == "0":
        return False
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None
