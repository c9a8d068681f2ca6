"""Helpers every config section's parser shares: the problem list and typed readers.

Each problem names its key; every section is checked even after an earlier one
failed (``oip-gateway check`` reports them all at once).

Files and environment variables a config names are read through ``read_file`` and
``getenv``, which follow the ``Presence`` policy the ``Problems`` of a load carries.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["NOT_HERE", "NOT_HERE_SECRET", "NotHere", "Presence", "Problems", "getenv", "mapping", "number",
           "read_file", "secret"]

T = TypeVar("T")


class Presence(enum.Enum):
    """What a file or environment variable the config names, that does not exist on this
    machine, is. ``STRICT``: a problem — the config is loaded where it runs (``serve``,
    reloads, ``check --strict``). ``LENIENT``: a note — the config is checked away from where
    it runs (``check`` of a config rendered from the Helm chart, whose Secrets are mounted
    and variables set only inside the pod); what exists is still read and checked."""

    STRICT = "strict"
    LENIENT = "lenient"


class NotHere(enum.Enum):
    """A file or variable absent here, under ``Presence.LENIENT`` (a note was taken)."""

    NOT_HERE = "not present here"


NOT_HERE = NotHere.NOT_HERE
# The value a secret not present here stands for in a config loaded under Presence.LENIENT
# (for checking only, never served): a NUL no header value or bearer credential can hold.
NOT_HERE_SECRET = "\0(not present here)"


class Problems:
    def __init__(self, presence: Presence = Presence.STRICT) -> None:
        self.items: list[str] = []
        self.presence = presence
        # Files and variables not present here (Presence.LENIENT only), one line each.
        self.notes: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{key}: {message}")

    def not_here(self, key: str, what: str, problem: str) -> NotHere | None:
        """``what`` (a path, a variable) does not exist on this machine: a note under
        ``Presence.LENIENT`` (NOT_HERE), else the problem ``problem`` (None)."""
        if self.presence is Presence.LENIENT:
            self.notes.append(f"{key}: {what} not present here (checked inside the pod)")
            return NOT_HERE
        self.add(key, problem)
        return None

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


def read_file(p: Problems, key: str, path: str, limit: int = -1) -> bytes | NotHere | None:
    """The bytes of ``path`` (at most ``limit``), read now. A file that does not exist is
    ``p.not_here`` (NOT_HERE under Presence.LENIENT); one that exists but cannot be read
    (permissions, a directory) is always a problem. None: a problem was added."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except (FileNotFoundError, NotADirectoryError) as exc:
        return p.not_here(key, path, f"cannot read {path}: {exc.strerror}")
    except OSError as exc:
        p.add(key, f"cannot read {path}: {exc.strerror}")
        return None
    except ValueError:  # a NUL in it
        p.add(key, f"{path!r} is not a path")
        return None


def getenv(p: Problems, key: str, name: str) -> str | NotHere | None:
    """The environment variable ``name``; unset is ``p.not_here`` (NOT_HERE under
    Presence.LENIENT). None: a problem was added."""
    value = os.environ.get(name)
    if value is None:
        return p.not_here(key, f"environment variable {name}", f"environment variable {name} is not set")
    return value


def secret(p: Problems, key: str, raw: Any) -> str | None:
    """A value given as ``{env: NAME}`` or ``{file: PATH}`` (a mounted Kubernetes Secret);
    read now, at load. Never logged: problems name the variable or file, not the value.
    Not present here under Presence.LENIENT: NOT_HERE_SECRET (a note was taken)."""
    if not isinstance(raw, dict) or len(raw) != 1 or not set(raw) <= {"env", "file"}:
        p.add(key, "expected {env: VARIABLE} or {file: PATH}")
        return None
    (kind, where), = raw.items()
    if not isinstance(where, str) or not where:
        p.add(f"{key}.{kind}", "expected a non-empty string")
        return None
    got = getenv(p, f"{key}.env", where) if kind == "env" else read_file(p, f"{key}.file", where)
    if got is None:
        return None
    if got is NOT_HERE:
        return NOT_HERE_SECRET
    if isinstance(got, bytes):
        try:
            got = got.decode().strip()
        except UnicodeDecodeError:
            p.add(f"{key}.file", f"{where} is not UTF-8 text")
            return None
    value = got
    if not value or any(c in value for c in "\r\n\0"):
        p.add(key, "the value is empty or holds a line break")
        return None
    return value


def _section(p: Problems, key: str, raw: Any, keys: set[str], cls: Callable[..., T],
             ints: tuple[str, ...] = ()) -> T | None:
    """A mapping of numbers onto a frozen dataclass (health, outlier, dns timings)."""
    data = mapping(p, key, raw)
    if data is None:
        return None
    p.check_keys(key, data, keys)
    kwargs = {k: number(p, f"{key}.{k}", v, int if k in ints else float) for k, v in data.items() if k in keys}
    if any(v is None for v in kwargs.values()):
        return None
    return p.build(key, lambda: cls(**kwargs))
