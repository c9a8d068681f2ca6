"""The per-request histogram observer (observability/metrics.py ``Observer``) writes exactly
what prometheus_client's own ``Histogram.observe`` writes, and the in-flight bytes gauge
reads the admission budget when scraped."""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observability.metrics import _LATENCY_BUCKETS, _SIZE_BUCKETS, Metrics, Observer, counting
from gateway.admission import Admission

VALUES = [0.0, 1e-9, 0.0005, 0.00050001, 0.001, 0.003, 0.0099, 1.0, 2.5, 59.9, 60.0, 61.0, 1e12, math.inf, -1.0,
          256.0, 257.0, 4.0**14, 4.0**14 + 1, 123456.0]


def exposition(buckets: tuple[float, ...], use_observer: bool) -> bytes:
    registry = CollectorRegistry()
    h = Histogram("h", "doc", ["a"], buckets=buckets, registry=registry)
    child = h.labels("x")
    observe = Observer(child).observe if use_observer else child.observe
    for v in VALUES:
        observe(v)
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_observer_writes_what_the_library_writes():
    for buckets in (_LATENCY_BUCKETS, _SIZE_BUCKETS):
        assert exposition(buckets, True) == exposition(buckets, False)


class _NoLock:
    def __enter__(self) -> None:
        raise AssertionError("the per-request path took the value's lock")

    def __exit__(self, *exc: object) -> None:
        pass


def test_single_process_values_are_added_to_without_their_lock():
    registry = CollectorRegistry()
    h = Histogram("h", "doc", ["a"], buckets=_LATENCY_BUCKETS, registry=registry).labels("x")
    c = Counter("c", "doc", ["a"], registry=registry).labels("x")
    observe, inc = Observer(h).observe, counting(c)
    for value in (h._sum, c._value, *h._buckets):
        value._lock = _NoLock()
    observe(0.003)
    observe(0.003)
    inc()
    inc()
    assert h._sum._value == 0.006 and c._value._value == 2.0
    assert [b._value for b in h._buckets][:5] == [0.0, 0.0, 0.0, 2.0, 0.0]


def test_counting_writes_what_the_library_writes():
    def text(use: bool) -> bytes:
        registry = CollectorRegistry()
        child = Counter("c", "doc", ["a"], registry=registry).labels("x")
        inc = counting(child) if use else child.inc
        for _ in range(3):
            inc()
        return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)

    assert text(True) == text(False) and b'c_total{a="x"} 3.0' in text(True)


def test_inflight_gauge_reads_the_budget_when_scraped():
    metrics = Metrics(CollectorRegistry())
    assert not metrics.multiprocess
    admission = Admission(None, metrics.inflight_bytes, 0, metrics.track)
    assert admission.gauge is None  # nothing set per request

    def scraped() -> float:
        for line in generate_latest(metrics.registry).decode().splitlines():
            if line.startswith("oip_gateway_inflight_request_bytes "):
                return float(line.split()[1])
        raise AssertionError("no gauge")

    admission.enter(1000)
    admission.enter(24)
    assert scraped() == 1024
    admission.leave(1000)
    assert scraped() == 24
    admission.leave(24)
    assert scraped() == 0


def test_multiprocess_mode_sets_the_gauge(monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")
    metrics = Metrics(CollectorRegistry())  # (its values stay in-process: the class is chosen at import)
    assert metrics.multiprocess
    admission = Admission(None, metrics.inflight_bytes, 0, metrics.track)
    assert admission.gauge is metrics.inflight_bytes
    admission.enter(7)
    assert metrics.inflight_bytes._value.get() == 7
