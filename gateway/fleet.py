"""Answers that span the fleet rather than one request's backend: the repository index merged over
every endpoint, model control on every endpoint of a model's backends, Triton's per-model extensions
(configuration, statistics summed over endpoints) and its trace / log settings.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .backends.base import Backend
from .backends.refusal import Refused
from .codec.repository import BackendIndexEntry, IndexEntry
from .codec.triton import stats_from_json, stats_from_pb, stats_sum, stats_to_json, stats_to_pb
from .dataplane import CLIENTS_FAULT, HttpReply
from .errors import GatewayError, NoEndpointAvailable, UpstreamError
from .routing.readiness import Ready
from .snapshot import Routing

__all__ = ["Fleet"]

_JSON = {"content-type": "application/json"}
Timed = Callable[[Backend[Any], Awaitable[Any]], Awaitable[Any]]


def _stats(part: tuple[bytes, str]) -> Any:
    """One endpoint's statistics answer (see Backend.endpoint_stats) as a message."""
    body, form = part
    return stats_from_json(body) if form == "json" else stats_from_pb(body)


def _lacks_extension(err: GatewayError) -> bool:
    """A backend without Triton's trace / logging extension: no such path or RPC."""
    return isinstance(err, UpstreamError) and (err.grpc_code == "UNIMPLEMENTED" or err.http_status == 404)


def _first_failure(errors: Sequence[GatewayError], kind: str) -> GatewayError:
    return errors[0] if errors else NoEndpointAvailable(f"no endpoint to ask for {kind} settings")


