"""The gateway's data plane: route → pick → call → answer. No transport-server code.

Same protocol in and out is pass-through: the HTTP body or the serialized gRPC
message is forwarded untouched and the backend's answer returned untouched
(DESIGN.md "The hot path"). Crossing protocols goes through the codec
(``gateway/convert.py``), which keeps tensor bytes as memoryviews.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from . import __version__, convert
from ._pb import grpc_predict_v2_pb2 as pb
from .budget import ByteBudget
from .codec.content import HEADER_LENGTH, inflate_prefix, sequence_of_compressed, sequence_of_json
from .codec.wire import scan_infer_routing
from .config.schema import GatewayConfig
from .dataplane import TRACE_HEADERS, ClientDisconnected, HttpReply, IncomingBody, pick_headers
from .errors import GatewayError, InvalidRequest, ModelNotFound, Overloaded, Unsupported
from .observability.metrics import UNROUTED, Metrics
from .routing.table import RouteTable
from .upstream.grpc import GrpcPool
from .upstream.health import HealthChecker
from .upstream.http import HttpPool, error_from_reply, model_path

__all__ = ["EXTENSIONS", "Proxy", "build_pools"]

Pool = HttpPool | GrpcPool

# What the gateway itself supports end to end (spec "Server Metadata": the
# extensions field). The binary tensor extension is carried on every path.
EXTENSIONS = ["binary_tensor_data"]

# Request headers that matter to a V2 backend; everything else (host,
# content-length, connection) belongs to the hop and is not forwarded.
_FORWARDED = ("content-type", "inference-header-content-length", "content-encoding", "accept-encoding")

# Pass-through answers at least this large are relayed chunk by chunk as they
# arrive instead of being held whole; large binary-extension requests stream to
# the backend the same way (the front end hands them over unread). A request in
# flight then holds a few chunks, not 2x its payload (issue 3's memory target).
STREAM_MIN = 256 * 1024


def build_pools(config: GatewayConfig) -> dict[str, Pool]:
    return {
        name: (HttpPool(b) if b.protocol == "http" else GrpcPool(b)) for name, b in config.backends.items()
    }


def _metadata_to_dict(msg: Any) -> dict[str, Any]:
    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]

    out: dict[str, Any] = {"name": msg.name}
    if msg.versions:
        out["versions"] = list(msg.versions)
    out["platform"] = msg.platform
    out["inputs"] = tensors(msg.inputs)
    out["outputs"] = tensors(msg.outputs)
    return out


class Admission:
    """Bytes of inference request bodies in flight in this process, held against
    ``max_inflight_bytes`` (0: unbounded, only counted). Over the limit a request is
    refused at once (503 / UNAVAILABLE: retry later), before its body is read or sent."""

    __slots__ = ("budget", "gauge")

    def __init__(self, limit: int, gauge: Any) -> None:
        self.budget = ByteBudget(limit)
        self.gauge = gauge

    def enter(self, n: int) -> None:
        if not self.budget.take(n):
            raise Overloaded(f"gateway overloaded: {self.budget.used} bytes of requests in flight, {n} more "
                             f"would pass max_inflight_bytes ({self.budget.limit}); retry later")
        self.gauge.set(self.budget.used)

    def leave(self, n: int) -> None:
        self.budget.give(n)
        self.gauge.set(self.budget.used)


class Proxy:
    """Implements :class:`gateway.dataplane.DataPlane` by forwarding to backend pools."""

    def __init__(
        self,
        config: GatewayConfig,
        pools: dict[str, Pool],
        table: RouteTable,
        health: HealthChecker,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.pools = pools
        self.table = table
        self.health = health
        self.metrics = metrics
        # Set on SIGTERM when drain_s > 0: "not ready" while still serving.
        self.draining = False
        self.admission = Admission(config.max_inflight_bytes, metrics.inflight_bytes)
        # Client headers / gRPC metadata passed on to backends, on every path.
        self.context_headers = frozenset(TRACE_HEADERS) | frozenset(config.forward_headers)
        self._http_forwarded = (*_FORWARDED, *sorted(self.context_headers))

    # -- server-level answers are the gateway's own ------------------------------
    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return self.health.ready and not self.draining

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "oip-gateway", "version": __version__, "extensions": list(EXTENSIONS)}

    def route_label(self, model: str, version: str) -> str:
        try:
            return self.table.resolve(model, version).label
        except Exception:
            return UNROUTED

    def _pool(self, model: str, version: str) -> Pool:
        return self.pools[self.table.resolve(model, version).backend]

    async def timed(self, pool: Pool, coro):
        """Await a backend call, recording its duration and any failure under the pool's name."""
        start = time.perf_counter()
        try:
            return await coro
        except ClientDisconnected:
            raise  # the client left while its body streamed upstream: not the backend's failure
        except Exception as exc:
            self.metrics.upstream_errors.labels(pool.name, type(exc).__name__).inc()
            raise
        finally:
            self.metrics.upstream_seconds.labels(pool.name).observe(time.perf_counter() - start)

    # -- model-level answers come from a backend of the routed pool -------------
    async def model_ready(self, model: str, version: str) -> bool:
        try:
            pool = self._pool(model, version)
        except ModelNotFound:
            # A readiness probe gets "not ready", as Triton answers for a model it
            # does not have (HTTP 400, gRPC ready=false) — not an error.
            return False
        if isinstance(pool, HttpPool):
            reply = await self.timed(pool, pool.request("GET", model_path(model, version) + "/ready"))
            return reply.status == 200
        resp = await self.timed(pool, pool.call("ModelReady", pb.ModelReadyRequest(name=model, version=version)))
        return bool(resp.ready)

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        pool = self._pool(model, version)
        if isinstance(pool, HttpPool):
            reply = await self.timed(pool, pool.request("GET", model_path(model, version)))
            if reply.status != 200:
                raise error_from_reply(reply)
            return orjson.loads(reply.body)
        resp = await self.timed(
            pool, pool.call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version))
        )
        return _metadata_to_dict(resp)

    # -- Triton's per-model extensions (model configuration, statistics) --------
    # Same protocol only: the answers are Triton's own messages (model_config.proto),
    # which the V2 spec does not define, so they are relayed, never converted.
    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        pool = self._pool(model, version)
        if not isinstance(pool, HttpPool):
            raise Unsupported(f"model {what} of '{model}': backend '{pool.name}' speaks gRPC; Triton's "
                              "model configuration and statistics are relayed only between the same protocols")
        reply = await self.timed(pool, pool.request("GET", f"{model_path(model, version)}/{what}"))
        return HttpReply(reply.status, reply.body, reply.headers)

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        pool = self._pool(model, version)
        if not isinstance(pool, GrpcPool):
            raise Unsupported(f"{rpc} of '{model}': backend '{pool.name}' speaks HTTP; Triton's model "
                              "configuration and statistics are relayed only between the same protocols")
        return await self.timed(pool, pool.raw(rpc, message, timeout))

    # -- inference --------------------------------------------------------------
    async def infer_http(self, model: str, version: str, body: bytes | IncomingBody,
                         headers: Mapping[str, str]) -> HttpReply:
        size = len(body) if isinstance(body, (bytes, bytearray)) else body.length
        self.admission.enter(size)
        call = self._infer_http(model, version, body, headers)
        del body  # the call owns it: freed there as soon as it is sent or encoded
        try:
            return await call
        finally:
            self.admission.leave(size)

    async def _infer_http(self, model: str, version: str, body: bytes | IncomingBody,
                          headers: Mapping[str, str]) -> HttpReply:
        pool = self._pool(model, version)
        if isinstance(pool, HttpPool):
            fwd = {k: v for k in self._http_forwarded if (v := headers.get(k)) is not None}
            json_length = headers.get(HEADER_LENGTH)
            compressed = headers.get("content-encoding", "identity").strip().lower() != "identity"
            if compressed and len(pool.endpoints) < 2:
                affinity = None  # one endpoint: nothing to choose, nothing to inflate
            elif compressed:
                if not isinstance(body, (bytes, bytearray)) and not (json_length or "").strip().isdigit():
                    body = await body.read()  # all JSON: a sequence_id could be anywhere in it
                affinity = await self._compressed_sequence(body, json_length)
            elif isinstance(body, (bytes, bytearray)):
                affinity = sequence_of_json(body, json_length)
            elif json_length is not None and json_length.strip().isdigit():
                # Binary extension: the JSON part comes first and holds any sequence_id;
                # the tensor bytes behind it stream to the backend as they arrive.
                affinity = sequence_of_json(await body.prefix(int(json_length)), json_length)
            else:
                body = await body.read()  # all JSON: a sequence_id could be anywhere in it
                affinity = sequence_of_json(body, None)
            reply = await self.timed(
                pool, pool.request("POST", model_path(model, version) + "/infer", body=body, headers=fwd,
                                   affinity=affinity, stream_min=STREAM_MIN)
            )
            # Pass-through, errors included: the backend's status and body reach the client unchanged.
            return HttpReply(reply.status, reply.body, reply.headers)
        call = convert.http_to_grpc(self, pool, model, version, body, headers)
        del body  # freed once encoded, before the backend's answer arrives
        return await call

    async def _compressed_sequence(self, body: bytes | IncomingBody, json_length: str | None) -> str | None:
        """``sequence_id`` of a gzip/deflate body bound for a pool of several endpoints. A
        binary-extension body still arriving is inflated only up to its JSON part, from as
        little of it as that takes (the rest still streams)."""
        if isinstance(body, (bytes, bytearray)):
            return sequence_of_compressed(body, json_length, self.config.max_message_bytes)
        assert json_length is not None  # the caller read an all-JSON body whole
        need, size = int(json_length.strip()), 1 << 16
        while True:
            raw = await body.prefix(size)
            out = inflate_prefix(raw, need)
            if out is None or len(out) >= need or len(raw) < size:
                return sequence_of_json(out, json_length) if out else None
            size *= 4

    async def infer_grpc(self, message: bytes, model: str, version: str, timeout: float | None,
                         affinity: str | None = None, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        size = len(message)
        self.admission.enter(size)
        try:
            return await self._infer_grpc(message, model, version, timeout, affinity,
                                          pick_headers(metadata, self.context_headers))
        finally:
            self.admission.leave(size)

    async def _infer_grpc(self, message: bytes, model: str, version: str, timeout: float | None,
                          affinity: str | None, trace: tuple[tuple[str, str], ...]) -> bytes:
        pool = self._pool(model, version)
        if isinstance(pool, GrpcPool):
            return await self.timed(pool, pool.infer(message, timeout, affinity, trace))
        return await convert.grpc_to_http(self, pool, model, version, message, timeout, affinity, trace)

    async def infer_stream(self, first: bytes, rest: AsyncIterator[bytes], model: str, version: str,
                           timeout: float | None, affinity: str | None = None,
                           metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[bytes]:
        """ModelStreamInfer pass-through to the gRPC pool of the first request's route.
        Every later request must route to the same pool (one stream, one backend
        connection); one that does not ends the stream with INVALID_ARGUMENT after the
        answers to the requests before it."""
        pool = self._pool(model, version)
        if not isinstance(pool, GrpcPool):
            raise Unsupported(f"ModelStreamInfer for model '{model}': backend '{pool.name}' speaks HTTP, "
                              "which has no streaming inference; route it to a gRPC pool")
        refused: list[GatewayError] = []

        async def requests() -> AsyncIterator[bytes]:
            yield first
            async for message in rest:
                m, v, _ = scan_infer_routing(message)
                try:
                    if not m:
                        raise InvalidRequest("ModelInferRequest.model_name is required")
                    if self.table.resolve(m, v).backend != pool.name:
                        raise InvalidRequest(
                            f"model '{m}' routes to another backend than this stream's ('{pool.name}'): "
                            "open one stream per backend")
                except GatewayError as err:
                    refused.append(err)
                    return  # half-close: the backend answers what it has, then the stream ends
                yield message

        async for answer in pool.stream(requests(), timeout, affinity, pick_headers(metadata, self.context_headers)):
            yield answer
        if refused:
            raise refused[0]
