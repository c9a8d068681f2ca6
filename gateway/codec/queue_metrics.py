"""Triton's queue depth from its Prometheus metrics text. No I/O.

Triton exports ``nv_inference_pending_request_count{model="<m>",version="<v>"} <n>``: the
requests received and not yet started, per model version (Triton docs, metrics.md,
"Pending Request Count"). Only those lines are looked at, and of those only the ones whose
value is not zero are split into labels: the balancer reads a model missing from the result
as nothing pending, and on a page of thousands of models nearly every count is zero. Compiled
with mypyc (setup.py): a 10,000-model page is read in about a millisecond.
"""
from __future__ import annotations

import re
from typing import Final

__all__ = ["PENDING", "parse_pending"]

PENDING: Final = b"nv_inference_pending_request_count{"
_LABEL = re.compile(rb'(\w+)="((?:[^"\\]|\\.)*)"')
_NEWLINE: Final = 10
_SPACE: Final = 32
_ZERO: Final = 48
_DOT: Final = 46
_CR: Final = 13


def parse_pending(text: bytes) -> dict[tuple[str, str], float]:
    """{(model, version): pending, (model, ""): pending over its versions} for every count that
    is not zero; lines that do not parse are skipped (a metrics page is not a place to fail a
    request from)."""
    out: dict[tuple[str, str], float] = {}
    n = len(text)
    start = text.find(PENDING)
    while start != -1:
        end = text.find(b"\n", start)
        if end == -1:
            end = n
        if not _zero(text, start, end):
            _one(text[start + len(PENDING) - 1 : end], out)
        start = text.find(PENDING, end)
    return out


def _zero(text: bytes, start: int, end: int) -> bool:
    """The line's value is a plain zero ("0", "0.0", ...): the common case, told from its last
    bytes without splitting the line."""
    i = end - 1
    if i > start and text[i] == _CR:
        i -= 1
    while i > start and (text[i] == _ZERO or text[i] == _DOT):
        i -= 1
    return i > start and i + 1 < end and text[i] == _SPACE and text[i + 1] == _ZERO


def _one(line: bytes, out: dict[tuple[str, str], float]) -> None:
    close = line.rfind(b"}")
    if close == -1:
        return
    labels = dict(_LABEL.findall(line[1:close]))
    try:
        value = float(line[close + 1 :].split()[0])
    except (ValueError, IndexError):
        return
    model = labels.get(b"model")
    if model is None or not value > 0:  # (a negative or NaN count is no count)
        return
    m = model.decode("utf-8", "replace")
    v = labels.get(b"version", b"").decode("utf-8", "replace")
    out[(m, v)] = out.get((m, v), 0.0) + value
    if v:
        out[(m, "")] = out.get((m, ""), 0.0) + value
