"""Triton's queue depth from its Prometheus metrics text. No I/O.

Triton exports ``nv_inference_pending_request_count{model="<m>",version="<v>"} <n>``: the
requests received and not yet started, per model version (Triton docs, metrics.md,
"Pending Request Count"). Only those lines are looked at — the rest of a big metrics page
is skipped without being split into fields — so reading a page costs microseconds.
"""
from __future__ import annotations

import re

__all__ = ["PENDING", "parse_pending"]

PENDING = b"nv_inference_pending_request_count{"
_LABEL = re.compile(rb'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_pending(text: bytes) -> dict[tuple[str, str], float]:
    """{(model, version): pending, (model, ""): pending over its versions}; lines that do
    not parse are skipped (a metrics page is not a place to fail a request from)."""
    out: dict[tuple[str, str], float] = {}
    start = text.find(PENDING)
    while start != -1:
        end = text.find(b"\n", start)
        line = text[start + len(PENDING) - 1: end if end != -1 else len(text)]
        close = line.rfind(b"}")
        if close != -1:
            labels = dict(_LABEL.findall(line[1:close]))
            try:
                value = float(line[close + 1:].split()[0])
            except (ValueError, IndexError):
                value = None
            model = labels.get(b"model")
            if model is not None and value is not None and value >= 0:
                m = model.decode("utf-8", "replace")
                v = labels.get(b"version", b"").decode("utf-8", "replace")
                out[(m, v)] = out.get((m, v), 0.0) + value
                if v:
                    out[(m, "")] = out.get((m, ""), 0.0) + value
        start = text.find(PENDING, end) if end != -1 else -1
    return out
