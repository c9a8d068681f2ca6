"""Rendezvous (highest random weight) hashing: every process that knows the same nodes ranks
them the same way for a key, with no coordination, and adding or removing one node moves only
the keys whose first choice it is (Thaler & Ravishankar, 1998).

The weight is a keyed-free BLAKE2b of ``key`` and ``node`` — not Python's ``hash``, which is
salted per process: two gateway replicas must rank alike.
"""
from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

__all__ = ["rank", "weight"]


def weight(key: str, node: str) -> int:
    """``node``'s weight for ``key`` (64 bits); the highest wins."""
    return int.from_bytes(blake2b(f"{key}\0{node}".encode(), digest_size=8).digest(), "big")


def rank(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` in ``key``'s order of preference (ties, which need a 64-bit collision, by name)."""
    return sorted(nodes, key=lambda n: (weight(key, n), n), reverse=True)
