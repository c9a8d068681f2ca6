"""Weighted splits, header routes and their route table (routing/split.py, routing/table.py)."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.routes import Mirror, Route, Side
from gateway.errors import ModelNotFound
from gateway.routing.split import WeightedSplit
from gateway.routing.table import RouteTable


@settings(max_examples=100)
@given(st.lists(st.integers(1, 100), min_size=2, max_size=5), st.integers(1, 3000))
def test_shares_are_exact_to_one_request(weights, n):
    split = WeightedSplit([f"p{i}" for i in range(len(weights))], weights)
    counts = Counter(split.choose(lambda _: True) for _ in range(n))
    total = sum(weights)
    for i, w in enumerate(weights):
        assert abs(counts[f"p{i}"] - n * w / total) <= len(weights)


def test_a_canary_is_spread_not_bursty():
    split = WeightedSplit(["main", "canary"], [95, 5])
    picks = [split.choose(lambda _: True) for _ in range(200)]
    gaps = [i for i, p in enumerate(picks) if p == "canary"]
    assert len(gaps) == 10 and all(b - a == 20 for a, b in itertools.pairwise(gaps))


def test_a_side_that_cannot_take_it_gives_its_share_to_the_others():
    split = WeightedSplit(["main", "canary"], [95, 5])
    assert {split.choose(lambda n: n == "main") for _ in range(100)} == {"main"}
    # Nobody can: every side stays eligible (the chosen backend says why).
    assert {split.choose(lambda _: False) for _ in range(100)} == {"main", "canary"}


def test_sequences_stay_on_one_side_and_shares_hold():
    split = WeightedSplit(["a", "b"], [3, 1])
    first = {f"seq{i}": split.choose(lambda _: True, f"seq{i}") for i in range(4000)}
    assert all(split.choose(lambda _: True, k) == v for k, v in first.items())
    share = sum(v == "b" for v in first.values()) / len(first)
    assert 0.22 < share < 0.28
    # "b" leaves: only its sequences move.
    moved = {k: split.choose(lambda n: n == "a", k) for k in first}
    assert all(moved[k] == "a" for k in first) and all(first[k] == moved[k] for k in first if first[k] == "a")


def test_header_routes_come_first_and_others_take_the_default():
    table = RouteTable((
        Route("m", "canary", headers=(("x-variant", "canary"),)),
        Route("m", "main", split=(Side("main", 9), Side("other", 1)), mirror=Mirror("shadow", 10)),
        Route("g*", "glob-canary", headers=(("x-variant", "canary"),)),
        Route("g*", "glob"),
    ))
    assert table.resolve("m", "", {"x-variant": "canary"}).backend == "canary"
    assert table.resolve("m", "", {"x-variant": "other"}).backend == "main"
    default = table.resolve("m", "")
    assert default.split is not None and default.split.names == ("main", "other")
    assert default.mirror == Mirror("shadow", 10)
    assert table.resolve("g1", "", {"x-variant": "canary"}).backend == "glob-canary"
    assert table.resolve("g1", "").backend == "glob"  # the glob cache holds both candidates
    assert table.resolve("g1", "", {"x-variant": "canary"}).backend == "glob-canary"


def test_a_model_whose_only_route_needs_a_header():
    table = RouteTable((Route("m", "canary", headers=(("x-variant", "canary"),)),))
    with pytest.raises(ModelNotFound):
        table.resolve("m", "")
