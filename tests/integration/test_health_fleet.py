"""The control plane at fleet size, against a fake fleet on real sockets (tests/support/fakefleet.py):
real HttpBackends, HealthChecker rounds driven one by one (check_once), least_queue's QueueScraper
passes, and the gateway's gauges through a real gateway process.

What is proven: identical repository-index answers are parsed once and share one Index; a round
that changes nothing parses nothing and does not recompute readiness; per-endpoint differences,
models coming and going, endpoints dying and returning are followed exactly; the per-model
fallback stays within its budget per backend and round; stop() mid-round leaves nothing
unawaited; queue scraping is bounded, logs failures with a reason and recovery once."""
from __future__ import annotations

import asyncio
import gc
import http.client
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.backends import queue as queue_module
from gateway.backends.health import HealthChecker
from gateway.backends.http import HttpBackend
from gateway.backends.queue import CONCURRENCY, QueueScraper
from gateway.config.backends import BackendSpec, QueueMetrics
from gateway.config.network import HostPort
from gateway.errors import ModelNotReady
from gateway.routing.readiness import Ready
from tests.support.fakefleet import FakeFleet, index_entries, metrics_page
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

MODELS = [f"model-{i:05d}" for i in range(10_000)]


def _backend(fleet: FakeFleet, **kw: Any) -> HttpBackend:
    return HttpBackend(BackendSpec("fleet", "http", tuple(HostPort("127.0.0.1", p) for p in fleet.ports), **kw))


def _routes(models: list[str]) -> list[tuple[str, None, str]]:
    return [(m, None, "fleet") for m in models]


def _counting_parse(backend: HttpBackend) -> list[int]:
    """Wrap the backend's parse_index: one entry (the answer's size) per parse."""
    parsed: list[int] = []
    real = backend.parse_index

    def counting(raw: bytes | bytearray) -> Any:
        parsed.append(len(raw))
        return real(raw)

    backend.parse_index = counting  # type: ignore[method-assign]
    return parsed


async def _until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    """procs.wait_for (bounded), polled from a thread so this loop runs meanwhile (the answer
    waited for arrives on it)."""
    await asyncio.to_thread(wait_for, predicate, timeout=timeout, what=what)


def _excluded(backend: HttpBackend, ep: Any, model: str) -> bool:
    """``ep`` takes no request for ``model``: not among the candidates (or none may take it)."""
    try:
        return ep not in backend.candidates(model, "")
    except ModelNotReady:
        return True


@pytest.fixture
def big_fleet() -> Iterator[FakeFleet]:
    with FakeFleet(20, index_entries(MODELS)) as fleet:
        yield fleet


# -- one index per distinct answer, and nothing recomputed when nothing moved ---------------

async def test_identical_indexes_are_parsed_once_and_shared(big_fleet):
    backend = _backend(big_fleet)
    parsed = _counting_parse(backend)
    # timeout_s generous: 20 answers of ~700 kB each on a shared machine must not go late (a late
    # answer is applied on its own, which is not what this test looks at).
    checker = HealthChecker({"fleet": backend}, _routes(MODELS), interval_s=1, timeout_s=10)
    eps = list(backend.endpoints.values())
    try:
        assert await checker.check_once() is True
        shared = eps[0].health.index
        assert shared is not None and len(shared.ready_names) == 10_000
        assert all(ep.health.index is shared for ep in eps)
        assert big_fleet.total("index") == 20 and len(parsed) == 1
        assert len(checker._indexes) == 1
        states, generation = checker.route_states, backend.generation
        assert len(states) == 10_000 and all(states.values())

        assert await checker.check_once() is True
        assert big_fleet.total("index") == 40  # every endpoint asked again ...
        assert len(parsed) == 1  # ... and its answer compared, not parsed
        assert checker.route_states is states  # readiness not recomputed
        assert backend.generation == generation
        assert all(ep.health.index is shared for ep in eps)
    finally:
        await checker.stop()
        await backend.close()


