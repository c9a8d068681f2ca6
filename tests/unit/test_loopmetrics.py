"""The per-request counters and histograms of one process (observability/loopmetrics.py) expose
exactly what prometheus_client's own ``Counter`` and ``Histogram`` expose for the same
observations (a differential test; ``_created`` samples aside), and the in-flight bytes gauge
reads the admission budget when scraped."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.admission import Admission
from gateway.observability.loopmetrics import LoopCounter, LoopHistogram
from gateway.observability.metrics import _LATENCY_BUCKETS, _SIZE_BUCKETS, Metrics

VALUES = [0.0, 1e-9, 0.0005, 0.00050001, 0.001, 0.003, 0.0099, 1.0, 2.5, 59.9, 60.0, 61.0, 1e12, math.inf, -1.0,
          256.0, 257.0, 4.0**14, 4.0**14 + 1, 123456.0]


def _text(registry: CollectorRegistry) -> bytes:
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def histograms(buckets: tuple[float, ...], values: list[float], labels: list[str]) -> tuple[bytes, bytes]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistogram("h", "doc", ["a"], buckets, ours)
    lib = Histogram("h", "doc", ["a"], buckets=buckets, registry=theirs)
    for value, label in zip(values, labels):
        mine.labels(label).observe(value)
        lib.labels(label).observe(value)
    return _text(ours), _text(theirs)


def test_histograms_expose_what_the_library_exposes():
    for buckets in (_LATENCY_BUCKETS, _SIZE_BUCKETS):
        ours, theirs = histograms(buckets, VALUES, ["x"] * len(VALUES))
        assert ours == theirs


@given(st.lists(st.tuples(st.floats(allow_nan=False, min_value=-1e15, max_value=1e15),
                          st.sampled_from(["a", "b", 'q"uote', "new\nline"])), max_size=40))
def test_histograms_expose_what_the_library_exposes_for_any_values(observations):
    values = [v for v, _ in observations]
    labels = [label for _, label in observations]
    ours, theirs = histograms(_LATENCY_BUCKETS, values, labels)
    assert ours == theirs


def test_counters_expose_what_the_library_exposes():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopCounter("c", "doc", ["a", "b"], ours)
    lib = Counter("c", "doc", ["a", "b"], registry=theirs)
    for labels, amount in ((("x", "1"), 1.0), (("x", "1"), 2.5), (("y", "2"), 1.0)):
        mine.labels(*labels).inc(amount)
        lib.labels(*labels).inc(amount)
    assert _text(ours) == _text(theirs) and b'c_total{a="x",b="1"} 3.5' in _text(ours)
    with pytest.raises(ValueError):
        mine.labels("x", "1").inc(-1)
    with pytest.raises(ValueError):
        mine.labels("x")


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


def test_backend_events_count_under_the_deprecated_name_too():
    metrics = Metrics(CollectorRegistry())
    retry = metrics.backend_event("b", "retry")
    retry.inc()
    retry.inc()
    metrics.backend_event("b", "ejection").inc()
    for name in ("oip_gateway_backend_events_total", "oip_gateway_pool_events_total"):  # (the alias: docs/metrics.md)
        assert metrics.registry.get_sample_value(name, {"backend": "b", "event": "retry"}) == 2
        assert metrics.registry.get_sample_value(name, {"backend": "b", "event": "ejection"}) == 1
