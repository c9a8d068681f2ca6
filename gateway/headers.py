"""Which of a request's headers (HTTP) or metadata (gRPC) a backend is given, and the metadata
as a header mapping for header routes. On every gRPC inference: compiled with mypyc (setup.py).
No I/O.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["TRACE_HEADERS", "metadata_map", "pick_headers"]

# Request context a client sends that the backend should always see: W3C trace context
# (Triton's OpenTelemetry tracing continues the client's trace) and a request id. HTTP
# headers and gRPC metadata alike; lower-case names. ``forward_headers`` adds more.
TRACE_HEADERS = ("traceparent", "tracestate", "x-request-id")


def metadata_map(metadata: Sequence[tuple[str, str]]) -> dict[str, str]:
    """gRPC metadata as a header mapping for header routes (text entries only)."""
    return {k: v for k, v in metadata if isinstance(v, str)}


def pick_headers(pairs: Mapping[str, str] | Sequence[tuple[str, str]],
                 names: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """The entries of ``pairs`` (a lower-cased header mapping or gRPC metadata) named in ``names``."""
    # (gRPC metadata is a tuple: told apart before the ABC check, which costs more than the rest.)
    items = pairs if type(pairs) is tuple else pairs.items() if isinstance(pairs, Mapping) else pairs
    # (A loop, not a generator expression: on every gRPC inference, and most find nothing.)
    picked: list[tuple[str, str]] | None = None
    for k, v in items:
        if k in names and isinstance(v, str):
            if picked is None:
                picked = []
            picked.append((k, v))
    return () if picked is None else tuple(picked)
