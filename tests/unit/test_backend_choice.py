"""Backend choice, safe retries, ejection and the endpoint set (backends/base.py), below the network:
``send`` callables are plain coroutines that return or raise Refused."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateway.backends.base import Backend
from gateway.backends.endpoints import Endpoint
from gateway.backends.refusal import Refused
from gateway.config.backends import BackendSpec, Outlier
from gateway.config.network import BackendTls, HostPort
from gateway.errors import GatewayError, ModelNotReady, NoEndpointAvailable, UpstreamError

A, B, C = HostPort("10.0.0.1", 8000), HostPort("10.0.0.2", 8000), HostPort("10.0.0.3", 8000)


class FakeEndpoint(Endpoint):
    def __init__(self, address: HostPort) -> None:
        super().__init__(address)
        self.load = 0
        self.closes = 0
        self.closed = asyncio.Event()

    def __repr__(self) -> str:
        return f"<ep {self.address}>"

    @property
    def inflight(self) -> int:
        return self.load

    async def close(self) -> None:
        self.closes += 1
        self.closed.set()


class FakeBackend(Backend[FakeEndpoint]):
    protocol = "http"

    def _make(self, address: HostPort) -> FakeEndpoint:
        return FakeEndpoint(address)


def spec(*endpoints: HostPort, **kw) -> BackendSpec:
    return BackendSpec(name="b", protocol="http", endpoints=endpoints or (A, B, C), **kw)


async def started(*endpoints: HostPort, **kw) -> tuple[FakeBackend, list[str]]:
    backend = FakeBackend(spec(*endpoints, **kw))
    events: list[str] = []
    backend.on_event = events.append
    await backend.start()
    return backend, events


def check(ep: FakeEndpoint, live: bool = True, *ready: str) -> None:
    """What a health round would write: liveness and a repository index."""
    ep.health.set_live(live)
    if live:
        ep.health.set_index([(m, "1", True) for m in ready] + [("loading", "1", False)])


def refuse(kind: str, message: str = "refused"):
    async def send(ep: FakeEndpoint):
        raise Refused(UpstreamError(message, http_status=503) if kind != Refused.NOT_READY
                      else ModelNotReady(message), kind=kind)
    return send


# -- candidates ----------------------------------------------------------------------

async def test_every_endpoint_is_a_candidate_before_any_check():
    backend, _ = await started()
    assert {ep.address for ep in backend.candidates("m", "")} == {A, B, C}


async def test_only_live_and_ready_endpoints_once_checked():
    backend, _ = await started()
    a, b, c = (backend.endpoints[x] for x in (A, B, C))
    check(a, True, "m")
    check(b, True, "other")
    check(c, False)
    for _ in range(5):
        assert backend.candidates("m", "") == [a]
        assert backend.candidates("m", "1") == [a]
    assert backend.candidates("other", "") == [b]


async def test_routed_model_ready_nowhere_is_not_ready():
    backend, _ = await started()
    for ep in backend.endpoints.values():
        check(ep, True, "other")
    backend.routed = frozenset({"m"})
    with pytest.raises(ModelNotReady) as info:
        backend.candidates("m", "")
    assert info.value.http_status == 503
    with pytest.raises(ModelNotReady):
        backend.candidates("loading", "")  # not routed, but an index lists it: not ready, not unknown


async def test_unknown_glob_routed_model_goes_to_live_endpoints():
    backend, _ = await started()
    a, b, c = (backend.endpoints[x] for x in (A, B, C))
    check(a, True, "other")
    check(b, True, "other")
    check(c, False)
    assert {ep.address for ep in backend.candidates("glob-model", "")} == {A, B}  # the servers' own 404


async def test_no_live_endpoint_tries_them_all():
    backend, _ = await started()
    for ep in backend.endpoints.values():
        check(ep, False)
    assert {ep.address for ep in backend.candidates("m", "")} == {A, B, C}


async def test_no_endpoints_at_all():
    backend = FakeBackend(BackendSpec(name="b", protocol="http", endpoints=(), dns=(HostPort("svc", 8000),)))
    await backend.start()  # the DNS name resolved to nothing yet
    with pytest.raises(NoEndpointAvailable):
        backend.candidates("m", "")
    with pytest.raises(NoEndpointAvailable):
        await backend.attempt("m", "", None, refuse(Refused.BUSY))


async def test_endpoint_back_up_takes_no_routed_traffic_until_checked():
    backend, _ = await started(A, B)
    a, b = backend.endpoints[A], backend.endpoints[B]
    backend.routed = frozenset({"m"})
    check(a, True, "m")
    b.health.set_live(True)  # the checker saw it live; its repository index is being fetched
    assert backend.candidates("m", "") == [a]


async def test_sequence_affinity_keeps_one_endpoint():
    backend, _ = await started()
    for ep in backend.endpoints.values():
        check(ep, True, "m")
    chosen = {key: backend.first("m", "", key) for key in ("s1", "s2", "s3", "s4")}
    for _ in range(5):
        for key, ep in chosen.items():
            assert backend.first("m", "", key) is ep


# -- attempt -------------------------------------------------------------------------

async def test_success_on_the_first_endpoint():
    backend, events = await started()
    seen: list[HostPort] = []

    async def send(ep: FakeEndpoint) -> str:
        seen.append(ep.address)
        return "ok"

    assert await backend.attempt("m", "", None, send) == "ok"
    assert len(seen) == 1 and events == []
    assert (backend.budget.active, backend.budget.retrying) == (0, 0)


async def test_transport_refusal_retried_once_and_endpoint_marked_down():
    backend, events = await started()
    for ep in backend.endpoints.values():
        check(ep, True, "m")
    seen: list[FakeEndpoint] = []

    async def send(ep: FakeEndpoint) -> str:
        seen.append(ep)
        if len(seen) == 1:
            raise Refused(UpstreamError("connection refused", http_status=502), kind=Refused.TRANSPORT)
        return "ok"

    assert await backend.attempt("m", "", None, send) == "ok"
    assert len(seen) == 2 and seen[0] is not seen[1]
    assert seen[0].health.live is False and seen[0].health.failures == 1
    assert seen[1].health.live is True
    assert events == ["retry"]
    assert seen[0] not in backend.candidates("m", "")
    assert (backend.budget.active, backend.budget.retrying) == (0, 0)


async def test_only_one_retry_by_default_and_the_last_error_is_raised():
    backend, events = await started()
    seen: list[FakeEndpoint] = []
    errors = [UpstreamError(f"busy {i}", http_status=503) for i in range(3)]

    async def send(ep: FakeEndpoint):
        seen.append(ep)
        raise Refused(errors[len(seen) - 1], kind=Refused.BUSY)

    with pytest.raises(UpstreamError) as info:
        await backend.attempt("m", "", None, send)
    assert info.value is errors[1] and len(seen) == 2 and events == ["retry"]
    assert all(ep.health.live is None for ep in seen)  # BUSY marks nothing


async def test_not_ready_refusal_marks_the_model_on_that_endpoint():
    backend, _ = await started(A, B)
    a, b = backend.endpoints[A], backend.endpoints[B]
    check(a, True, "m", "n")
    check(b, True, "m", "n")
    seen: list[FakeEndpoint] = []

    async def send(ep: FakeEndpoint) -> str:
        seen.append(ep)
        if len(seen) == 1:
            raise Refused(ModelNotReady("unknown model"), kind=Refused.NOT_READY)
        return "ok"

    assert await backend.attempt("m", "1", None, send) == "ok"
    first, second = seen
    assert backend.candidates("m", "1") == [second]
    assert first in backend.candidates("n", "1") and first.health.live is True


@pytest.mark.parametrize("kw", [{"retries": 0}, {}], ids=["retries-0", "not-resendable"])
async def test_no_retry(kw):
    backend, events = await started(**kw)
    calls = []

    async def send(ep: FakeEndpoint):
        calls.append(ep)
        raise Refused(UpstreamError("refused", http_status=502), kind=Refused.TRANSPORT)

    with pytest.raises(UpstreamError):
        await backend.attempt("m", "", None, send, resendable=(lambda: True) if kw else (lambda: False))
    assert len(calls) == 1 and events == []


async def test_more_retries_go_to_distinct_endpoints():
    backend, events = await started(retries=5)
    calls: list[FakeEndpoint] = []

    async def send(ep: FakeEndpoint):
        calls.append(ep)
        raise Refused(UpstreamError("busy", http_status=503), kind=Refused.BUSY)

    with pytest.raises(UpstreamError):
        await backend.attempt("m", "", None, send)
    assert len(calls) == 3 and len(set(map(id, calls))) == 3  # three endpoints, each once
    assert events == ["retry", "retry"]


async def test_retry_budget_exhausted():
    backend, events = await started()
    backend.budget.retrying = backend.budget.min_concurrency  # other requests are retrying already
    calls = []

    async def send(ep: FakeEndpoint):
        calls.append(ep)
        raise Refused(UpstreamError("busy", http_status=503), kind=Refused.BUSY)

    with pytest.raises(UpstreamError):
        await backend.attempt("m", "", None, send)
    assert len(calls) == 1 and events == ["retry_budget_exhausted"]
    assert (backend.budget.active, backend.budget.retrying) == (0, backend.budget.min_concurrency)


async def test_budget_counts_requests_in_flight_and_retries():
    backend, _ = await started()
    during: list[tuple[int, int]] = []

    async def send(ep: FakeEndpoint) -> str:
        during.append((backend.budget.active, backend.budget.retrying))
        if len(during) == 1:
            raise Refused(UpstreamError("busy", http_status=503), kind=Refused.BUSY)
        return "ok"

    await backend.attempt("m", "", None, send)
    assert during == [(1, 0), (1, 1)]
    assert (backend.budget.active, backend.budget.retrying) == (0, 0)


async def test_consecutive_transport_failures_eject():
    backend, events = await started(A, B, outlier=Outlier(consecutive_failures=2, base_ejection_s=30.0))
    a = backend.endpoints[A]
    backend.transport_failed(a)
    assert a.health.ejected_until is None and events == []
    backend.transport_failed(a, live=False)
    assert a.health.ejected_until is not None and a.health.live is False
    assert events == ["ejection"]


async def test_ejection_through_attempt_in_panic():
    backend, events = await started(A, B, outlier=Outlier(consecutive_failures=2, base_ejection_s=30.0), retries=0)
    b_calls = 0

    async def send(ep: FakeEndpoint) -> str:
        nonlocal b_calls
        if ep.address == A:
            raise Refused(UpstreamError("connection refused", http_status=502), kind=Refused.TRANSPORT)
        b_calls += 1
        return "ok"

    for _ in range(4):  # nothing checked: both are tried in turn (panic routing)
        try:
            await backend.attempt("m", "", None, send)
        except UpstreamError:
            pass
    assert events == ["ejection"] and b_calls == 2
    assert backend.endpoints[A].health.ejected_until is not None


async def test_lone_endpoint_is_never_ejected():
    backend, events = await started(A, outlier=Outlier(consecutive_failures=1))
    for _ in range(5):
        backend.transport_failed(backend.endpoints[A])
    assert backend.endpoints[A].health.ejected_until is None and events == []


# -- refusal -------------------------------------------------------------------------

async def test_refusal_of_a_model_the_checker_saw_ready():
    backend, _ = await started(A)
    a = backend.endpoints[A]
    check(a, True, "m")
    unknown = UpstreamError("Request for unknown model: 'm' is not found", http_status=400)
    refused = backend.refusal(a, "m", "1", unknown, resendable=True)
    assert isinstance(refused, Refused) and refused.kind == Refused.NOT_READY
    assert isinstance(refused.error, ModelNotReady)
    assert a.health.ready_exactly("m", "1")  # marked by attempt() when it catches the Refused
    final = backend.refusal(a, "m", "1", unknown, resendable=False)
    assert isinstance(final, ModelNotReady) and not a.health.ready_exactly("m", "1")


async def test_other_errors_are_relayed_as_they_are():
    backend, _ = await started(A)
    a = backend.endpoints[A]
    check(a, True, "m")
    bad_input = UpstreamError("input 'x' has wrong shape", http_status=400)
    assert backend.refusal(a, "m", "1", bad_input, resendable=True) is bad_input
    unknown = GatewayError("unknown model 'g'")
    assert backend.refusal(a, "g", "", unknown, resendable=True) is unknown  # the checker never saw it ready


# -- endpoint set --------------------------------------------------------------------

async def test_dns_addresses_add_and_retire_endpoints():
    backend = FakeBackend(BackendSpec(name="b", protocol="http", endpoints=(A,), dns=(HostPort("svc", 8000),)))
    kicks: list[int] = []
    backend.on_new_endpoints = lambda: kicks.append(len(backend.endpoints))
    backend.set_dns_addresses([B])  # before start: remembered, not applied
    assert backend.endpoints == {} and kicks == []
    await backend.start()
    assert set(backend.endpoints) == {A, B} and kicks == [2]
    b = backend.endpoints[B]
    backend.set_dns_addresses([B, C])
    assert set(backend.endpoints) == {A, B, C} and kicks == [2, 3] and backend.endpoints[B] is b
    backend.set_dns_addresses([C, A])  # A is static anyway; B is gone
    assert set(backend.endpoints) == {A, C} and kicks == [2, 3]
    await asyncio.wait_for(b.closed.wait(), 5)
    await asyncio.sleep(0)  # one more loop turn: a second close would have been scheduled by now
    assert b.closes == 1 and all(ep.closes == 0 for ep in backend.endpoints.values())


async def test_retire_closes_every_endpoint_once_in_the_background():
    backend, _ = await started()
    eps = list(backend.endpoints.values())
    backend.retire()
    assert backend.endpoints == {}
    await asyncio.wait_for(asyncio.gather(*(ep.closed.wait() for ep in eps)), 5)
    assert [ep.closes for ep in eps] == [1, 1, 1]


async def test_adopt_keeps_endpoints_and_their_health():
    old, _ = await started(A, B)
    a = old.endpoints[A]
    check(a, True, "m")
    health = a.health
    new = FakeBackend(spec(A, C, timeout_s=5.0, retries=2))  # request settings may change
    new.adopt(old)
    await new.start()
    assert new.endpoints[A] is a and a.health is health
    assert set(new.endpoints) == {A, C} and set(old.endpoints) == {B}
    assert new.candidates("m", "") == [a]


@pytest.mark.parametrize("change", [{"tls": BackendTls()}, {"protocol": "grpc"}, {"max_connections": 8}])
async def test_adopt_refuses_other_transport_settings(change):
    old, _ = await started(A)
    a = old.endpoints[A]
    new = FakeBackend(dataclasses.replace(old.spec, **change))
    new.adopt(old)
    await new.start()
    assert new.endpoints[A] is not a and old.endpoints[A] is a