async def test_one_endpoint_differs_then_all_then_none(big_fleet):
    backend = _backend(big_fleet)
    parsed = _counting_parse(backend)
    checker = HealthChecker({"fleet": backend}, _routes(MODELS), interval_s=1, timeout_s=10)
    eps = list(backend.endpoints.values())
    flaky, odd = MODELS[1234], 7
    try:
        assert await checker.check_once() is True
        shared = eps[0].health.index
        states = checker.route_states

        # One model unavailable on one endpoint: that endpoint alone gets an index of its own.
        big_fleet.set_index(index_entries(MODELS, unavailable=[flaky]), ports=[odd])
        assert await checker.check_once() is True
        own = eps[odd].health.index
        assert own is not None and own is not shared
        assert all(ep.health.index is shared for i, ep in enumerate(eps) if i != odd)
        assert len(parsed) == 2 and len(checker._indexes) == 2
        assert checker.not_ready == [] and checker.route_states[(flaky, "fleet")] is True  # others have it
        assert checker.route_states is not states  # something moved: recomputed
        assert eps[odd].health.ready_for(flaky, "") == Ready.NO
        assert eps[odd].health.ready_for(MODELS[0], "") == Ready.YES
        assert all(ep.health.ready_for(flaky, "") == Ready.YES for i, ep in enumerate(eps) if i != odd)
        chosen = backend.candidates(flaky, "")
        assert eps[odd] not in chosen and len(chosen) == 19
        assert len(backend.candidates(MODELS[0], "")) == 20

        # Unavailable everywhere: the same bytes as the odd endpoint's, so its index is now everyone's
        # (found by bytes, not parsed again) and the first one, held by none, is dropped.
        big_fleet.set_index(index_entries(MODELS, unavailable=[flaky]))
        assert await checker.check_once() is False
        assert checker.not_ready == [flaky]
        assert checker.route_states[(flaky, "fleet")] is False and checker.route_states[(MODELS[0], "fleet")]
        with pytest.raises(ModelNotReady):
            backend.candidates(flaky, "")
        assert all(ep.health.index is own for ep in eps)
        assert len(parsed) == 2 and len(checker._indexes) == 1

        # READY everywhere again: parsed once more (the first index was dropped), shared by all.
        big_fleet.set_index(index_entries(MODELS))
        assert await checker.check_once() is True
        assert checker.not_ready == [] and checker.route_states[(flaky, "fleet")] is True
        again = eps[0].health.index
        assert again is not own and all(ep.health.index is again for ep in eps)
        assert len(parsed) == 3 and len(checker._indexes) == 1
        assert len(backend.candidates(flaky, "")) == 20
    finally:
        await checker.stop()
        await backend.close()


async def test_routed_models_appearing_and_disappearing():
    models = MODELS[:200]
    with FakeFleet(4, index_entries(models)) as fleet:
        backend = _backend(fleet)
        checker = HealthChecker({"fleet": backend}, _routes(models + ["newcomer"]), interval_s=1, timeout_s=5)
        eps = list(backend.endpoints.values())
        try:
            assert await checker.check_once() is False
            assert checker.not_ready == ["newcomer"]
            with pytest.raises(ModelNotReady):  # routed, on no endpoint: "not ready", not the servers' 404
                backend.candidates("newcomer", "")

            fleet.set_index(index_entries(models + ["newcomer"]), ports=[2])  # one endpoint is enough
            assert await checker.check_once() is True
            assert backend.candidates("newcomer", "") == [eps[2]]

            fleet.set_index(index_entries(models + ["newcomer"]))
            assert await checker.check_once() is True
            assert len(backend.candidates("newcomer", "")) == 4
            assert checker.route_states[("newcomer", "fleet")] is True

            fleet.set_index(index_entries(models))  # removed everywhere
            assert await checker.check_once() is False
            assert checker.not_ready == ["newcomer"] and checker.route_states[("newcomer", "fleet")] is False
            with pytest.raises(ModelNotReady):
                backend.candidates("newcomer", "")
            assert len(backend.candidates(models[0], "")) == 4  # the rest untouched
        finally:
            await checker.stop()
            await backend.close()


# -- an endpoint dies and comes back ----------------------------------------------------------

