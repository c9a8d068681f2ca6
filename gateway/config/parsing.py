"""Helpers every config section's parser shares: the problem list and typed readers.

Each problem names its key; every section is checked even after an earlier one
failed (``oip-gateway check`` reports them all at once).
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Problems", "mapping", "number", "secret"]

T = TypeVar("T")


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{key}: {message}")

    def check_keys(self, key: str, data: dict[str, Any], allowed: set[str]) -> None:
        # YAML keys need not be strings (`~: 1`, `3: x`): sorted as text, named as text.
        for unknown in sorted(set(data) - allowed, key=str):
            self.add(f"{key}.{unknown}" if key else str(unknown),
                     f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def build(self, key: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except (ValueError, TypeError) as exc:
            self.add(key, str(exc))
            return None


def mapping(p: Problems, key: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        p.add(key, f"expected a mapping, got {type(value).__name__}")
        return None
    return value


def number(p: Problems, key: str, value: Any, kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        p.add(key, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
        return None
    return value


def secret(p: Problems, key: str, raw: Any) -> str | None:
    """A value given as ``{env: NAME}`` or ``{file: PATH}`` (a mounted Kubernetes Secret);
    read now, at load. Never logged: problems name the variable or file, not the value."""
    if not isinstance(raw, dict) or len(raw) != 1 or not set(raw) <= {"env", "file"}:
        p.add(key, "expected {env: VARIABLE} or {file: PATH}")
        return None
    (kind, where), = raw.items()
    if not isinstance(where, str) or not where:
        p.add(f"{key}.{kind}", "expected a non-empty string")
        return None
    if kind == "env":
        value = os.environ.get(where)
        if value is None:
            p.add(f"{key}.env", f"environment variable {where} is not set")
            return None
    else:
        try:
            value = pathlib.Path(where).read_text().strip()
        except OSError as exc:
            p.add(f"{key}.file", f"cannot read {where}: {exc.strerror}")
            return None
    if not value or any(c in value for c in "\r\n\0"):
        p.add(key, "the value is empty or holds a line break")
        return None
    return value
