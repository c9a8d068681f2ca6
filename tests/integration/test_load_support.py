"""tests/support/load.py against real servers: the reference V2 server, a scripted HTTP backend
that answers wrongly, and a listener that never answers."""
from __future__ import annotations

import time

from tests.support.load import OK, Load
from tests.support.scripted import ScriptedHttp


def test_200_requests_over_both_transports_all_succeed(reference) -> None:
    with Load(http_url=reference.http_url, grpc_url=reference.grpc_url, models=["add_sub"], max_requests=200) as load:
        summary = load.wait_done(timeout=60)
    assert (summary.sent, summary.completed, summary.succeeded, summary.failed) == (200, 200, 200, 0), summary.report()
    assert summary.per_transport["http"]["ok"] > 0 and summary.per_transport["grpc"]["ok"] > 0, summary.report()
    assert summary.per_model == {"add_sub": {"ok": 200, "failed": 0}}
    assert 0 < summary.max_ok_latency < 10 and summary.max_failed_latency == 0
    assert all(r.ok and r.message == "" for r in load.records())


def test_unknown_model_counts_as_failures_with_status_and_code(reference) -> None:
    models = ["add_sub", "no_such_model"]
    with Load(http_url=reference.http_url, grpc_url=reference.grpc_url, models=models, max_requests=40) as load:
        summary = load.wait_done(timeout=60)
    assert summary.per_model == {"add_sub": {"ok": 20, "failed": 0}, "no_such_model": {"ok": 0, "failed": 20}}, (
        summary.report()
    )
    outcomes = {(g.transport, g.outcome) for g in summary.failures}
    assert outcomes in ({("http", "404"), ("grpc", "NOT_FOUND")}, {("http", "400"), ("grpc", "NOT_FOUND")}), (
        summary.report()
    )
    assert all("no_such_model" in g.message for g in summary.failures), summary.report()
    assert "NOT_FOUND" in load.report() and "no_such_model" in load.report()


def test_models_can_change_while_running(reference) -> None:
    urls = {"http_url": reference.http_url, "grpc_url": reference.grpc_url}
    with Load(**urls, models=["no_such_model"], max_seconds=60) as load:
        load.wait_requests(10, timeout=30)
        load.set_models(["add_sub"])
        switched = time.monotonic()
        load.wait_requests(20, timeout=30, ok_only=True)
        load.stop()
    assert load.summary().per_model["no_such_model"]["failed"] >= 10
    after = load.summary(since=switched)
    assert after.failed == 0 and after.succeeded >= 20 and set(after.per_model) == {"add_sub"}, after.report()
    assert not load.running


def test_a_wrong_answer_is_a_failure() -> None:
    wrong = b'{"model_name":"add_sub","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[16],"data":%s}]}' % (
        str([0.5] * 16).encode()
    )
    backend = ScriptedHttp(lambda line, headers, body: wrong)
    try:
        with Load(http_url=backend.address, models=["add_sub"], http_concurrency=2, max_requests=6) as load:
            summary = load.wait_done(timeout=30)
    finally:
        backend.close()
    assert summary.failed == 6 and [g.outcome for g in summary.failures] == ["WRONG_ANSWER"], summary.report()


def test_a_hung_server_times_out_and_the_latency_shows(black_hole) -> None:
    with Load(http_url=black_hole, grpc_url=black_hole, models=["add_sub"], http_concurrency=1, grpc_concurrency=1,
              max_requests=2, timeout_s=0.5, slow_s=0.4) as load:
        summary = load.wait_done(timeout=30)
    assert summary.failed == 2 and {g.outcome for g in summary.failures} == {"TIMEOUT"}, summary.report()
    assert summary.slow == 2 and 0.5 <= summary.max_failed_latency < 5, summary.report()
    assert all(r.outcome != OK for r in load.records())