async def test_an_endpoint_dies_and_returns():
    models = MODELS[:1000]
    with FakeFleet(3, index_entries(models)) as fleet:
        backend = _backend(fleet)
        parsed = _counting_parse(backend)
        # The returning endpoint's index, delayed 1 s, is late (past timeout_s 0.5) but answered
        # (within timeout_s + interval_s, 2.5 s).
        checker = HealthChecker({"fleet": backend}, _routes(models), interval_s=2, timeout_s=0.5)
        eps = list(backend.endpoints.values())
        dead = eps[1]
        try:
            assert await checker.check_once() is True
            shared = eps[0].health.index

            fleet.close_port(1)
            for n in (1, 2):  # below unhealthy_threshold (3): still up, what is known of it stays
                assert await checker.check_once() is True
                assert dead.health.live is True and dead.health.check_failures == n
                assert dead.health.index is shared
            assert await checker.check_once() is True  # the others still serve every model
            assert dead.health.live is False and dead.health.index is None
            assert all(_excluded(backend, dead, m) for m in (models[0], models[-1]))
            assert len(backend.candidates(models[0], "")) == 2
            assert len(checker._indexes) == 1

            # Back, its index slow to come: live, but nothing of it is ready until the index is read
            # (a returning endpoint is a new process).
            fleet.delay("index", 1.0, ports=[1])
            fleet.open_port(1)
            assert await checker.check_once() is True
            assert dead.health.live is True and dead.health.index is None and not dead.health.models_checked
            assert dead.health.ready_for(models[0], "") == Ready.NO
            assert _excluded(backend, dead, models[0])
            assert checker.late_calls() == 1
            await _until(lambda: checker.late_calls() == 0, "the late index answer")
            assert dead.health.index is shared  # the same bytes as the others': their Index, not parsed
            assert len(parsed) == 1
            assert dead in backend.candidates(models[0], "") and dead in backend.candidates(models[-1], "")
            fleet.delay("index", 0.0, ports=[1])
            assert await checker.check_once() is True and dead.health.index is shared
        finally:
            await checker.stop()
            await backend.close()


# -- per-model fallback: within its budget per backend and round -----------------------------

async def test_fallback_is_bounded_per_round_and_reaches_every_model():
    n, budget = 3, 1000
    models = [f"route-{i:04d}" for i in range(3000)]
    with FakeFleet(n, index_entries(models)) as fleet:
        fleet.refuse_index(400)
        backend = _backend(fleet)
        checker = HealthChecker({"fleet": backend}, _routes(models), interval_s=1, timeout_s=10,
                                fallback_per_round=budget)
        eps = list(backend.endpoints.values())
        known: list[set[str]] = [set() for _ in range(n)]
        per_round: list[int] = []
        try:
            for _ in range(20):
                before = [len(fleet.asked_of(i)) for i in range(n)]
                await checker.check_once()
                asked = [fleet.asked_of(i)[before[i]:] for i in range(n)]
                per_round.append(sum(map(len, asked)))
                assert per_round[-1] <= budget, per_round
                for i, ep in enumerate(eps):
                    assert ep.health.index is None
                    new = {m for m in asked[i] if m not in known[i]}
                    if len(new) < len(asked[i]):  # a model asked again: only once none is left unasked
                        assert known[i] | new == set(models), f"endpoint {i} re-asked before asking all"
                    known[i] |= new
                    unasked = [m for m in models if m not in known[i]]
                    if unasked:  # its models not all asked: no traffic for those not asked
                        assert not ep.health.models_checked
                        assert ep.health.ready_for(unasked[0], "") == Ready.NO
                        assert _excluded(backend, ep, unasked[0])
                if all(ep.health.models_checked for ep in eps):
                    break
            assert all(k == set(models) for k in known), per_round
            assert all(ep.health.models_checked for ep in eps), per_round
            assert per_round[0] == budget
            assert checker.ready and checker.not_ready == []

            fleet.refuse_index(None)  # the index answers again: the next round uses it
            calls = fleet.total("model_ready")
            assert await checker.check_once() is True
            assert all(ep.health.index is not None for ep in eps)
            assert all(ep.health.index is eps[0].health.index for ep in eps)
            assert await checker.check_once() is True
            assert fleet.total("model_ready") == calls  # no per-model calls any more
        finally:
            await checker.stop()
            await backend.close()


