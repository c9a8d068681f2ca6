"""The first-generation gRPC service (``nvidia.inferenceserver.GRPCService``), next to V2.

API text (../shared/spec/legacy-v1-inference-server-api.txt): Health, Status and Infer
with the HealthRequest/Response, StatusRequest/Response and InferRequest/Response messages
of proto/legacy_v1.proto, plus StreamInfer (a stream of InferRequests answered in order).
As the first-generation server did, every RPC finishes with gRPC status OK and reports
success or failure in the response's ``request_status`` (a v1 client reads that), so a
failed request in a stream does not end the stream. Errors are mapped once, here, by
``codec.v1.request_status``. Registered with ``server.add_generic_rpc_handlers`` beside
the V2 handler (gateway/server.py).

The guard (security/guard.py) is the exception: a credential refused, a model not
allowed or a rate limit ends the call with its gRPC status (UNAUTHENTICATED,
PERMISSION_DENIED, RESOURCE_EXHAUSTED + retry-after), as on V2 — v1's RequestStatusCode
has no such codes, and every gRPC client reads a call's status.
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from .._pb import legacy_v1_pb2 as v1
from ..codec.bounds import check_names
from ..codec.v1 import v1_version
from ..config.security import Limits
from ..dataplane import DataPlane
from ..errors import INTERNAL_MESSAGE, GatewayError, InvalidRequest, UpstreamError
from ..observability.metrics import SERVER_LEVEL, Metrics, RouteLabel
from ..security.guard import Gate, INFER, METADATA
from .grpc import grpc_trailers
from .kinds import admit_grpc
from .v1_bridge import V1Bridge

__all__ = ["V1_SERVICE", "build_v1_grpc_handler"]

log = logging.getLogger("oip_gateway.v1")

V1_SERVICE = "nvidia.inferenceserver.GRPCService"
DEFAULT_LIMITS = Limits()


def build_v1_grpc_handler(plane: DataPlane, metrics: Metrics | None, gate: Gate, bridge: V1Bridge | None = None,
                          limits: Limits = DEFAULT_LIMITS) -> grpc.GenericRpcHandler:
    bridge = bridge or V1Bridge(plane, limits)
    route_label: Callable[[str, str], RouteLabel] = plane.route_label
    access = metrics.access if metrics is not None else None

    async def admit(ctx: aio.ServicerContext, kind: str, model: str, version: str) -> None:
        """The name limits and the guard; a refusal aborts the call with its gRPC status."""
        guard = gate.current
        try:
            check_names(model, version, limits)
            if guard is not None:
                admit_grpc(guard, kind, model, version, ctx.invocation_metadata() or ())
        except GatewayError as err:
            if metrics is not None and err.http_status in (401, 403, 429):
                metrics.refused("grpc", err)
            await ctx.abort(grpc.StatusCode[err.grpc_code], err.message, grpc_trailers(err))

    async def run(api: str, ctx: aio.ServicerContext | None, model: str, version: str,
                  call: Callable[[], Awaitable[Any]], fail: Callable[[v1.RequestStatus], Any]) -> Any:
        """One v1 call: its answer with request_status SUCCESS, or ``fail`` with the error's."""
        start = time.perf_counter()
        request_id = bridge.next_id()
        record = None
        if access is not None and ctx is not None:
            rid = next((v for k, v in ctx.invocation_metadata() or () if k == "x-request-id"), None)
            record = access.begin(rid if isinstance(rid, str) else None)
        err: GatewayError | None = None
        try:
            answer = await call()
            answer.request_status.CopyFrom(bridge.status_of(None, request_id))
        except GatewayError as exc:
            err = exc
        except Exception:
            log.exception("unhandled error in %s", api)
            err = GatewayError(INTERNAL_MESSAGE)
        if err is not None:
            answer = fail(bridge.status_of(err, request_id))
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
        if metrics is not None:
            label = route_label(model, version) if model else SERVER_LEVEL
            metrics.observe("grpc", api, label, "OK" if err is None else err.grpc_code, time.perf_counter() - start,
                            model, version, record)
        return answer

    async def health(req: v1.HealthRequest, ctx: aio.ServicerContext) -> v1.HealthResponse:
        async def call() -> v1.HealthResponse:
            if req.mode == "live":
                return v1.HealthResponse(health=bridge.live())
            if req.mode == "ready":
                return v1.HealthResponse(health=bridge.ready())
            raise InvalidRequest(f"health mode must be 'live' or 'ready', got '{req.mode}'")

        return await run("v1_health", ctx, "", "", call, lambda s: v1.HealthResponse(request_status=s))

    async def status(req: v1.StatusRequest, ctx: aio.ServicerContext) -> v1.StatusResponse:
        await admit(ctx, METADATA, req.model_name, "")

        async def call() -> v1.StatusResponse:
            return v1.StatusResponse(server_status=await bridge.status(req.model_name))

        return await run("v1_status", ctx, req.model_name, "", call, lambda s: v1.StatusResponse(request_status=s))

    async def infer_one(req: v1.InferRequest, ctx: aio.ServicerContext) -> v1.InferResponse:
        await admit(ctx, INFER, req.model_name, str(req.model_version) if req.model_version > 0 else "")

        async def call() -> v1.InferResponse:
            if not req.model_name:
                raise InvalidRequest("InferRequest.model_name is required")
            version = v1_version(req.model_version)
            header, raws = await bridge.infer(req.model_name, version, req.meta_data, {}, None, req.raw_input,
                                              ctx.time_remaining(), tuple(ctx.invocation_metadata() or ()))
            return v1.InferResponse(meta_data=header, raw_output=[bytes(r) for r in raws])

        fail = lambda s: v1.InferResponse(request_status=s)
        label_version = str(req.model_version) if req.model_version > 0 else ""
        return await run("v1_infer", ctx, req.model_name, label_version, call, fail)

    async def infer(req: v1.InferRequest, ctx: aio.ServicerContext) -> v1.InferResponse:
        return await infer_one(req, ctx)

    async def stream_infer(requests: AsyncIterator[v1.InferRequest], ctx: aio.ServicerContext
                           ) -> AsyncIterator[v1.InferResponse]:
        # One answer per request, in order; a failed one carries its error and the stream goes on.
        async for req in requests:
            yield await infer_one(req, ctx)

    def unary(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                   response_serializer=resp.SerializeToString)

    handlers = {
        "Health": unary(health, v1.HealthRequest, v1.HealthResponse),
        "Status": unary(status, v1.StatusRequest, v1.StatusResponse),
        "Infer": unary(infer, v1.InferRequest, v1.InferResponse),
        "StreamInfer": grpc.stream_stream_rpc_method_handler(
            stream_infer, request_deserializer=v1.InferRequest.FromString,
            response_serializer=v1.InferResponse.SerializeToString),
    }
    return grpc.method_handlers_generic_handler(V1_SERVICE, handlers)
