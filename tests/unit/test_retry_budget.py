"""The retry budget (routing/retry.py) and the balancers' ordering contract (routing/balancer.py)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from gateway.routing.balancer import LeastRequest, RoundRobin, balancer
from gateway.routing.retry import RetryBudget


def test_budget_floor_allows_min_concurrency_retries_when_idle():
    b = RetryBudget(percent=20.0, min_concurrency=3)
    for retrying, allowed in [(0, True), (2, True), (3, False), (4, False)]:
        b.retrying = retrying
        assert b.allows() is allowed, retrying


@pytest.mark.parametrize(
    ("percent", "active", "max_retrying"),
    [(20.0, 100, 20), (20.0, 101, 21), (50.0, 10, 5), (100.0, 40, 40), (20.0, 10, 3)],
)
def test_budget_is_a_share_of_requests_in_flight(percent, active, max_retrying):
    b = RetryBudget(percent=percent, min_concurrency=3)
    b.active = active
    b.retrying = max_retrying - 1
    assert b.allows()
    b.retrying = max_retrying
    assert not b.allows()


def test_budget_defaults():
    b = RetryBudget()
    assert (b.percent, b.min_concurrency, b.active, b.retrying) == (20.0, 3, 0, 0)


@dataclass
class Ep:
    address: str
    inflight: int = 0


EPS = [Ep(f"10.0.0.{i}:8001") for i in range(4)]


def test_round_robin_orders_are_rotations_of_all_candidates():
    rr = RoundRobin()
    for _ in range(9):
        order = rr.order(EPS)
        start = EPS.index(order[0])
        assert order == EPS[start:] + EPS[:start]  # the retry order covers every candidate once


def test_single_or_no_candidate():
    for b in (RoundRobin(), LeastRequest()):
        assert b.order([]) == []
        assert b.order(EPS[:1]) == EPS[:1]
        assert b.order(EPS[:1], "seq") == EPS[:1]


def test_affinity_ignores_the_candidates_order_and_rotation():
    rr = RoundRobin()
    first = rr.order(EPS, "seq-42")
    assert sorted(first, key=EPS.index) == EPS  # a permutation: the rest are retry targets
    for perm in itertools.permutations(EPS):
        assert rr.order(list(perm), "seq-42") == first


def test_affinity_key_wins_over_load_in_least_request():
    lr = LeastRequest()
    chosen = lr.order(EPS, "k")[0]
    chosen.inflight = 1000
    try:
        assert lr.order(EPS, "k")[0] is chosen
        assert lr.order(EPS)[0] is not chosen
    finally:
        chosen.inflight = 0


def test_least_request_puts_loaded_endpoints_last():
    eps = [Ep("a", 5), Ep("b", 0), Ep("c", 5), Ep("d", 1)]
    lr = LeastRequest()
    for _ in range(4):
        loads = [e.inflight for e in lr.order(eps)]
        assert loads == sorted(loads) and len(loads) == 4


def test_unknown_balance_name_falls_back_to_round_robin():
    # BackendSpec validates the name; the factory itself never fails.
    assert type(balancer("round_robin")) is RoundRobin
    assert type(balancer("least_request")) is LeastRequest
    assert type(balancer("random")) is RoundRobin
