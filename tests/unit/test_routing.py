"""Route table and balancer: pure decisions, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.config.schema import Route
from gateway.errors import ModelNotFound
from gateway.routing import RoundRobin, RouteTable
from gateway.routing.balancer import LeastRequest, balancer


def test_exact_then_glob_in_order():
    t = RouteTable((
        Route("llm-*", "globs"),
        Route("resnet", "exact"),
        Route("res*", "never-for-resnet"),
        Route("*", "fallback"),
    ))
    assert t.resolve("resnet").backend == "exact"
    assert t.resolve("llm-7b").backend == "globs"
    assert t.resolve("resx").backend == "never-for-resnet"
    assert t.resolve("anything").backend == "fallback"
    assert t.resolve("llm-7b").label == "llm-*"


def test_versions_first_match_in_config_order():
    t = RouteTable((Route("bert", "v2pool", "2"), Route("bert", "default")))
    assert t.resolve("bert", "2").backend == "v2pool"
    assert t.resolve("bert", "1").backend == "default"
    assert t.resolve("bert", "").backend == "default"


def test_unknown_model_and_version():
    t = RouteTable((Route("bert", "p", "2"),))
    with pytest.raises(ModelNotFound, match="nope"):
        t.resolve("nope")
    with pytest.raises(ModelNotFound, match="bert"):
        t.resolve("bert", "3")


def test_exact_lookup_does_not_scan_routes():
    """10,000 exact routes: resolution is a dict hit, so it never touches the glob list."""
    routes = tuple(Route(f"model-{i}", "p") for i in range(10_000)) + (Route("*", "g"),)
    t = RouteTable(routes)
    t._globs = None  # type: ignore[assignment]  # any glob scan would now raise
    assert t.resolve("model-9999").backend == "p"
    assert len(t.exact_models) == 10_000


def test_glob_cache_is_bounded():
    t = RouteTable((Route("m-*", "p"),), cache_max=16)
    for i in range(1000):
        with pytest.raises(ModelNotFound):
            t.resolve(f"random-{i}")
    assert len(t._cache) <= 16


@dataclass
class Ep:
    name: str
    healthy: bool = True
    inflight: int = 0

    @property
    def address(self) -> str:
        return self.name


def test_round_robin_rotates_and_prefers_healthy():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    rr = RoundRobin(eps)
    firsts = [rr.order()[0].name for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    eps[1].healthy = False
    for _ in range(6):
        order = rr.order()
        assert order[0].name != "b" and order[-1].name == "b" and len(order) == 3


def test_round_robin_all_unhealthy_still_tries_all():
    eps = [Ep("a", False), Ep("b", False)]
    assert {e.name for e in RoundRobin(eps).order()} == {"a", "b"}


def test_least_request_prefers_the_least_loaded_healthy_endpoint():
    eps = [Ep("a", inflight=3), Ep("b", inflight=1), Ep("c", inflight=2)]
    lr = LeastRequest(eps)
    assert [e.name for e in lr.order()] == ["b", "c", "a"]
    eps[1].healthy = False  # unhealthy goes last whatever its load
    assert [e.name for e in lr.order()] == ["c", "a", "b"]


def test_least_request_ties_rotate():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    lr = LeastRequest(eps)
    assert [lr.order()[0].name for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_least_request_keeps_sequence_affinity():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    lr, rr = LeastRequest(eps), RoundRobin(eps)
    first = rr.order("seq-7")[0]
    first.inflight = 100  # loaded, but it holds the sequence's state
    assert lr.order("seq-7")[0] is first


def test_balancer_by_name():
    eps = [Ep("a")]
    assert type(balancer("least_request", eps)) is LeastRequest
    assert type(balancer("round_robin", eps)) is RoundRobin
