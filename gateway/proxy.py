"""The gateway's data plane: route → pick a pool → call → answer. No transport code.

The proxy reads one :class:`Routing` snapshot per request (route table, pools), so a
config reload swaps the whole snapshot in one assignment while requests in flight
finish on the pools they started on. Everything protocol-specific — pass-through,
conversion, endpoint choice, retries — is the pool's (``upstream/pool.py``): the
proxy never asks what kind of pool it holds.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from . import __version__
from .budget import ByteBudget
from .codec.repository import IndexEntry, PoolIndexEntry
from .codec.triton import stats_from_json, stats_from_pb, stats_sum, stats_to_json, stats_to_pb
from .codec.wire import scan_infer_routing
from .config.schema import Backend, GatewayConfig
from .dataplane import TRACE_HEADERS, ClientDisconnected, HttpReply, IncomingBody, pick_headers
from .errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoEndpointAvailable,
    Overloaded,
    PayloadTooLarge,
    Unsupported,
    UpstreamError,
)
from .observability.access import AccessRecord
from .observability.metrics import UNROUTED, Metrics, RouteLabel
from .routing.readiness import Ready
from .routing.table import STATEFUL, Match, RouteTable
from .security.guard import Guard, guard_for
from .upstream.grpc import GrpcPool
from .upstream.health import HealthChecker
from .upstream.http import HttpPool, http_affinity
from .upstream.mirror import Mirrors
from .upstream.pool import Pool, Refused

__all__ = ["EXTENSIONS", "Proxy", "Routing", "build_pool"]

T = TypeVar("T")

# The (route pattern, pool) the current request was routed to: one request per task
# (uvicorn and grpc.aio run each in its own), read back by route_label for its metrics.
CHOSEN: ContextVar[RouteLabel | None] = ContextVar("oip_gateway_chosen_route", default=None)

# What works end to end through the gateway, on every client × pool path, in Triton's
# spelling (spec "Server Metadata": the extensions field; Triton's own list, core
# server.cc): the binary tensor extension, parameters, sequences (sequence_id keeps a
# sequence on one endpoint), the model repository (index merged over the fleet, load and
# unload with unload_dependents on every endpoint of the pool), model configuration,
# statistics (summed over endpoints), trace and logging settings. Not listed: shared memory
# (no network hop has it), classification and schedule_policy (their parameters pass
# through but are not proven here).
EXTENSIONS = ["binary_tensor_data", "parameters", "sequence", "model_repository",
              "model_repository(unload_dependents)", "model_configuration", "statistics", "trace", "logging"]

# Request headers that matter to a V2 backend; everything else (host,
# content-length, connection) belongs to the hop and is not forwarded.
_FORWARDED = ("content-type", "inference-header-content-length", "content-encoding", "accept-encoding")


_JSON = {"content-type": "application/json"}


def _stats(part: tuple[bytes, str]) -> Any:
    """One endpoint's statistics answer (see Pool.endpoint_stats) as a message."""
    body, form = part
    return stats_from_json(body) if form == "json" else stats_from_pb(body)


def _lacks_extension(err: GatewayError) -> bool:
    """A backend without Triton's trace / logging extension: no such path or RPC."""
    return isinstance(err, UpstreamError) and (err.grpc_code == "UNIMPLEMENTED" or err.http_status == 404)


def _first_failure(errors: Sequence[GatewayError], kind: str) -> GatewayError:
    return errors[0] if errors else NoEndpointAvailable(f"no endpoint to ask for {kind} settings")


def _metadata_map(metadata: Sequence[tuple[str, str]]) -> dict[str, str]:
    """gRPC metadata as a header mapping for header routes (text entries only)."""
    return {k: v for k, v in metadata if isinstance(v, str)}


_CLIENTS_FAULT = (ClientDisconnected, InvalidRequest, Unsupported, PayloadTooLarge)


def build_pool(backend: Backend) -> Pool[Any]:
    return HttpPool(backend) if backend.protocol == "http" else GrpcPool(backend)


