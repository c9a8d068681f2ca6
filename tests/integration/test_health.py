"""The background health checker against a real backend: per-endpoint model readiness,
bounded cost with many routes when there is no repository index."""
from __future__ import annotations

import asyncio
import http.client
import time

import pytest

from gateway.backends.health import HealthChecker
from gateway.backends.http import HttpBackend
from gateway.config.backends import BackendSpec
from gateway.config.network import HostPort
from gateway.routing.readiness import Ready
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.slowhealth import SlowHealthBackend


def _backend(url: str, **kw) -> HttpBackend:
    host, port = url.split(":")
    return HttpBackend(BackendSpec("ref", "http", (HostPort(host, int(port)),), **kw))


@pytest.fixture
def backend(reference):
    return _backend(reference.http_url, repository_index=False)


async def test_many_unready_routes_back_off(backend):
    calls: list[str] = []
    real = backend.check_model

    async def counting(ep, model, version, timeout):
        calls.append(model)
        return await real(ep, model, version, timeout)

    backend.check_model = counting  # type: ignore[method-assign]
    routes = [("add_sub", None, "ref")] + [(f"missing-{i}", None, "ref") for i in range(500)]
    checker = HealthChecker({"ref": backend}, routes, interval_s=1, timeout_s=2, recheck_per_round=16)
    per_round = []
    for _ in range(12):
        calls.clear()
        await checker.check_once()
        per_round.append(len(calls))
    await backend.close()
    assert not checker.ready and len(checker.not_ready) == 500
    assert per_round[0] == 501  # everything once, at first
    # Unready routes back off exponentially: later rounds probe a fraction of them.
    assert max(per_round[8:]) < 100, per_round
    assert sum(per_round) < 12 * 501 / 3, per_round


async def test_ready_when_every_exact_route_is_ready(backend):
    checker = HealthChecker({"ref": backend}, [("add_sub", None, "ref"), ("string_reverse", "1", "ref")],
                            interval_s=1, timeout_s=2)
    assert await checker.check_once() is True
    assert checker.not_ready == []
    ep = next(iter(backend.endpoints.values()))
    assert ep.health.ready_for("add_sub", "") == Ready.YES
    assert ep.health.ready_for("string_reverse", "1") == Ready.YES
    await backend.close()


async def test_unreachable_endpoint_is_not_live_and_takes_no_traffic(reference, black_hole):
    host, port = reference.http_url.split(":")
    bh_host, bh_port = black_hole.split(":")
    backend = HttpBackend(BackendSpec("ref", "http", (HostPort(host, int(port)), HostPort(bh_host, int(bh_port))),
                            repository_index=False))
    checker = HealthChecker({"ref": backend}, [("add_sub", None, "ref")], interval_s=1, timeout_s=0.3)
    assert await checker.check_once() is True
    good, hung = backend.endpoints.values()
    assert good.health.live is True and hung.health.live is False
    assert backend.candidates("add_sub", "") == [good]
    await backend.close()


# -- thresholds: a slow round is not a failure, three failed ones take an endpoint out ---

SLOW_TIMEOUT = 0.3  # a call later than this is late; one later than + interval (0.8 s) fails


