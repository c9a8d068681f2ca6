"""The proxy's inferences served from callbacks, without a coroutine: :meth:`Proxy.infer_http_now`
and :meth:`Proxy.infer_grpc_now` (dataplane.py ``DataPlane``). A route to one backend that can
send the request at once takes these; anything else returns None and goes the awaited way
(proxy.py ``infer_http`` / ``infer_grpc``)."""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from .dataplane import Again, AnswerSink, GrpcOutcome, HttpReply, Pending, Plan
from .headers import metadata_map, pick_headers
from .observability.access import AccessRecord
from .observability.metrics import RouteLabel
from .routing.table import STATEFUL, Match

if TYPE_CHECKING:
    from .proxy import Proxy

__all__ = ["grpc_now", "http_now"]


def http_now(proxy: Proxy, plan: Plan, model: str, version: str, body: bytes | bytearray | memoryview,
             headers: Mapping[str, str], record: AccessRecord | None,
             done: Callable[[HttpReply | Exception | None], None]) -> RouteLabel | None:
    """:meth:`Proxy.infer_http` without a coroutine for a whole, uncompressed body whose plan
    says it can be (``now``), when the backend can send it at once (``HttpBackend.infer_http_now``:
    a kept-alive connection free): the answer, or the error ``infer_http`` would raise,
    goes to ``done`` from the backend connection's callbacks; ``done(None)``: send it again
    through ``infer_http`` (nothing was answered). Returns the request's (route, backend)
    label, or None when nothing was done (await ``infer_http`` instead). Raises what
    admission raises."""
    match: Match = plan.route
    backend = proxy.routing.backends[match.backend]
    holds = backend.holds
    held = holds is not None and (backend.placer is not None or match.hold_s > 0)
    if held:
        assert holds is not None
        if not holds.ready(model, version):
            return None  # it waits for its model: infer_http holds it
    size = len(body) * plan.cost
    admission = proxy.admission
    admission.enter(size)
    start = time.perf_counter()
    timer = proxy.metrics.upstream_timer(backend.name)

    def answered(result: HttpReply | Exception | None) -> None:
        admission.leave(size)
        if held:
            holds.leave(model, match.label)  # type: ignore[union-attr]
        if result is not None:
            timer.observe(time.perf_counter() - start)
            if isinstance(result, Exception):
                proxy.record_failure(backend, result)
        done(result)

    if held:
        holds.enter(model, match.label)  # type: ignore[union-attr]
    try:
        taken = backend.infer_http_now(model, version, body, headers, proxy.http_forwarded, record, answered)
    except Exception as exc:
        if held:
            holds.leave(model, match.label)  # type: ignore[union-attr]
        admission.leave(size)
        timer.observe(time.perf_counter() - start)
        proxy.record_failure(backend, exc)
        raise
    if not taken:
        if held:
            holds.leave(model, match.label)  # type: ignore[union-attr]
        admission.leave(size)
        return None
    return match.label, match.backend


def grpc_now(proxy: Proxy, message: bytes, model: str, version: str, timeout: float | None, affinity: str | None,
             metadata: Sequence[tuple[str, str]], sink: AnswerSink | None, record: AccessRecord | None,
             done: Callable[[GrpcOutcome], None]) -> tuple[RouteLabel, Pending] | None:
    """:meth:`Proxy.infer_grpc` without a coroutine (DataPlane.infer_grpc_now), for a route to one
    backend with no split, mirror or hold whose backend sends it at once
    (``GrpcBackend.infer_grpc_now``). Its routing is ``infer_grpc``'s, without ROUTED: a
    context variable set here would outlive the request (the connection's context), so the
    label is returned instead."""
    routing = proxy.routing
    match = routing.table.resolve(model, version, metadata_map(metadata) if routing.table.by_headers else None)
    if match.split is not None or match.mirror is not None or match.hold_s:
        return None
    backend = routing.backends[match.backend]
    if not backend.serves_grpc_now or backend.placer is not None:
        return None
    if match.stateful is not STATEFUL.get():
        STATEFUL.set(match.stateful)
    size = len(message) * backend.grpc_cost(False)
    admission = proxy.admission
    admission.enter(size)
    trace = pick_headers(metadata, proxy.context_headers) if metadata else ()
    timer = proxy.metrics.upstream_timer(backend.name)
    start = time.perf_counter()

    def answered(result: GrpcOutcome) -> None:
        admission.leave(size)
        if not isinstance(result, Again):  # (an Again is timed by the awaited path that sends it)
            timer.observe(time.perf_counter() - start)
            if isinstance(result, Exception):
                proxy.record_failure(backend, result)
        done(result)

    try:
        pending = backend.infer_grpc_now(message, model, version, timeout, affinity, trace, sink, record, answered)
    except Exception as exc:
        admission.leave(size)
        timer.observe(time.perf_counter() - start)
        proxy.record_failure(backend, exc)
        raise
    if pending is None:
        admission.leave(size)
        return None
    return (match.label, match.backend), pending