@dataclass(frozen=True, slots=True)
class Routing:
    """What a request is routed with: replaced whole on a reload, never changed in place."""

    config: GatewayConfig
    table: RouteTable
    pools: Mapping[str, Pool[Any]]

    def pool(self, model: str, version: str, headers: Mapping[str, str] | None = None,
             affinity: str | None = None) -> Pool[Any]:
        return self.pick(model, version, headers, affinity)[0]

    def pick(self, model: str, version: str, headers: Mapping[str, str] | None = None,
             affinity: str | None = None) -> tuple[Pool[Any], Match]:
        """The pool for one request (a split's side chosen now) and its route. The
        (route, pool) pair is noted for this request's metrics (``CHOSEN``)."""
        match = self.table.resolve(model, version, headers)
        if match.stateful is not STATEFUL.get():  # (a get is cheaper than a set: most routes are not)
            STATEFUL.set(match.stateful)
        if match.split is None:  # (choose's common case, inlined: every inference passes here)
            CHOSEN.set((match.label, match.backend))
            return self.pools[match.backend], match
        return self.choose(match, model, version, affinity)

    def choose(self, match: Match, model: str, version: str, affinity: str | None = None) -> tuple[Pool[Any], Match]:
        """``pick`` for a route already resolved."""
        name = match.backend if match.split is None else \
            match.pick(lambda n: self.pools[n].can_take(model, version), affinity)
        if match.stateful is not STATEFUL.get():
            STATEFUL.set(match.stateful)
        CHOSEN.set((match.label, name))
        return self.pools[name], match

    def pools_of(self, model: str, version: str = "") -> list[Pool[Any]]:
        """Every pool of the model's route (all sides of a split): model control,
        statistics and per-model settings go to each."""
        match = self.table.resolve(model, version)
        return [self.pools[n] for n in (match.split.names if match.split is not None else (match.backend,))]


class Admission:
    """Bytes of inference request bodies in flight in this process, held against
    ``max_inflight_bytes`` (0: unbounded, only counted). Over the limit a request is
    refused at once (503 / UNAVAILABLE: retry later), before its body is read or sent."""

    __slots__ = ("auto", "budget", "gauge", "large_at", "large_inflight")

    # A request this large marks "large-tensor activity" (when it enters and leaves): the
    # allocator's freed pages go back to the system once it has been quiet (``idle_trim``).
    LARGE = 1 << 20

    def __init__(self, limit: int | None, gauge: Any, auto: int = 0,
                 track: Callable[[Any, Callable[[], float]], bool] | None = None) -> None:
        self.auto = auto  # the limit when the config leaves it unset (memlimit.py)
        budget = self.budget = ByteBudget(self.auto if limit is None else limit)
        # The gauge reads the budget when scraped (Metrics.track), else it is set as it changes.
        self.gauge = None if track is not None and track(gauge, lambda: budget.used) else gauge
        self.large_at = 0.0  # time.monotonic() of the last large request entering or leaving
        self.large_inflight = 0  # large requests in flight: no idle trim while any is (it would re-fault)

    def configure(self, limit: int | None) -> None:
        self.budget.limit = self.auto if limit is None else limit

    def enter(self, n: int) -> None:
        # One request is always admitted when none is in flight: a limit below the message
        # size (a small pod) bounds concurrency, it does not refuse a request forever.
        budget = self.budget
        if not budget.take(n):
            if budget.used:
                raise Overloaded(f"gateway overloaded: {budget.used} bytes of requests in flight, {n} more "
                                 f"would pass max_inflight_bytes ({budget.limit}); retry later")
            budget.used += n  # alone: admitted though larger than the limit
        if n >= self.LARGE:
            self.large_at = time.monotonic()
            self.large_inflight += 1
        if self.gauge is not None:
            self.gauge.set(self.budget.used)

    def leave(self, n: int) -> None:
        self.budget.give(n)
        if n >= self.LARGE:
            self.large_at = time.monotonic()
            self.large_inflight -= 1
        if self.gauge is not None:
            self.gauge.set(self.budget.used)