async def test_an_endpoint_that_loses_its_index_takes_no_traffic_for_models_not_asked():
    models = [f"route-{i:04d}" for i in range(3000)]
    with FakeFleet(2, index_entries(models)) as fleet:
        backend = _backend(fleet)
        checker = HealthChecker({"fleet": backend}, _routes(models), interval_s=1, timeout_s=10,
                                fallback_per_round=500)
        eps = list(backend.endpoints.values())
        try:
            assert await checker.check_once() is True
            fleet.refuse_index(400, ports=[0])
            for _ in range(3):  # unhealthy_threshold rounds without an index: per-model calls from the third
                assert await checker.check_once() is True
            lost = eps[0]
            assert lost.health.index is None and 0 < fleet.count(0, "model_ready") <= 500
            asked = set(fleet.asked_of(0))
            unasked = next(m for m in models if m not in asked)
            assert lost.health.ready_for(unasked, "") == Ready.NO
            assert not lost.health.models_checked
            assert _excluded(backend, lost, unasked)
        finally:
            await checker.stop()
            await backend.close()


# -- shutdown mid-round --------------------------------------------------------------------------

def test_stop_mid_round_leaves_nothing_unawaited(caplog):
    """A loop of its own, closed as it is: asyncio.run would cancel and await whatever is left,
    hiding a call stop() did not await; here such a call is found pending, then destroyed."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    with FakeFleet(2, index_entries(["a", "b"])) as fleet:
        fleet.delay("index", 30.0, ports=[1])  # far beyond the round: in flight when stop() comes

        async def scenario() -> list[asyncio.Task[Any]]:
            backend = _backend(fleet)
            real = backend.check_index_raw

            async def index(ep: Any, timeout: float) -> bytes | bytearray | None:
                # The real call, whose cancellation takes a few loop turns to end (a gRPC call's
                # does): stop() must wait for that end, not only ask for it.
                try:
                    return await real(ep, timeout)
                except asyncio.CancelledError:
                    for _ in range(3):
                        await asyncio.sleep(0)
                    raise

            backend.check_index_raw = index  # type: ignore[method-assign]
            checker = HealthChecker({"fleet": backend}, _routes(["a", "b"]), interval_s=0.5, timeout_s=5)
            checker.start()
            await _until(lambda: fleet.count(1, "index") == 1, "the slow index call in flight")
            await checker.stop()
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
            assert checker.late_calls() == 0
            await backend.close()
            return left

        loop = asyncio.new_event_loop()
        with warnings.catch_warnings(record=True) as seen:
            # Recorded, not turned into errors: a coroutine's "never awaited" is warned from its
            # finalizer, where an error would only be printed.
            warnings.simplefilter("always")
            try:
                left = loop.run_until_complete(scenario())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
            del loop
            gc.collect()
    assert left == []
    assert [str(w.message) for w in seen if "never awaited" in str(w.message)] == []
    assert "Task was destroyed but it is pending" not in caplog.text


# -- least_queue scraping ------------------------------------------------------------------------

def _queue_backend(fleet: FakeFleet, interval_s: float = 0.5, timeout_s: float = 0.4) -> HttpBackend:
    """least_queue over the fleet, each endpoint's metrics on its own port (metrics_ports). Its
    scrape timeout is min(4 × interval_s, timeout_s, 2 s) = timeout_s here."""
    eps = tuple(HostPort("127.0.0.1", p) for p in fleet.ports)
    return HttpBackend(BackendSpec("fleet", "http", eps, balance="least_queue", timeout_s=timeout_s,
                                   queue_metrics=QueueMetrics(interval_s=interval_s),
                                   metrics_ports=tuple((ep, ep.port) for ep in eps)))


async def test_queue_counts_skip_zeros():
    with FakeFleet(2) as fleet:
        fleet.set_metrics(metrics_page({("a", "1"): 3, ("a", "2"): 0, ("b", "1"): 0, ("c", "1"): 1.5}), ports=[0])
        fleet.set_metrics(metrics_page({("a", "1"): 0, ("b", "1"): 0.0}), ports=[1])
        backend = _queue_backend(fleet)
        scraper = QueueScraper(backend)
        first, second = backend.endpoints.values()
        try:
            await scraper.scrape_once()
            assert first.queue == {("a", "1"): 3.0, ("a", ""): 3.0, ("c", "1"): 1.5, ("c", ""): 1.5}
            assert second.queue == {}
        finally:
            await scraper.stop()
            await backend.close()


async def test_queue_pages_of_endpoints_down_are_not_read_until_they_are_up():
    with FakeFleet(3) as fleet:
        fleet.set_metrics(metrics_page({("a", "1"): 2}))
        backend = _queue_backend(fleet)
        scraper = QueueScraper(backend)
        first, down, third = backend.endpoints.values()
        try:
            await scraper.scrape_once()
            assert down.queue == {("a", "1"): 2.0, ("a", ""): 2.0}
            down.health.checked(False, 1, 1)  # the health checks took it down
            await scraper.scrape_once()
            assert [fleet.count(i, "metrics") for i in range(3)] == [2, 1, 2]
            assert down.queue is None and first.queue == third.queue == {("a", "1"): 2.0, ("a", ""): 2.0}
            down.health.checked(True, 1, 1)
            await scraper.scrape_once()
            assert fleet.count(1, "metrics") == 2 and down.queue == {("a", "1"): 2.0, ("a", ""): 2.0}
        finally:
            await scraper.stop()
            await backend.close()


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "oip_gateway.queue" and text in r.getMessage()]


async def test_queue_failures_are_logged_with_a_reason_and_recovery_once(caplog):
    caplog.set_level(logging.INFO, logger="oip_gateway.queue")
    with FakeFleet(1) as fleet:
        fleet.set_metrics(metrics_page({("a", "1"): 2}))
        backend = _queue_backend(fleet, timeout_s=0.4)
        scraper = QueueScraper(backend)
        (ep,) = backend.endpoints.values()

        async def passes(good: bool, n: int = 1) -> None:
            fleet.set_metrics(metrics_page({("a", "1"): 2}) if good else 500)
            for _ in range(n):
                await scraper.scrape_once()
                assert (ep.queue is not None) is good

        try:
            await passes(True)
            fleet.delay("metrics", 1.5)  # beyond the 0.4 s scrape timeout
            await scraper.scrape_once()
            assert ep.queue is None
            (failure,) = _logged(caplog, "unreadable")
            assert "(no answer within 0.4s)" in failure, failure
            fleet.delay("metrics", 0.0)

            await passes(True, 2)  # fewer than 3 good reads: not said yet
            await passes(False)  # fails again: already said, not said twice
            await passes(True, 2)
            assert _logged(caplog, "readable again") == [] and len(_logged(caplog, "unreadable")) == 1
            await passes(True)  # the third good read in a row
            assert len(_logged(caplog, "readable again")) == 1
            await passes(True, 3)
            assert len(_logged(caplog, "readable again")) == 1

            await passes(False)  # a new failure after recovery is said again, with its reason
            failures = _logged(caplog, "unreadable")
            assert len(failures) == 2 and "(metrics answered 500)" in failures[1], failures
            assert all("()" not in m for m in failures)
        finally:
            await scraper.stop()
            await backend.close()


async def test_queue_scrapes_at_most_concurrency_pages_at_once():
    with FakeFleet(30) as fleet:
        fleet.set_metrics(metrics_page({("a", "1"): 1}))
        fleet.delay("metrics", 0.1)  # held long enough for every pass slot to be taken
        backend = _queue_backend(fleet, timeout_s=5)
        scraper = QueueScraper(backend)
        try:
            await scraper.scrape_once()
            assert fleet.total("metrics") == 30
            assert fleet.metrics_peak == CONCURRENCY  # reached, never passed
            assert all(ep.queue == {("a", "1"): 1.0, ("a", ""): 1.0} for ep in backend.endpoints.values())
        finally:
            await scraper.stop()
            await backend.close()


async def test_queue_wait_after_a_pass_is_interval_or_its_work_over_the_share(monkeypatch):
    """A pass's CPU time comes from a stub thread clock around each page's read (one reader: the
    calls alternate; two endpoints, each half the pass: 0.05 s beside start-up, then 0.01, 0.02,
    0.001 s); the waits asked of asyncio.sleep by the scraper's loop between passes are recorded
    (and kept short; a reader's pause between pages is not one of them)."""
    works = iter([w / 2 for w in (0.05, 0.01, 0.02, 0.001) for _ in range(2)])
    monkeypatch.setattr(queue_module, "CONCURRENCY", 1)
    clock = {"t": 0.0, "start": True}
    waits: list[float] = []
    real_time, real_sleep = queue_module.time, asyncio.sleep

    class Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_time, name)

        def thread_time(self) -> float:  # called before and after each page's read
            if not clock["start"]:
                clock["t"] += next(works, 0.001)
            clock["start"] = not clock["start"]
            return clock["t"]

    class Asyncio:
        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(seconds: float) -> None:
            if seconds != queue_module.PACE_S:
                waits.append(seconds)
            await real_sleep(0.01)

    monkeypatch.setattr(queue_module, "time", Time())
    monkeypatch.setattr(queue_module, "asyncio", Asyncio())
    with FakeFleet(2) as fleet:
        backend = _queue_backend(fleet, interval_s=0.2)
        scraper = QueueScraper(backend)
        try:
            scraper.start()
            await _until(lambda: len(waits) >= 4, "four passes of the scraper")
        finally:
            await scraper.stop()
            await backend.close()
    assert fleet.total("metrics") >= 8
    # The first pass (start-up's work counted with it) is followed by interval_s; then the least
    # of the last three passes' work decides: 0.01 s at 2 % of a core is 0.5 s per pass in all,
    # 0.49 s of it waiting (twice: 0.02 s is not the least), then 0.001 s: interval_s.
    share = 0.01 / queue_module.SHARE - 0.01
    assert waits[:4] == pytest.approx([0.2, share, share, 0.2])


