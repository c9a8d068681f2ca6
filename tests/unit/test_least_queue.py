"""least_queue: Triton's pending counts read from its metrics text, and the balancer that
uses them (power of two choices on queue + in flight; least-request where none is known)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from gateway.codec.queue_metrics import parse_pending
from gateway.routing.balancer import LeastQueue, balancer

PAGE = b"""# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 12
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 3
nv_inference_pending_request_count{model="m",version="2"} 4
nv_inference_pending_request_count{model="we\\"ird",version="1"} 1
nv_inference_pending_request_count{version="1"} 9
nv_inference_pending_request_count{model="bad",version="1"} not-a-number
nv_inference_pending_request_count{model="n",version="1"} 0"""


def test_pending_counts_per_version_and_summed():
    got = parse_pending(PAGE)
    assert got[("m", "1")] == 3 and got[("m", "2")] == 4 and got[("m", "")] == 7
    assert got.get(("n", "1"), 0.0) == 0  # (a zero count is left out: the balancer reads it as none)
    assert ('we\\"ird', "1") in got
    assert not any(k[0] == "bad" for k in got)


@given(st.lists(st.tuples(st.sampled_from(["m", "n", "x y"]), st.sampled_from(["", "1", "2"]),
                          st.sampled_from(["0", "0.0", "00", "0.00", "1", "10", "2.5", "0.5", "-1", "NaN", "+Inf",
                                           "1e3", "0 1700000000", "0\r", "010"])), max_size=8))
def test_only_counts_above_zero_are_kept_and_summed(lines):
    """Against a plain reading of every line: the fast path that skips zero counts keeps exactly
    the counts above zero, summed per version and over versions."""
    page = b"\n".join(b'nv_inference_pending_request_count{model="%s",version="%s"} %s'
                      % (m.encode(), v.encode(), value.encode()) for m, v, value in lines)
    want: dict[tuple[str, str], float] = {}
    for m, v, value in lines:
        count = float(value.split()[0])
        if count > 0:
            want[(m, v)] = want.get((m, v), 0.0) + count
            if v:
                want[(m, "")] = want.get((m, ""), 0.0) + count
    assert parse_pending(page) == want


@given(st.binary(max_size=300))
@example(b" ")
@example(b" 0")
@example(b"} 0\r")
def test_any_page_parses_or_is_skipped(page):
    parse_pending(page)
    parse_pending(b"nv_inference_pending_request_count{" + page)


@dataclass(eq=False)
class Ep:
    address: str
    inflight: int = 0
    queue: dict | None = None


def test_the_shorter_queue_wins():
    fast, slow = Ep("fast", queue={("m", ""): 0.0}), Ep("slow", queue={("m", ""): 5.0})
    lb = LeastQueue(seed=1)
    assert Counter(lb.order([fast, slow], None, ("m", ""))[0].address for _ in range(100)) == {"fast": 100}
    # The gateway's own requests in flight count too (when above Triton's count: fresher).
    fast.inflight = 6
    assert Counter(lb.order([fast, slow], None, ("m", ""))[0].address for _ in range(100)) == {"slow": 100}
    # Not added to Triton's count, which already includes ours waiting there.
    slow.inflight = 5
    fast.inflight = 4
    assert Counter(lb.order([fast, slow], None, ("m", ""))[0].address for _ in range(100)) == {"fast": 100}


def test_no_metrics_means_least_request_and_sequences_stay():
    a, b = Ep("a", inflight=3), Ep("b", inflight=1)
    lb = balancer("least_queue")
    assert {lb.order([a, b], None, ("m", ""))[0].address for _ in range(50)} == {"b"}
    first = lb.order([a, b], "seq-1", ("m", ""))[0]
    assert all(lb.order([a, b], "seq-1", ("m", ""))[0] is first for _ in range(20))


def test_power_of_two_spreads_a_burst_over_equal_endpoints():
    eps = [Ep(f"e{i}", queue={}) for i in range(8)]
    lb = LeastQueue(seed=7)
    picks = Counter(lb.order(eps, None, ("m", ""))[0].address for _ in range(800))
    assert len(picks) == 8 and all(n > 40 for n in picks.values())
    # Every candidate is still in the order (retries go on to them).
    assert sorted(e.address for e in lb.order(eps, None, ("m", ""))) == sorted(e.address for e in eps)
