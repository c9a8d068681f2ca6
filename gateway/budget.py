"""A count of bytes held against a limit: pure state, no I/O.

Two users: the HTTP front end's preallocated request bodies (frontend/infer.py) and
admission control over request bytes in flight (``max_inflight_bytes``, proxy.py).
"""
from __future__ import annotations

__all__ = ["ByteBudget"]


class ByteBudget:
    """``limit`` 0 means no limit: bytes are only counted."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes, unless that would pass the limit (then hold nothing)."""
        if self.limit and self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n