# What a request is expected to hold in this process while in flight, per byte of its body:
# admission control counts a request as its body's size times this (``max_inflight_bytes`` is
# a memory budget). Measured here as peak RSS over idle per request, 8 concurrent 16 MB
# requests to real Triton (session 17): HTTP binary → gRPC pool 6.8 ×, gRPC → HTTP pool 2.4 ×,
# HTTP JSON → gRPC pool 2.3 × (of the JSON text), gRPC → gRPC 1.4 × (grpcio's own copies),
# HTTP → HTTP 0.2–1.2 × (binary bodies stream; JSON bodies are read whole). Without the factors
# a 640 MiB cgroup with the default share (a fifth) was OOM-killed by 24 clients of 16 MB
# through the binary → gRPC conversion (tests/integration/test_memory_cgroup.py).
COST_PASS_HTTP = 1
COST_PASS_GRPC = 2
COST_CONVERT = 3  # JSON → gRPC, gRPC → HTTP, ModelStreamInfer to an HTTP pool, generate → gRPC
COST_CONVERT_BINARY = 7  # HTTP binary extension → gRPC: the body, its tensors and the message


def http_cost(routing: Routing, match: Match, headers: Mapping[str, str]) -> int:
    """The factor for an HTTP inference on ``match``'s route: the dearest of its pools."""
    pools = routing.pools
    if match.split is None:
        if isinstance(pools.get(match.backend), HttpPool):
            return COST_PASS_HTTP
    elif all(isinstance(pools.get(n), HttpPool) for n in match.split.names):
        return COST_PASS_HTTP
    return COST_CONVERT_BINARY if "inference-header-content-length" in headers else COST_CONVERT


def grpc_cost(pool: Pool[Any]) -> int:
    """The factor for a gRPC inference (ModelInfer, or a ModelStreamInfer request) to ``pool``."""
    return COST_PASS_GRPC if isinstance(pool, GrpcPool) else COST_CONVERT


class StreamHeld:
    """The request messages of one ModelStreamInfer held against admission control: each from
    when it is read until grpc asks for the next (it has been handed to the backend's stream),
    so a stream of large tensors counts as the unary calls do — and marks large-tensor activity
    for the idle trim (each large request, and the end of a stream that carried one). One
    message is held at a time (the next is read once the last was handed on). ``close()``
    gives back one that a stream ended while holding; a message handed on after that is not
    given back twice."""

    __slots__ = ("admission", "cost", "held", "large", "open")

    def __init__(self, admission: Admission, cost: int = 1) -> None:
        self.admission = admission
        self.cost = cost  # per byte of a request (COST_*)
        self.held = 0  # the message held now, in admission's units (0: none)
        self.large = False
        self.open = True

    def take(self, n: int) -> None:
        assert self.held == 0, "one message at a time"
        n *= self.cost
        self.admission.enter(n)  # raises Overloaded past max_inflight_bytes
        self.held = n
        self.large = self.large or n >= Admission.LARGE

    def give(self) -> None:
        if self.open and self.held:
            self.admission.leave(self.held)
            self.held = 0

    def close(self) -> None:
        if self.open:
            self.give()
            self.open = False
            if self.large:
                # Answers to large requests flow until the stream's end, after its last request
                # was handed on: the idle trim counts its quiet from here.
                self.admission.large_at = time.monotonic()


