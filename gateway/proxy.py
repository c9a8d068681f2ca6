"""The gateway's data plane: route → pick a backend → call → answer. No transport code.

The proxy reads one :class:`Routing` snapshot per request (route table, backends), so a
config reload swaps the whole snapshot in one assignment while requests in flight
finish on the backends they started on. Everything protocol-specific — pass-through,
conversion, endpoint choice, retries — is the backend's (``backends/base.py``): the
proxy never asks what kind of backend it holds.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from . import __version__
from .admission import Admission
from .backends.base import Backend
from .backends.health import HealthChecker
from .backends.http import http_affinity
from .backends.mirror import Mirrors
from .codec.repository import BackendIndexEntry
from .dataplane import (
    CLIENTS_FAULT,
    AnswerSink,
    DataPlane,
    GrpcOutcome,
    HttpReply,
    IncomingBody,
    Pending,
    Plan,
    StreamedMessage,
)
from .errors import ModelNotFound, NoEndpointAvailable
from .fleet import Fleet
from .headers import TRACE_HEADERS, metadata_map, pick_headers
from .holding import hold, holding, placed_again
from .observability.access import AccessRecord
from .proxynow import grpc_now, http_now
from .proxystream import proxy_stream
from .observability.metrics import UNROUTED, Metrics, RouteLabel
from .routing.table import STATEFUL, Match
from .security.guard import Gate, guard_for
from .snapshot import ROUTED, Routing

__all__ = ["EXTENSIONS", "Proxy"]

T = TypeVar("T")

# What works end to end through the gateway, on every client × backend path, in Triton's
# spelling (spec "Server Metadata": the extensions field; Triton's own list, core
# server.cc): the binary tensor extension, parameters, sequences (sequence_id keeps a
# sequence on one endpoint), the model repository (index merged over the fleet, load and
# unload with unload_dependents on every endpoint of the backend), model configuration,
# statistics (summed over endpoints), trace and logging settings. Not listed: shared memory
# (no network hop has it), classification and schedule_policy (their parameters pass
# through but are not proven here).
EXTENSIONS = ["binary_tensor_data", "parameters", "sequence", "model_repository",
              "model_repository(unload_dependents)", "model_configuration", "statistics", "trace", "logging"]

# Request headers that matter to a V2 backend; everything else (host,
# content-length, connection) belongs to the hop and is not forwarded.
_FORWARDED = ("content-type", "inference-header-content-length", "content-encoding", "accept-encoding")


class Proxy(DataPlane):
    """Implements :class:`gateway.dataplane.DataPlane` by forwarding to backends."""

    def __init__(self, routing: Routing, health: HealthChecker, metrics: Metrics, auto_inflight: int = 0) -> None:
        self.routing = routing
        self.health = health
        self.metrics = metrics
        # Set on SIGTERM when drain_s > 0: "not ready" while still serving.
        self.draining = False
        config = routing.config
        self.admission = Admission(config.max_inflight_bytes, metrics.inflight_bytes, auto_inflight, metrics.track)
        # Shadow traffic (routes' ``mirror``): copies sent in the background, answers dropped.
        self.mirrors = Mirrors(lambda: self.routing.backends, metrics.mirror_requests, metrics.mirror_inflight)
        self.limit = config.max_message_bytes
        # Client headers / gRPC metadata passed on to backends, on every path.
        self.context_headers = frozenset(TRACE_HEADERS) | frozenset(config.forward_headers)
        self.http_forwarded = (*_FORWARDED, *sorted(self.context_headers))
        # Who may call what, and how often (security/guard.py); None: an open gateway.
        self.gate = Gate(guard_for(config, routing.table))
        self.fleet = Fleet(lambda: self.routing, self.timed)

    def swap(self, routing: Routing) -> None:
        """A reload: new requests route with ``routing``; those in flight keep theirs.
        Admission and forwarded headers change with it (the message size limit is the
        listeners', fixed until a restart)."""
        config = routing.config
        self.admission.configure(config.max_inflight_bytes)
        self.context_headers = frozenset(TRACE_HEADERS) | frozenset(config.forward_headers)
        self.http_forwarded = (*_FORWARDED, *sorted(self.context_headers))
        self.gate.current = guard_for(config, routing.table, self.gate.current)
        self.routing = routing

    # -- server-level answers are the gateway's own ------------------------------
    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return self.health.ready and not self.draining

    def server_metadata(self) -> dict[str, Any]:
        config = self.routing.config
        return {"name": config.server_name or "oip-gateway", "version": config.server_version or __version__,
                "extensions": list(EXTENSIONS)}

    def v1_settings(self) -> Any:
        """The config's ``v1`` section (first-generation API bridge), as of now: reloads apply."""
        return self.routing.config.v1

    def route_label(self, model: str, version: str) -> RouteLabel:
        """(route pattern, backend) for the metrics: bounded by the config, never a client's
        string. The backend this request went to when it was routed (a split's side, a header
        route), else the default route's."""
        chosen = ROUTED.get()
        if chosen is not None:
            return chosen
        try:
            match = self.routing.table.resolve(model, version)
        except Exception:
            return UNROUTED
        return match.label, match.backend

    async def timed(self, backend: Backend[Any], call: Awaitable[T]) -> T:
        """Await a backend call, recording its duration and any failure under the backend's name."""
        start = time.perf_counter()
        try:
            return await call
        except Exception as exc:
            self.record_failure(backend, exc)
            raise
        finally:
            self.metrics.upstream_timer(backend.name).observe(time.perf_counter() - start)

    def record_failure(self, backend: Backend[Any], exc: Exception) -> None:
        if not isinstance(exc, CLIENTS_FAULT):
            # (A bad request, or the client left while its body streamed: not the backend's failure.)
            self.metrics.upstream_errors.labels(backend.name, type(exc).__name__).inc()

    # -- model-level answers come from an endpoint of the routed backend -----------
    async def model_ready(self, model: str, version: str) -> bool:
        try:
            backend = self.routing.backend(model, version)
        except ModelNotFound:
            # A readiness probe gets "not ready", as Triton answers for a model it
            # does not have (HTTP 400, gRPC ready=false) — not an error.
            return False
        return await self.timed(backend, backend.model_ready(model, version))

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        backend, match = self.routing.pick(model, version)
        if backend.placer is not None or match.hold_s:
            await hold(backend, match, model, version)  # (a client's first call, before inference)
        return await self.timed(backend, backend.model_metadata(model, version))

    # -- the fleet: repository, per-model extensions, settings (fleet.py) ----------
    async def repository_index(self, ready_only: bool) -> list[BackendIndexEntry]:
        return await self.fleet.repository_index(ready_only)

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        return await self.fleet.repository_http(action, model, body, headers)

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        return await self.fleet.repository_grpc(rpc, model, message, timeout, metadata)

    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        return await self.fleet.model_extension_http(model, version, what)

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        return await self.fleet.model_extension_grpc(rpc, message, model, version, timeout)

    async def settings(self, kind: str, model: str, request: tuple[str, bytes | None], update: bool) -> bytes:
        return await self.fleet.settings(kind, model, request, update)

    # -- inference --------------------------------------------------------------
    def plan_http(self, model: str, version: str, headers: Mapping[str, str]) -> Plan:
        """The route of an HTTP inference, its admission cost (the dearest of its backends: a
        split's side is chosen later, from the body's sequence_id), and whether it can be
        served from callbacks: one backend that serves so, no split, no mirror."""
        routing = self.routing
        match = routing.table.resolve(model, version, headers)
        if match.stateful is not STATEFUL.get():
            STATEFUL.set(match.stateful)
        binary = "inference-header-content-length" in headers
        if match.split is None:
            backend = routing.backends[match.backend]
            return Plan(match, backend.http_cost(binary), backend.serves_now and match.mirror is None)
        return Plan(match, max(routing.backends[n].http_cost(binary) for n in match.split.names), False)

    async def infer_http(self, model: str, version: str, body: bytes | bytearray | IncomingBody,
                         headers: Mapping[str, str], plan: Plan | None = None) -> HttpReply:
        if plan is None:
            plan = self.plan_http(model, version, headers)
        match: Match = plan.route
        size = (len(body) if isinstance(body, (bytes, bytearray)) else body.length) * plan.cost
        self.admission.enter(size)
        try:
            affinity = None
            if match.split is not None:  # a sequence stays in one backend of the split
                body, affinity = await http_affinity(body, headers, self.limit, True)
            backend, match = self.routing.choose(match, model, version, affinity)
            if holding(backend, match):
                return await self._infer_http_held(backend, match, model, version, body, headers)
            if match.mirror is not None and isinstance(body, (bytes, bytearray)):
                self.mirrors.http(match, model, version, bytes(body), headers, self.http_forwarded, self.limit)
            if match.split is None or not isinstance(body, (bytes, bytearray)):
                call = backend.infer_http(model, version, body, headers, self.http_forwarded, self.limit)
                body = b""  # the backend owns it: freed there as soon as it is sent or encoded
                # timed(), inlined: one coroutine less, resumed at every wait of a streamed body
                start = time.perf_counter()
                try:
                    return await call
                except Exception as exc:
                    self.record_failure(backend, exc)
                    raise
                finally:
                    self.metrics.upstream_timer(backend.name).observe(time.perf_counter() - start)
            try:
                return await self.timed(backend, backend.infer_http(model, version, body, headers, self.http_forwarded,
                                                                    self.limit))
            except NoEndpointAvailable:
                other = self.routing.other_side(match, backend, model, version, affinity)
                if other is None:
                    raise
                return await self.timed(other, other.infer_http(model, version, body, headers,
                                                                self.http_forwarded, self.limit))
        finally:
            self.admission.leave(size)

    async def _infer_http_held(self, backend: Backend[Any], match: Match, model: str, version: str,
                               body: bytes | bytearray | IncomingBody, headers: Mapping[str, str]) -> HttpReply:
        holds = backend.holds
        assert holds is not None
        holds.enter(model, match.label)
        try:
            if not holds.ready(model, version):  # (the common case costs no coroutine)
                await hold(backend, match, model, version)
            if match.mirror is not None and isinstance(body, (bytes, bytearray)):
                self.mirrors.http(match, model, version, bytes(body), headers, self.http_forwarded, self.limit)
            try:
                return await self.timed(backend, backend.infer_http(model, version, body, headers,
                                                                    self.http_forwarded, self.limit))
            except NoEndpointAvailable:
                # Where it was is gone (a pod died, another replica evicted it): placed again, once.
                if not isinstance(body, (bytes, bytearray)) or not placed_again(backend, model, version):
                    raise
            await hold(backend, match, model, version)
            return await self.timed(backend, backend.infer_http(model, version, body, headers,
                                                                self.http_forwarded, self.limit))
        finally:
            holds.leave(model, match.label)

    def infer_http_now(self, plan: Plan, model: str, version: str, body: bytes | bytearray | memoryview,
                       headers: Mapping[str, str], record: AccessRecord | None,
                       done: Callable[[HttpReply | Exception | None], None]) -> RouteLabel | None:
        """:meth:`infer_http` without a coroutine (proxynow.py ``http_now``)."""
        return http_now(self, plan, model, version, body, headers, record, done)

    async def infer_grpc(self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
                         affinity: str | None = None, metadata: Sequence[tuple[str, str]] = (),
                         sink: AnswerSink | None = None, tried: int = 0) -> bytes:
        routing = self.routing
        headers = metadata_map(metadata) if routing.table.by_headers else None
        backend, match = routing.pick(model, version, headers, affinity)
        # Requests of a placement pool or a route with hold_s wait for their model and count as
        # its demand (one coroutine for both kinds: every gRPC inference passes here).
        holds = backend.holds if (backend.placer is not None or match.hold_s) and match.split is None else None
        size = len(message) * backend.grpc_cost(not isinstance(message, bytes) and not message.whole)
        self.admission.enter(size)
        if holds is not None:
            holds.enter(model, match.label)
        try:
            if holds is not None and not holds.ready(model, version):
                await hold(backend, match, model, version)
            trace = pick_headers(metadata, self.context_headers) if metadata else ()
            if match.mirror is not None:
                if not isinstance(message, bytes):
                    message = bytes(await message.read())  # (a mirror needs the message whole)
                self.mirrors.grpc(match, model, version, message, trace)
            # timed(), inlined: one coroutine less on every gRPC inference (see GrpcBackend._unary).
            start = time.perf_counter()
            try:
                return await backend.infer_grpc(message, model, version, timeout, affinity, trace, sink, tried)
            except NoEndpointAvailable as none:
                self.record_failure(backend, none)
                if not isinstance(message, bytes) and not message.resendable:
                    raise  # (streamed on past what is kept of it: it cannot go anywhere again)
                other: Backend[Any] | None = backend
                if holds is None or not placed_again(backend, model, version):
                    other = self.routing.other_side(match, backend, model, version, affinity) if match.split else None
                    if other is None:
                        raise
                # (else where it was is gone — a pod died, another replica evicted it: placed again, once)
            except Exception as exc:
                self.record_failure(backend, exc)
                raise
            finally:
                self.metrics.upstream_timer(backend.name).observe(time.perf_counter() - start)
            assert other is not None
            if other is backend:
                await hold(backend, match, model, version)
            return await self.timed(other, other.infer_grpc(message, model, version, timeout, affinity, trace, sink))
        finally:
            self.admission.leave(size)
            if holds is not None:
                holds.leave(model, match.label)

    def infer_grpc_now(self, message: bytes, model: str, version: str, timeout: float | None, affinity: str | None,
                       metadata: Sequence[tuple[str, str]], sink: AnswerSink | None, record: AccessRecord | None,
                       done: Callable[[GrpcOutcome], None]) -> tuple[RouteLabel, Pending] | None:
        """:meth:`infer_grpc` without a coroutine (proxynow.py ``grpc_now``)."""
        return grpc_now(self, message, model, version, timeout, affinity, metadata, sink, record, done)

    def infer_stream(self, first: bytes, rest: AsyncIterator[bytes], model: str, version: str,
                     timeout: float | None, affinity: str | None = None,
                     metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[bytes]:
        """ModelStreamInfer pass-through to the gRPC backend of the first request's route.
        Every later request must route to the same backend (one stream, one backend
        connection); one that does not ends the stream with INVALID_ARGUMENT after the
        answers to the requests before it. Each request counts against max_inflight_bytes
        while the gateway holds it (:class:`StreamHeld`): a first one past it is refused with
        UNAVAILABLE before the backend's stream opens, a later one ends the stream with
        UNAVAILABLE after the answers before it."""
        return proxy_stream(self, first, rest, model, version, timeout, affinity, metadata)

    # -- Triton's generate extension: through on HTTP backends, converted on gRPC backends ----
    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       stream: bool) -> HttpReply:
        backend, match = self.routing.pick(model, version, headers)
        if holding(backend, match):
            await hold(backend, match, model, version)
        size = len(body) * backend.generate_cost()
        self.admission.enter(size)
        try:
            return await self.timed(backend, backend.generate(model, version, body, headers, self.http_forwarded,
                                                              stream))
        finally:
            self.admission.leave(size)
