"""What an endpoint of a placement pool holds, counted against its capacity: ``Usage`` (one
Triton's statistics: each model's last inference and reported memory) and ``Room`` (whether one
more model fits under ``capacity_models`` and ``capacity_bytes``)."""
from __future__ import annotations

from ..codec.tritonstats import stats_from_json, stats_from_pb

__all__ = ["Room", "Usage"]


class Usage:
    """One endpoint's models as its Triton statistics tell them: name -> (last inference in ms
    since the epoch, 0 when never; bytes of memory reported)."""

    __slots__ = ("models",)

    def __init__(self, models: dict[str, tuple[int, int]]) -> None:
        self.models = models

    @classmethod
    def read(cls, answer: bytes, form: str) -> Usage:
        stats = stats_from_json(answer) if form == "json" else stats_from_pb(answer)
        models: dict[str, tuple[int, int]] = {}
        for m in stats.model_stats:
            last, size = models.get(m.name, (0, 0))
            models[m.name] = (max(last, int(m.last_inference)),
                              size + sum(int(u.byte_size) for u in m.memory_usage))
        return cls(models)


class Room:
    """Whether one more model fits on an endpoint: fewer than ``models`` held, and — when ``limit``
    (``capacity_bytes``) is not 0 — the memory the held models report plus the new one's within it.

    Triton reports a model's memory only once it is loaded, so each size seen on any endpoint of
    the pool is remembered (``learn``) and stands for the model where it is loading or not yet
    loaded. A model never loaded anywhere has no size yet: it fits while the held ones leave room
    at all, and once its load reveals the size the endpoint may be over by it (``over``, which
    the placer answers by evicting). A model larger than ``limit`` alone needs an empty endpoint.
    """

    __slots__ = ("limit", "models", "sizes")

    # Sizes kept at most (model names come from the servers' repositories, not from clients).
    _KEEP = 65536

    def __init__(self, models: int, limit: int) -> None:
        self.models = models
        self.limit = limit
        self.sizes: dict[str, int] = {}

    def learn(self, usage: Usage) -> None:
        sizes = self.sizes
        for name, (_, size) in usage.models.items():
            if size:
                if len(sizes) >= self._KEEP and name not in sizes:
                    sizes.clear()
                sizes[name] = size

    def size(self, model: str, usage: Usage | None) -> int:
        reported = usage.models.get(model) if usage is not None else None
        if reported is not None and reported[1]:
            return reported[1]
        return self.sizes.get(model, 0)

    def used(self, held: set[str], usage: Usage | None) -> int:
        return sum(self.size(m, usage) for m in held)

    def fits(self, model: str, held: set[str], usage: Usage | None) -> bool:
        if len(held) >= self.models:
            return False
        if not self.limit:
            return True
        used = self.used(held, usage)
        need = min(self.sizes.get(model, 0), self.limit)
        return used + need <= self.limit if need else used < self.limit

    def over(self, held: set[str], usage: Usage | None) -> bool:
        """More memory held than ``limit`` (the size a first load revealed)."""
        return bool(self.limit) and self.used(held, usage) > self.limit