class Proxy:
    """Implements :class:`gateway.dataplane.DataPlane` by forwarding to backend pools."""

    def __init__(self, routing: Routing, health: HealthChecker, metrics: Metrics, auto_inflight: int = 0) -> None:
        self.routing = routing
        self.health = health
        self.metrics = metrics
        # Set on SIGTERM when drain_s > 0: "not ready" while still serving.
        self.draining = False
        config = routing.config
        self.admission = Admission(config.max_inflight_bytes, metrics.inflight_bytes, auto_inflight, metrics.track)
        # Shadow traffic (routes' ``mirror``): copies sent in the background, answers dropped.
        self.mirrors = Mirrors(lambda: self.routing.pools, metrics.mirror_requests, metrics.mirror_inflight)
        self.limit = config.max_message_bytes
        # Client headers / gRPC metadata passed on to backends, on every path.
        self.context_headers = frozenset(TRACE_HEADERS) | frozenset(config.forward_headers)
        self._http_forwarded = (*_FORWARDED, *sorted(self.context_headers))
        # Who may call what, and how often (security/guard.py); None: an open gateway.
        self.guard: Guard | None = guard_for(config, routing.table)

    def swap(self, routing: Routing) -> None:
        """A reload: new requests route with ``routing``; those in flight keep theirs.
        Admission and forwarded headers change with it (the message size limit is the
        listeners', fixed until a restart)."""
        config = routing.config
        self.admission.configure(config.max_inflight_bytes)
        self.context_headers = frozenset(TRACE_HEADERS) | frozenset(config.forward_headers)
        self._http_forwarded = (*_FORWARDED, *sorted(self.context_headers))
        self.guard = guard_for(config, routing.table, self.guard)
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
        """(route pattern, pool) for the metrics: bounded by the config, never a client's
        string. The pool this request went to when it was routed (a split's side, a header
        route), else the default route's."""
        chosen = CHOSEN.get()
        if chosen is not None:
            return chosen
        try:
            match = self.routing.table.resolve(model, version)
        except Exception:
            return UNROUTED
        return match.label, match.backend

    async def timed(self, pool: Pool[Any], call: Awaitable[T]) -> T:
        """Await a backend call, recording its duration and any failure under the pool's name."""
        start = time.perf_counter()
        try:
            return await call
        except Exception as exc:
            self._failed(pool, exc)
            raise
        finally:
            self.metrics.upstream_timer(pool.name).observe(time.perf_counter() - start)

    def _failed(self, pool: Pool[Any], exc: Exception) -> None:
        if not isinstance(exc, _CLIENTS_FAULT):
            # (A bad request, or the client left while its body streamed: not the backend's failure.)
            self.metrics.upstream_errors.labels(pool.name, type(exc).__name__).inc()

    # -- model-level answers come from a backend of the routed pool -------------
    async def model_ready(self, model: str, version: str) -> bool:
        try:
            pool = self.routing.pool(model, version)
        except ModelNotFound:
            # A readiness probe gets "not ready", as Triton answers for a model it
            # does not have (HTTP 400, gRPC ready=false) — not an error.
            return False
        return await self.timed(pool, pool.model_ready(model, version))

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        pool = self.routing.pool(model, version)
        return await self.timed(pool, pool.model_metadata(model, version))

    # -- Triton's repository extension, across the fleet ----------------------------
    async def repository_index(self, ready_only: bool) -> list[PoolIndexEntry]:
        """Every pool's endpoints' repository indexes merged: one entry per pool, model and
        version — READY when some endpoint has it ready (``endpoints``: those), else the
        state and reason one endpoint gave (``endpoints``: those listing it). Endpoints
        without an index (OVMS) add nothing. Asked now, in parallel, within health timeout_s."""
        routing = self.routing
        timeout = routing.config.health.timeout_s
        jobs = [(pool, ep) for pool in routing.pools.values() for ep in list(pool.endpoints.values())]
        answers = await asyncio.gather(*(pool.check_index(ep, timeout) for pool, ep in jobs))
        merged: dict[tuple[str, str, str], list[Any]] = {}  # -> [first entry, ready eps, listing eps]
        for (pool, ep), entries in zip(jobs, answers):
            if not entries:
                # No index there (OVMS, the reference server): the exact-routed models, as the
                # health checker's per-model calls found them — so a gateway in front of this
                # one reads a complete index.
                entries = [IndexEntry(m, "", ep.health.ready_for(m, "") == Ready.YES,
                                      "READY" if ep.health.ready_for(m, "") == Ready.YES else "UNAVAILABLE")
                           for m in sorted(pool.routed)]
            for e in entries:
                slot = merged.setdefault((e.name, e.version, pool.name), [e, [], []])
                slot[1 if e.ready else 2].append(str(ep.address))
        out = []
        for (name, version, pool_name), (first, ready, listing) in sorted(merged.items()):
            if ready:
                out.append(PoolIndexEntry(name, version, True, "READY", "", pool_name, tuple(ready)))
            elif not ready_only:
                out.append(PoolIndexEntry(name, version, False, first.state, first.reason, pool_name, tuple(listing)))
        return out

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        """Load / unload ``model`` on every endpoint of the pool(s) it routes to."""
        reply = None
        for pool in self.routing.pools_of(model):
            reply = await self.timed(pool, pool.repository_http(action, model, body, headers))
        assert reply is not None
        return reply

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: Sequence[tuple[str, str]]) -> bytes:
        answer = b""
        for pool in self.routing.pools_of(model):
            answer = await self.timed(pool, pool.repository_grpc(rpc, model, message, timeout, tuple(metadata)))
        return answer

    # -- Triton's per-model extensions (model configuration, statistics) --------
    # Triton's own messages (model_config.proto, grpc_service.proto): relayed as they are
    # between same-protocol pools, converted exactly otherwise (codec/triton.py).
    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        if what == "stats":
            parts = await self._statistics(model, version, None)
            if len(parts) == 1 and parts[0][1] == "json":
                return HttpReply(200, parts[0][0], _JSON)  # one Triton's own answer, untouched
            return HttpReply(200, stats_to_json(stats_sum([_stats(p) for p in parts])), _JSON)
        pool = self.routing.pool(model, version)
        return await self.timed(pool, pool.config_http(model, version))

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        if rpc == "ModelStatistics":
            parts = await self._statistics(model, version, timeout)
            if len(parts) == 1 and parts[0][1] == "pb":
                return parts[0][0]
            return stats_to_pb(stats_sum([_stats(p) for p in parts]))
        pool = self.routing.pool(model, version)
        return await self.timed(pool, pool.config_grpc(message, model, version, timeout))

    async def _statistics(self, model: str, version: str, timeout: float | None) -> list[tuple[bytes, str]]:
        """Every endpoint's statistics: of the model's pool, or (no model: Triton's "all
        models") of every pool. Summed per model and version by the caller."""
        pools = self.routing.pools_of(model, version) if model else list(self.routing.pools.values())
        answers = await asyncio.gather(*(self.timed(p, p.statistics(model, version, timeout)) for p in pools),
                                       return_exceptions=True)
        parts = [part for a in answers if isinstance(a, list) for part in a]
        if not parts:
            failure = next((a for a in answers if isinstance(a, BaseException)), None)
            raise failure if failure is not None else NoEndpointAvailable("no backend has endpoints to ask")
        return parts

    # -- Triton's trace and log settings --------------------------------------------
    async def settings(self, kind: str, model: str, request: tuple[str, bytes | None], update: bool) -> bytes:
        """Trace settings of ``model`` (its pool's endpoints) or server-wide trace / log
        settings (every endpoint of every pool). A change (``update``) goes to all of
        them and succeeds when every endpoint that has the extension took it (one that
        answers 404 / UNIMPLEMENTED has none: MLServer, OVMS); the answer is the first
        endpoint's. A read is answered by the first endpoint that can."""
        pools = self.routing.pools_of(model) if model else list(self.routing.pools.values())
        if not update:
            errors: list[GatewayError] = []
            for pool in pools:
                for ep in list(pool.endpoints.values()):
                    try:
                        return (await self.timed(pool, pool.endpoint_settings(ep, kind, model, request)))[1]
                    except Refused as exc:
                        errors.append(exc.error)
                    except _CLIENTS_FAULT:
                        raise
                    except GatewayError as exc:
                        errors.append(exc)
            raise _first_failure(errors, kind)
        answers: list[bytes] = []
        lacking: list[GatewayError] = []
        failed: list[tuple[str, GatewayError]] = []
        def change(pool: Pool[Any]) -> Awaitable[list[tuple[Any, tuple[str, bytes] | None, GatewayError | None]]]:
            return pool.each_endpoint(lambda ep: pool.endpoint_settings(ep, kind, model, request))

        for pool, results in zip(pools, await asyncio.gather(*(change(p) for p in pools))):
            for ep, answer, err in results:
                if err is None and answer is not None:
                    answers.append(answer[1])
                elif isinstance(err, _CLIENTS_FAULT):
                    raise err
                elif err is not None and _lacks_extension(err):
                    lacking.append(err)
                elif err is not None:
                    failed.append((f"backend '{pool.name}' endpoint {ep.address}", err))
        if failed:
            first = failed[0][1]
            total = len(answers) + len(failed)
            detail = "; ".join(f"{where}: {err.message}" for where, err in failed)
            raise UpstreamError(f"{kind} settings failed on {len(failed)} of {total} endpoints: {detail}",
                                http_status=first.http_status, grpc_code=first.grpc_code)
        if not answers:
            raise _first_failure(lacking, kind)
        return answers[0]

    # -- inference --------------------------------------------------------------
    async def infer_http(self, model: str, version: str, body: bytes | bytearray | IncomingBody,
                         headers: Mapping[str, str]) -> HttpReply:
        match = self.routing.table.resolve(model, version, headers)
        size = (len(body) if isinstance(body, (bytes, bytearray)) else body.length) * \
            http_cost(self.routing, match, headers)
        self.admission.enter(size)
        try:
            affinity = None
            if match.split is not None:  # a sequence stays in one pool of the split
                body, affinity = await http_affinity(body, headers, self.limit, True)
            pool, match = self.routing.choose(match, model, version, affinity)
            if match.mirror is not None and isinstance(body, (bytes, bytearray)):
                self.mirrors.http(match, model, version, bytes(body), headers, self._http_forwarded, self.limit)
            if match.split is None or not isinstance(body, (bytes, bytearray)):
                call = pool.infer_http(model, version, body, headers, self._http_forwarded, self.limit)
                del body  # the pool owns it: freed there as soon as it is sent or encoded
                return await self.timed(pool, call)
            try:
                return await self.timed(pool, pool.infer_http(model, version, body, headers, self._http_forwarded,
                                                              self.limit))
            except NoEndpointAvailable:
                other = self._other_side(match, pool, model, version, affinity)
                if other is None:
                    raise
                return await self.timed(other, other.infer_http(model, version, body, headers,
                                                                self._http_forwarded, self.limit))
        finally:
            self.admission.leave(size)

    def infer_http_now(self, model: str, version: str, body: bytes | bytearray | memoryview,
                       headers: Mapping[str, str],
                       record: AccessRecord | None,
                       done: Callable[[HttpReply | Exception | None], None]) -> RouteLabel | None:
        """:meth:`infer_http` without a coroutine for a whole, uncompressed body, when its
        route is one plain HTTP pool (no split, no mirror) and that pool can send it at once
        (``HttpPool.infer_http_now``): the answer, or the error :meth:`infer_http` would
        raise, goes to ``done`` from the backend connection's callbacks; ``done(None)``:
        send it again through :meth:`infer_http` (nothing was answered). Returns the
        request's (route, pool) label, or None when nothing was done (await
        :meth:`infer_http` instead). Raises what routing and admission raise."""
        match = self.routing.table.resolve(model, version, headers)
        if match.split is not None or match.mirror is not None:
            return None
        if match.stateful is not STATEFUL.get():
            STATEFUL.set(match.stateful)
        pool = self.routing.pools[match.backend]
        if not isinstance(pool, HttpPool):
            return None
        size = len(body)
        admission = self.admission
        admission.enter(size)
        start = time.perf_counter()
        timer = self.metrics.upstream_timer(pool.name)

        def answered(result: HttpReply | Exception | None) -> None:
            admission.leave(size)
            if result is not None:
                timer.observe(time.perf_counter() - start)
                if isinstance(result, Exception):
                    self._failed(pool, result)
            done(result)

        try:
            taken = pool.infer_http_now(model, version, body, headers, self._http_forwarded, record, answered)
        except Exception as exc:
            admission.leave(size)
            timer.observe(time.perf_counter() - start)
            self._failed(pool, exc)
            raise
        if not taken:
            admission.leave(size)
            return None
        return match.label, match.backend

    def _other_side(self, match: Match, failed: Pool[Any], model: str, version: str,
                    affinity: str | None) -> Pool[Any] | None:
        """A split's side answered that nothing could take the request (no endpoint had the
        model ready after all — the checker had not seen it go yet): another side that can
        takes it, as its share would have gone there. None when there is none."""
        assert match.split is not None
        routing = self.routing
        name = match.split.choose(lambda n: n != failed.name and routing.pools[n].can_take(model, version),
                                  affinity)
        if name == failed.name or not routing.pools[name].can_take(model, version):
            return None
        CHOSEN.set((match.label, name))
        return routing.pools[name]

    async def infer_grpc(self, message: bytes, model: str, version: str, timeout: float | None,
                         affinity: str | None = None, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        routing = self.routing
        headers = _metadata_map(metadata) if routing.table.by_headers else None
        pool, match = routing.pick(model, version, headers, affinity)
        size = len(message) * grpc_cost(pool)
        self.admission.enter(size)
        try:
            trace = pick_headers(metadata, self.context_headers) if metadata else ()
            if match.mirror is not None:
                self.mirrors.grpc(match, model, version, message, trace)
            # timed(), inlined: one coroutine less on every gRPC inference (see GrpcPool._unary).
            start = time.perf_counter()
            try:
                return await pool.infer_grpc(message, model, version, timeout, affinity, trace)
            except NoEndpointAvailable as exc:
                self._failed(pool, exc)
                other = self._other_side(match, pool, model, version, affinity) if match.split else None
                if other is None:
                    raise
            except Exception as exc:
                self._failed(pool, exc)
                raise
            finally:
                self.metrics.upstream_timer(pool.name).observe(time.perf_counter() - start)
            return await self.timed(other, other.infer_grpc(message, model, version, timeout, affinity, trace))
        finally:
            self.admission.leave(size)

    async def infer_stream(self, first: bytes, rest: AsyncIterator[bytes], model: str, version: str,
                           timeout: float | None, affinity: str | None = None,
                           metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[bytes]:
        """ModelStreamInfer pass-through to the gRPC pool of the first request's route.
        Every later request must route to the same pool (one stream, one backend
        connection); one that does not ends the stream with INVALID_ARGUMENT after the
        answers to the requests before it. Each request counts against max_inflight_bytes
        while the gateway holds it (:class:`StreamHeld`): a first one past it is refused with
        UNAVAILABLE before the backend's stream opens, a later one ends the stream with
        UNAVAILABLE after the answers before it."""
        routing = self.routing
        headers = _metadata_map(metadata)
        pool = routing.pool(model, version, headers, affinity)
        refused: list[GatewayError] = []
        held = StreamHeld(self.admission, grpc_cost(pool))
        held.take(len(first))  # over max_inflight_bytes: UNAVAILABLE before a backend stream opens

        async def requests() -> AsyncIterator[bytes]:
            yield first
            held.give()
            async for message in rest:
                m, v, _ = scan_infer_routing(message)
                try:
                    if not m:
                        raise InvalidRequest("ModelInferRequest.model_name is required")
                    match = routing.table.resolve(m, v, headers)
                    if pool.name not in (match.split.names if match.split is not None else (match.backend,)):
                        raise InvalidRequest(
                            f"model '{m}' routes to another backend than this stream's ('{pool.name}'): "
                            "open one stream per backend")
                    held.take(len(message))
                except GatewayError as err:
                    refused.append(err)
                    return  # half-close: the backend answers what it has, then the stream ends
                yield message
                held.give()

        try:
            trace = pick_headers(metadata, self.context_headers)
            async for answer in pool.infer_stream(requests(), model, version, timeout, affinity, trace):
                yield answer
        finally:
            held.close()
        if refused:
            raise refused[0]

    # -- Triton's generate extension: through on HTTP pools, converted on gRPC pools ----
    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       stream: bool) -> HttpReply:
        pool = self.routing.pool(model, version, headers)
        size = len(body) * (COST_PASS_HTTP if isinstance(pool, HttpPool) else COST_CONVERT)
        self.admission.enter(size)
        try:
            return await self.timed(pool, pool.generate(model, version, body, headers, self._http_forwarded, stream))
        finally:
            self.admission.leave(size)
