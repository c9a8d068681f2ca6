"""Weighted choice between the backends of a split route. Pure state, no I/O.

Requests outside sequences go by smooth weighted round robin (nginx's): over any run
of requests each side's share is its weight's to within one request, with the sides
interleaved — a 95/5 canary gets every 20th request, not bursts. A request with an
affinity key (Triton's ``sequence_id``) goes by weighted rendezvous hashing, so every
request of a sequence lands in the same backend, and a side leaving moves only its own
sequences. Sides that cannot take the request (no endpoint has the model ready) are
left out and their share goes to the others; when none can, all are eligible (the
chosen backend then says why it cannot).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

__all__ = ["WeightedSplit"]


class WeightedSplit:
    __slots__ = ("_current", "names", "weights")

    def __init__(self, names: Sequence[str], weights: Sequence[float]) -> None:
        if len(names) != len(weights) or not names:
            raise ValueError("a split needs one weight per side")
        self.names = tuple(names)
        self.weights = tuple(float(w) for w in weights)
        self._current = [0.0] * len(names)

    def choose(self, eligible: Callable[[str], bool], affinity: str | None = None) -> str:
        """The side to send a request to; ``eligible(name)``: that side can take it."""
        sides = [i for i, n in enumerate(self.names) if eligible(n)] or list(range(len(self.names)))
        if affinity is not None:
            return self.names[min(sides, key=lambda i: _rendezvous(affinity, self.names[i], self.weights[i]))]
        total = 0.0
        best = sides[0]
        for i in sides:
            self._current[i] += self.weights[i]
            total += self.weights[i]
            if self._current[i] > self._current[best]:
                best = i
        self._current[best] -= total
        return self.names[best]


def _rendezvous(key: str, name: str, weight: float) -> float:
    """Weighted rendezvous score (lowest wins): -ln(u) / weight, u uniform in (0, 1] from
    a hash of key and side — each side wins with probability weight / total."""
    digest = hashlib.blake2b(f"{key}|{name}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "little") + 1) / 2.0**64
    return -math.log(u) / weight