class Fleet:
    """The fleet-wide answers of :class:`~gateway.proxy.Proxy`, over the routing snapshot of the
    moment (``routing()``); each backend call measured by ``timed`` (the proxy's)."""

    def __init__(self, routing: Callable[[], Routing], timed: Timed) -> None:
        self._routing = routing
        self.timed = timed

    @property
    def routing(self) -> Routing:
        return self._routing()

    # -- Triton's repository extension, across the fleet ----------------------------
    async def repository_index(self, ready_only: bool) -> list[BackendIndexEntry]:
        """Every backend's endpoints' repository indexes merged: one entry per backend, model and
        version — READY when some endpoint has it ready (``endpoints``: those), else the
        state and reason one endpoint gave (``endpoints``: those listing it). Endpoints
        without an index (OVMS) add nothing. Asked now, in parallel, within health timeout_s."""
        routing = self.routing
        timeout = routing.config.health.timeout_s
        jobs = [(backend, ep) for backend in routing.backends.values() for ep in list(backend.endpoints.values())]
        answers = await asyncio.gather(*(backend.check_index(ep, timeout) for backend, ep in jobs))
        merged: dict[tuple[str, str, str], list[Any]] = {}  # -> [first entry, ready eps, listing eps]
        for (backend, ep), entries in zip(jobs, answers):
            if not entries:
                # No index there (OVMS, the reference server): the exact-routed models, as the
                # health checker's per-model calls found them — so a gateway in front of this
                # one reads a complete index.
                entries = [IndexEntry(m, "", ep.health.ready_for(m, "") == Ready.YES,
                                      "READY" if ep.health.ready_for(m, "") == Ready.YES else "UNAVAILABLE")
                           for m in sorted(backend.routed)]
            for e in entries:
                slot = merged.setdefault((e.name, e.version, backend.name), [e, [], []])
                slot[1 if e.ready else 2].append(str(ep.address))
        out = []
        for (name, version, backend_name), (first, ready, listing) in sorted(merged.items()):
            if ready:
                out.append(BackendIndexEntry(name, version, True, "READY", "", backend_name, tuple(ready)))
            elif not ready_only:
                out.append(BackendIndexEntry(name, version, False, first.state, first.reason, backend_name,
                                             tuple(listing)))
        return out

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        """Load / unload ``model`` on every endpoint of the backend(s) it routes to."""
        reply = None
        for backend in self.routing.backends_of(model):
            reply = await self.timed(backend, backend.repository_http(action, model, body, headers))
        assert reply is not None
        return reply

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        answer = b""
        for backend in self.routing.backends_of(model):
            answer = await self.timed(backend, backend.repository_grpc(rpc, model, message, timeout, tuple(metadata)))
        return answer

    # -- Triton's per-model extensions (model configuration, statistics) --------
    # Triton's own messages (model_config.proto, grpc_service.proto): relayed as they are
    # between same-protocol backends, converted exactly otherwise (codec/triton.py).
    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        if what == "stats":
            parts = await self._statistics(model, version, None)
            if len(parts) == 1 and parts[0][1] == "json":
                return HttpReply(200, parts[0][0], _JSON)  # one Triton's own answer, untouched
            return HttpReply(200, stats_to_json(stats_sum([_stats(p) for p in parts])), _JSON)
        backend = self.routing.backend(model, version)
        return await self.timed(backend, backend.config_http(model, version))

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        if rpc == "ModelStatistics":
            parts = await self._statistics(model, version, timeout)
            if len(parts) == 1 and parts[0][1] == "pb":
                return parts[0][0]
            return stats_to_pb(stats_sum([_stats(p) for p in parts]))
        backend = self.routing.backend(model, version)
        return await self.timed(backend, backend.config_grpc(message, model, version, timeout))

    async def _statistics(self, model: str, version: str, timeout: float | None) -> list[tuple[bytes, str]]:
        """Every endpoint's statistics: of the model's backend, or (no model: Triton's "all
        models") of every backend. Summed per model and version by the caller."""
        backends = self.routing.backends_of(model, version) if model else list(self.routing.backends.values())
        answers = await asyncio.gather(*(self.timed(p, p.statistics(model, version, timeout)) for p in backends),
                                       return_exceptions=True)
        parts = [part for a in answers if isinstance(a, list) for part in a]
        if not parts:
            failure = next((a for a in answers if isinstance(a, BaseException)), None)
            raise failure if failure is not None else NoEndpointAvailable("no backend has endpoints to ask")
        return parts

    # -- Triton's trace and log settings --------------------------------------------
    async def settings(self, kind: str, model: str, request: tuple[str, bytes | None], update: bool) -> bytes:
        """Trace settings of ``model`` (its backend's endpoints) or server-wide trace / log
        settings (every endpoint of every backend). A change (``update``) goes to all of
        them and succeeds when every endpoint that has the extension took it (one that
        answers 404 / UNIMPLEMENTED has none: MLServer, OVMS); the answer is the first
        endpoint's. A read is answered by the first endpoint that can."""
        backends = self.routing.backends_of(model) if model else list(self.routing.backends.values())
        if not update:
            errors: list[GatewayError] = []
            for backend in backends:
                for ep in list(backend.endpoints.values()):
                    try:
                        return (await self.timed(backend, backend.endpoint_settings(ep, kind, model, request)))[1]
                    except Refused as exc:
                        errors.append(exc.error)
                    except CLIENTS_FAULT:
                        raise
                    except GatewayError as exc:
                        errors.append(exc)
            raise _first_failure(errors, kind)
        answers: list[bytes] = []
        lacking: list[GatewayError] = []
        failed: list[tuple[str, GatewayError]] = []
        def change(backend: Backend[Any]) -> Awaitable[list[tuple[Any, tuple[str, bytes] | None, GatewayError | None]]]:
            return backend.each_endpoint(lambda ep: backend.endpoint_settings(ep, kind, model, request))

        for backend, results in zip(backends, await asyncio.gather(*(change(p) for p in backends))):
            for ep, answer, err in results:
                if err is None and answer is not None:
                    answers.append(answer[1])
                elif isinstance(err, CLIENTS_FAULT):
                    raise err
                elif err is not None and _lacks_extension(err):
                    lacking.append(err)
                elif err is not None:
                    failed.append((f"backend '{backend.name}' endpoint {ep.address}", err))
        if failed:
            first = failed[0][1]
            total = len(answers) + len(failed)
            detail = "; ".join(f"{where}: {err.message}" for where, err in failed)
            raise UpstreamError(f"{kind} settings failed on {len(failed)} of {total} endpoints: {detail}",
                                http_status=first.http_status, grpc_code=first.grpc_code)
        if not answers:
            raise _first_failure(lacking, kind)
        return answers[0]
