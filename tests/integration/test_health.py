"""The background health checker against a real backend: per-endpoint model readiness,
bounded cost with many routes when there is no repository index."""
from __future__ import annotations

import pytest

from gateway.config.schema import Backend, HostPort
from gateway.routing.readiness import Ready
from gateway.upstream.health import HealthChecker
from gateway.upstream.http import HttpPool


def _pool(url: str, **kw) -> HttpPool:
    host, port = url.split(":")
    return HttpPool(Backend("ref", "http", (HostPort(host, int(port)),), **kw))


@pytest.fixture
def pool(reference):
    return _pool(reference.http_url, repository_index=False)


async def test_many_unready_routes_back_off(pool):
    calls: list[str] = []
    real = pool.check_model

    async def counting(ep, model, version, timeout):
        calls.append(model)
        return await real(ep, model, version, timeout)

    pool.check_model = counting  # type: ignore[method-assign]
    routes = [("add_sub", None, "ref")] + [(f"missing-{i}", None, "ref") for i in range(500)]
    checker = HealthChecker({"ref": pool}, routes, interval_s=1, timeout_s=2, recheck_per_round=16)
    per_round = []
    for _ in range(12):
        calls.clear()
        await checker.check_once()
        per_round.append(len(calls))
    await pool.close()
    assert not checker.ready and len(checker.not_ready) == 500
    assert per_round[0] == 501  # everything once, at first
    # Unready routes back off exponentially: later rounds probe a fraction of them.
    assert max(per_round[8:]) < 100, per_round
    assert sum(per_round) < 12 * 501 / 3, per_round


async def test_ready_when_every_exact_route_is_ready(pool):
    checker = HealthChecker({"ref": pool}, [("add_sub", None, "ref"), ("string_reverse", "1", "ref")],
                            interval_s=1, timeout_s=2)
    assert await checker.check_once() is True
    assert checker.not_ready == []
    ep = next(iter(pool.endpoints.values()))
    assert ep.health.ready_for("add_sub", "") == Ready.YES
    assert ep.health.ready_for("string_reverse", "1") == Ready.YES
    await pool.close()


async def test_unreachable_endpoint_is_not_live_and_takes_no_traffic(reference, black_hole):
    host, port = reference.http_url.split(":")
    bh_host, bh_port = black_hole.split(":")
    pool = HttpPool(Backend("ref", "http", (HostPort(host, int(port)), HostPort(bh_host, int(bh_port))),
                            repository_index=False))
    checker = HealthChecker({"ref": pool}, [("add_sub", None, "ref")], interval_s=1, timeout_s=0.3)
    assert await checker.check_once() is True
    good, hung = pool.endpoints.values()
    assert good.health.live is True and hung.health.live is False
    assert pool.candidates("add_sub", "") == [good]
    await pool.close()