# -- the gauges, through a real gateway ---------------------------------------------------------

_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def _gauges(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in ("oip_gateway_route_ready", "oip_gateway_endpoint_healthy"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def _status(url: str, path: str) -> int:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_gauges_follow_models_and_endpoints_through_a_gateway(tmp_path):
    models = [f"m-{i:02d}" for i in range(50)]
    with FakeFleet(3, index_entries(models)) as fleet:
        cfg = gateway_config({"fleet": {"protocol": "http", "endpoints": fleet.addresses}},
                             [{"model": m, "backend": "fleet"} for m in models],
                             health={"interval_s": 0.3, "timeout_s": 0.5})
        with GatewayProcess(cfg, tmp_path, "gw-fleet") as g:
            def route(model: str) -> float | None:
                return _gauges(g.metrics_url).get(
                    ("oip_gateway_route_ready", frozenset({("route", model), ("backend", "fleet")})))

            def healthy(address: str) -> float | None:
                return _gauges(g.metrics_url).get(
                    ("oip_gateway_endpoint_healthy", frozenset({("backend", "fleet"), ("endpoint", address)})))

            def state() -> tuple[list[float | None], list[float | None], bool]:
                """(route_ready per model, endpoint_healthy per endpoint, the gateway ready)."""
                return [route(m) for m in models], [healthy(a) for a in fleet.addresses], \
                    _status(g.http_url, "/v2/health/ready") == 200

            everything = ([1.0] * 50, [1.0] * 3, True)
            wait_for(lambda: state() == everything, timeout=30, what="every route and endpoint up")

            flaky = models.index("m-07")
            down = [1.0] * 50
            down[flaky] = 0.0
            fleet.set_index(index_entries(models, unavailable=["m-07"]))
            wait_for(lambda: state() == (down, [1.0] * 3, False), timeout=30, what="m-07 not ready anywhere")
            fleet.set_index(index_entries(models))
            wait_for(lambda: state() == everything, timeout=30, what="m-07 ready again")

            fleet.close_port(2)
            wait_for(lambda: state() == ([1.0] * 50, [1.0, 1.0, 0.0], True), timeout=30,
                     what="the dead endpoint's gauge at 0, the routes still served")
            fleet.open_port(2)
            wait_for(lambda: state() == everything, timeout=30, what="the endpoint back")
