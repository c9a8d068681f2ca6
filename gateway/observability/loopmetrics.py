"""The per-request counters and histograms of a single-process gateway, kept in plain Python
numbers and exposed through prometheus-client's public collector interface (``Collector``,
``CounterMetricFamily``, ``HistogramMetricFamily``).

Why not the library's own ``Counter`` / ``Histogram``: every value there sits behind a lock, and
a request took seven of them (~1.6 µs, a twentieth of the gateway's Python on a small request),
though every request is recorded on the event loop's one thread and a scrape reads on that same
thread between requests. The exposition is the library's, sample for sample (a differential test
holds the two to it: tests/unit/test_loopmetrics.py), except the ``_created`` samples, which no
dashboard or rule of the gateway reads. With several workers (prometheus-client's multiprocess
mode) the library's own metrics are used: their values live in files the supervisor reads.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LoopCounter", "LoopHistogram"]


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        """The sum, then the one bucket of the smallest bound >= amount (as the library)."""
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1.0


class LoopCounter(Collector):
    """A labelled counter (``labels(...).inc()``), exposed as ``<name>_total``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = CounterChild()
        return child

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value)
        yield family


class LoopHistogram(Collector):
    """A labelled histogram (``labels(...).observe(x)``) with the library's bucket rules:
    bounds sorted, ``+Inf`` added last."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = bounds
        self.children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = HistogramChild(self.bounds)
        return child

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds]
        for values, child in list(self.children.items()):
            cumulative = 0.0
            buckets = []
            for le, count in zip(les, child.counts):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(values), buckets, child.sum)
        yield family
