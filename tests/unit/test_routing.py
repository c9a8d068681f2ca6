"""Route table and balancer: pure decisions, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.config.routes import Route
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
    t = RouteTable((Route("bert", "v2-backend", "2"), Route("bert", "default")))
    assert t.resolve("bert", "2").backend == "v2-backend"
    assert t.resolve("bert", "1").backend == "default"
    assert t.resolve("bert", "").backend == "default"


def test_unknown_model_and_version():
    t = RouteTable((Route("bert", "p", "2"),))
    with pytest.raises(ModelNotFound, match="nope"):
        t.resolve("nope")
    with pytest.raises(ModelNotFound, match="bert"):
        t.resolve("bert", "3")


def test_exact_lookup_does_not_scan_routes():
    """10,000 exact routes: resolution is a dict hit, so it never scans the glob list (whose
    results are all that fills the glob cache)."""
    routes = tuple(Route(f"model-{i}", "p") for i in range(10_000)) + (Route("*", "g"),)
    t = RouteTable(routes)
    assert t.resolve("model-9999").backend == "p"
    assert not t._cache
    assert t.resolve("other").backend == "g"
    assert len(t._cache) == 1
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
    inflight: int = 0

    @property
    def address(self) -> str:
        return self.name


def test_round_robin_rotates_over_the_candidates_it_is_given():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    rr = RoundRobin()
    firsts = [rr.order(eps)[0].name for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    # The backend passes only the endpoints that may take the request (live, model ready).
    for _ in range(6):
        order = rr.order([eps[0], eps[2]])
        assert {e.name for e in order} == {"a", "c"} and len(order) == 2
    assert rr.order([]) == []


def test_least_request_prefers_the_least_loaded_endpoint():
    eps = [Ep("a", inflight=3), Ep("b", inflight=1), Ep("c", inflight=2)]
    lr = LeastRequest()
    assert [e.name for e in lr.order(eps)] == ["b", "c", "a"]
    eps[1].inflight = 9
    assert [e.name for e in lr.order(eps)] == ["c", "a", "b"]


def test_least_request_ties_rotate():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    lr = LeastRequest()
    assert [lr.order(eps)[0].name for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_least_request_keeps_sequence_affinity():
    eps = [Ep("a"), Ep("b"), Ep("c")]
    lr, rr = LeastRequest(), RoundRobin()
    first = rr.order(eps, "seq-7")[0]
    first.inflight = 100  # loaded, but it holds the sequence's state
    assert lr.order(eps, "seq-7")[0] is first


def test_balancer_by_name():
    assert type(balancer("least_request")) is LeastRequest
    assert type(balancer("round_robin")) is RoundRobin
