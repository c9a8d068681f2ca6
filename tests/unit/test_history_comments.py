"""The gateway's comments and docstrings speak of the code, never of the project's history.

"session 17" or "issue 3's memory target" means nothing to a reader of the code: state the fact,
the measurement or the target itself. A third-party bug is cited by its repository
("grpc/grpc#42194", or "grpc/grpc issue 42194"), which this allows.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
GENERATED = PACKAGE / "_pb"

# Files exempted (an entry ending in "/" covers a folder): none.
PENDING: set[str] = set()

# "session 17", "Issue 3", "issue #35" — unless right after a repository ("owner/repo issue 42").
HISTORY = re.compile(r"\b(?:session|issue)\s+#?\d+", re.IGNORECASE)
REPOSITORY = re.compile(r"[\w.-]+/[\w.-]*[A-Za-z][\w.-]*\s+$")


def citations(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each citation of the project's history in ``text``."""
    found = []
    for m in HISTORY.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if REPOSITORY.search(text, line_start, m.start()):
            continue
        line_end = text.find("\n", m.end())
        found.append((text.count("\n", 0, m.start()) + 1, text[line_start:line_end if line_end >= 0 else None]))
    return found


def _pending(rel: str) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in PENDING)


def test_no_comment_cites_the_projects_history():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_relative_to(GENERATED) or _pending(rel):
            continue
        bad += [f"{rel}:{n}: {line.strip()}" for n, line in citations(path.read_text(encoding="utf-8"))]
    assert not bad, "state the fact itself, not the session or issue it came from:\n" + "\n".join(bad)


def test_the_pattern():
    assert [n for n, _ in citations("x = 1\n# measured in session 17: 6.8 x\n")] == [2]
    assert citations("# (issue 3's memory target)")
    assert citations('"""Backends are untrusted (Issue 35)."""')
    assert citations("# see issue #35")
    assert citations("# SESSION 4")
    # a third party's bug, cited by its repository
    assert not citations("# no upper bound (grpc/grpc issue 42194)")
    assert not citations("# no upper bound (grpc/grpc#42194)")
    assert not citations("# python/cpython issue 12345")
    # words that only look alike
    assert not citations("# sessions 3 at a time; issues 2; tissue 4; session_4")
    assert not citations("# an HTTP/2 session")
    # a version number is no repository
    assert citations("# HTTP/2 session 3")
