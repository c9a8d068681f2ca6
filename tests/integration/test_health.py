"""The background health checker against a real backend: bounded cost with many routes."""
from __future__ import annotations

import pytest

from gateway.config.schema import Backend, HostPort
from gateway.upstream import health as health_mod
from gateway.upstream.health import HealthChecker
from gateway.upstream.http import HttpPool


@pytest.fixture
def pool(reference):
    host, port = reference.http_url.split(":")
    return HttpPool(Backend("ref", "http", (HostPort(host, int(port)),)))


async def test_many_unready_routes_back_off(pool, monkeypatch):
    calls = []
    real = health_mod.endpoint_model_ready

    async def counting(p, ep, model, version, timeout):
        calls.append(model)
        return await real(p, ep, model, version, timeout)

    monkeypatch.setattr(health_mod, "endpoint_model_ready", counting)
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
    await pool.close()