async def _settled(checker: HealthChecker, timeout: float = 10.0) -> None:
    """Wait (bounded) until no late check call is running: its answer has been taken."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while checker.late_calls():
        assert loop.time() < deadline, "a late health check never ended"
        await asyncio.sleep(0.01)


@pytest.fixture
def slow():
    with SlowHealthBackend(models=("m",)) as backend:
        yield backend


async def test_a_slow_round_is_not_a_failure_and_three_failed_ones_take_it_out(slow):
    backend = _backend(slow.address)
    checker = HealthChecker({"ref": backend}, [("m", None, "ref")], interval_s=0.5, timeout_s=SLOW_TIMEOUT)
    (ep,) = backend.endpoints.values()
    infer = b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[1]}]}'

    async def serving() -> None:
        assert checker.ready and ep.health.usable() and backend.candidates("m", "") == [ep]
        reply = await backend.request("POST", "/v2/models/m/infer", "m", "", body=infer)
        assert reply.status == 200

    try:
        assert await checker.check_once() is True
        await serving()
        slow.set("live", delay=SLOW_TIMEOUT / 2)  # slow, within the timeout
        assert await checker.check_once() is True
        assert checker.late_calls() == 0 and ep.health.check_failures == 0
        await serving()
        for _ in range(3):  # past the timeout, but answered: late, taken when it comes, never a failure
            slow.set("live", delay=SLOW_TIMEOUT + 0.2)
            assert await checker.check_once() is True
            assert checker.late_calls() == 1  # the round went on without it
            await serving()
            await _settled(checker)
            assert ep.health.check_failures == 0
            await serving()
        slow.set("live", delay=5.0)  # no answer at all, once: one failed check, nothing more
        assert await checker.check_once() is True
        await _settled(checker)
        assert ep.health.check_failures == 1 and ep.health.live is True
        await serving()
        slow.set("live")
        assert await checker.check_once() is True
        assert ep.health.check_failures == 0  # a good check starts the count again

        slow.set("live", status=503)  # failing checks, answered at once, and no traffic between them
        for n in (1, 2):  # (traffic that succeeds would be evidence of its own: the count would restart)
            assert await checker.check_once() is True
            assert ep.health.check_failures == n
            assert checker.ready and ep.health.usable()  # still serving
        assert await checker.check_once() is False  # the third in a row takes it out
        assert ep.health.live is False and not ep.health.usable()
        assert checker.not_ready == ["m"]

        slow.set("live")  # back: one good check (healthy_threshold 1), its models checked in the same round
        assert await checker.check_once() is True
        await serving()
    finally:
        await checker.stop()
        await backend.close()


async def test_a_missing_index_keeps_the_last_one_until_the_threshold(slow):
    backend = _backend(slow.address)
    checker = HealthChecker({"ref": backend}, [("m", None, "ref")], interval_s=0.5, timeout_s=SLOW_TIMEOUT)
    (ep,) = backend.endpoints.values()
    try:
        assert await checker.check_once() is True
        assert ep.health.names == frozenset({"m"})
        slow.set("index", delay=SLOW_TIMEOUT + 0.2)  # late, then taken
        assert await checker.check_once() is True
        await _settled(checker)
        assert ep.health.names == frozenset({"m"}) and ep.health.index_misses == 0
        slow.set("index", status=500)
        before = slow.count("model_ready", "received")
        for _ in range(2):
            assert await checker.check_once() is True
            assert ep.health.names == frozenset({"m"})  # the last index known stays
        assert slow.count("model_ready", "received") == before  # and no per-model calls meanwhile
        assert await checker.check_once() is True  # the third round: per-model calls decide
        assert ep.health.names is None and ep.health.per_model == {("m", ""): True}
        slow.set("index")
        assert await checker.check_once() is True
        assert ep.health.names == frozenset({"m"})
    finally:
        await checker.stop()
        await backend.close()


async def test_a_new_endpoint_is_decided_by_its_first_check_even_a_late_one(slow):
    slow.set("live", delay=SLOW_TIMEOUT + 0.2)
    backend = _backend(slow.address)
    checker = HealthChecker({"ref": backend}, [("m", None, "ref")], interval_s=0.5, timeout_s=SLOW_TIMEOUT)
    (ep,) = backend.endpoints.values()
    try:
        assert await checker.check_once() is False
        assert ep.health.live is False  # late on its first check: down, at once
        await _settled(checker)
        assert ep.health.live is True  # the late answer is a good check (healthy_threshold 1) ...
        assert not checker.ready and ep.health.ready_for("m", "") == Ready.NO  # ... models not checked yet
        slow.set("live")
        assert await checker.check_once() is True
    finally:
        await checker.stop()
        await backend.close()


async def test_traffic_that_succeeds_keeps_an_endpoint_up(slow):
    backend = _backend(slow.address)
    checker = HealthChecker({"ref": backend}, [("m", None, "ref")], interval_s=0.5, timeout_s=SLOW_TIMEOUT)
    (ep,) = backend.endpoints.values()
    infer = b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[1]}]}'
    try:
        assert await checker.check_once() is True
        slow.set("live", status=503)
        for _ in range(6):
            assert await checker.check_once() is True
            reply = await backend.request("POST", "/v2/models/m/infer", "m", "", body=infer)
            assert reply.status == 200  # evidence of liveness: the failed checks are cleared
        assert ep.health.live is True
    finally:
        await checker.stop()
        await backend.close()


# -- the same through a real gateway process: readiness and the gauge do not flap --------

def _get(url: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("POST" if body is not None else "GET", path, body=body,
                     headers={"content-type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _healthy(g: GatewayProcess, address: str) -> float | None:
    """oip_gateway_endpoint_healthy of ``address``, None before the gauge has it."""
    _, text = _get(g.metrics_url, "/metrics")
    for line in text.decode().splitlines():
        if line.startswith("oip_gateway_endpoint_healthy{") and f'endpoint="{address}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


INFER = b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[1]}]}'


def test_gateway_stays_ready_through_slow_health_rounds_and_three_failures_take_it_out(tmp_path):
    # Backend "p": A serves model a only, B serves b only. Ready needs a on A; a request for a can
    # go to A only (were A out, B is live and does not list a: 503, no panic routing to A).
    with SlowHealthBackend(models=("a",)) as a, SlowHealthBackend(models=("b",)) as b:
        cfg = gateway_config({"p": {"protocol": "http", "endpoints": [a.address, b.address]}},
                             [{"model": "a", "backend": "p"}, {"model": "b", "backend": "p"}],
                             health={"interval_s": 0.5, "timeout_s": 0.5})
        with GatewayProcess(cfg, tmp_path, "gw-slowhealth") as g:
            wait_for(lambda: _get(g.http_url, "/v2/health/ready")[0] == 200, timeout=30, what="gateway ready")
            wait_for(lambda: _healthy(g, a.address) == 1.0, timeout=30, what="A's gauge")

            def serving() -> None:
                """Ready, A's gauge 1, and an inference for a answered by A."""
                assert _get(g.http_url, "/v2/health/ready")[0] == 200
                assert _healthy(g, a.address) == 1.0
                before = a.inferences
                status, body = _get(g.http_url, "/v2/models/a/infer", INFER)
                assert status == 200, body
                assert a.inferences == before + 1

            def through(delay: float, checks: int, what: str) -> None:
                """The next ``checks`` live checks A receives wait ``delay`` s; serving all along."""
                a.set("live", delay=delay)
                start = a.count("live", "received")
                deadline = time.monotonic() + 30
                while a.count("live", "received") < start + checks:
                    assert time.monotonic() < deadline, f"{what}: not enough health checks reached A"
                    serving()

            through(0.3, 3, "slow within the timeout")
            through(0.8, 3, "late past the timeout, answered")  # taken when it comes: no failure
            through(3.0, 1, "past every limit, once")  # one failed check (at 1 s), only one
            through(0.0, 4, "fast again")  # (the failed one is counted, then cleared, meanwhile)
            deadline = time.monotonic() + 30
            while a.count("live", "abandoned") < 1:  # (A notices the gateway gave up when its 3 s are over)
                assert time.monotonic() < deadline, "the gateway never gave up on the 3 s check"
                serving()
            assert a.count("live", "abandoned") == 1 and a.failed_answers == 0

            # Failed checks answered at once: up while fewer than three have been answered,
            # then out. (A gateway answer read between two equal counts saw at most that many.)
            a.set("live", status=503)
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "three failed checks did not take A out"
                n = a.failed_answers
                ready = _get(g.http_url, "/v2/health/ready")[0]
                healthy = _healthy(g, a.address)
                if a.failed_answers == n and n < 3:
                    assert ready == 200 and healthy == 1.0, f"out after {n} failed checks"
                if ready != 200 and healthy == 0.0:
                    break
            assert a.failed_answers >= 3
            status, body = _get(g.http_url, "/v2/models/a/infer", INFER)
            assert status == 503 and b"not ready" in body, body

            a.set("live")  # back: ready again once a check has seen it live and its model ready
            wait_for(lambda: _get(g.http_url, "/v2/health/ready")[0] == 200, timeout=30, what="ready again")
            serving()
