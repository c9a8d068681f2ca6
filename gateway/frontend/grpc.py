"""The gRPC front end (spec "GRPC"): the only grpc server code.

``inference.GRPCInferenceService`` is served by a generic handler. ModelInfer
has no deserializer: the handler receives the serialized request, reads only
fields 1–2 (model_name, model_version) from the wire, and hands the bytes to
the data plane, whose answer is returned as bytes. Errors are mapped here,
once, to the status code each GatewayError carries.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from .._pb import grpc_predict_v2_pb2 as pb
from ..codec.grpcscan import InferScan
from ..codec.repository import encode_index_pb, index_request_ready
from ..codec.wire import scan_infer_routing, scan_name_version, settings_change
from ..config.security import Limits
from ..dataplane import DataPlane
from ..errors import SHARED_MEMORY_REFUSAL, GatewayError, InvalidRequest, Unsupported
from ..grpcengine import READ_BUFFER_OPTION
from ..observability.access import AccessRecord
from ..observability.metrics import SERVER_LEVEL, Metrics, RouteLabel
from ..security.guard import Gate
from .grpcunary import CALL_METADATA, Admit, Infer, Seen, Unary, abort_with, call_metadata, failure_code, grpc_trailers
from .h2infer import InferNow
from .h2upload import Compressed, Upload

__all__ = ["SERVICE", "STREAMED_METHODS", "Service", "build_grpc_handler", "grpc_trailers", "server_options"]


SERVICE = "inference.GRPCInferenceService"
# The methods whose handler takes a dataplane.StreamedMessage (the gateway's own HTTP/2 listener
# may hand one over: a large request streaming in, a compressed one kept as it came).
STREAMED_METHODS = frozenset({f"/{SERVICE}/ModelInfer"})
DEFAULT_LIMITS = Limits()

# Triton's shared-memory RPCs (grpc_service.proto): refused with UNIMPLEMENTED and the reason.
_SHARED_MEMORY_RPCS = tuple(f"{kind}SharedMemory{op}" for kind in ("System", "Cuda")
                            for op in ("Status", "Register", "Unregister"))


def server_options(max_message_bytes: int, *, reuse_port: bool = False,
                   max_metadata_bytes: int = 32768, limits: Limits = DEFAULT_LIMITS) -> list[tuple[str, int | str]]:
    return [
        # Hard limits (config ``limits``): concurrent calls on one connection (HTTP/2's
        # SETTINGS_MAX_CONCURRENT_STREAMS, RFC 9113 section 6.5.2), and a connection with no
        # call for idle_timeout_s is closed (GOAWAY), as the HTTP listener's keep-alive is.
        ("grpc.max_concurrent_streams", limits.max_grpc_streams),
        # Connections open at once on the listener; past it gRPC closes a new one at once.
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
        ("grpc.max_metadata_size", max_metadata_bytes),
        ("grpc.optimization_target", "throughput"),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        READ_BUFFER_OPTION,  # what a client's connection keeps allocated between reads (grpcengine.py)
    ]


def _metadata_message(d: dict[str, Any]) -> pb.ModelMetadataResponse:
    def tensors(items: Any) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=t.get("name", ""), datatype=t.get("datatype", ""), shape=[int(x) for x in t.get("shape", [])]
            )
            for t in items or []
        ]

    return pb.ModelMetadataResponse(
        name=d.get("name", ""),
        versions=[str(v) for v in d.get("versions", []) or []],
        platform=d.get("platform", "") or "",
        inputs=tensors(d.get("inputs")),
        outputs=tensors(d.get("outputs")),
    )


def build_grpc_handler(plane: DataPlane, metrics: Metrics | None, gate: Gate,
                       limits: Limits = DEFAULT_LIMITS) -> Service:
    route_label: Callable[[str, str], RouteLabel] = plane.route_label

    access = metrics.access if metrics is not None else None

    def begin(context: aio.ServicerContext, request: Any) -> AccessRecord | None:
        if access is None:
            return None
        rid = next((v for k, v in call_metadata(context) if k == "x-request-id"), None)
        return access.begin(rid if isinstance(rid, str) else None,
                            len(request) if isinstance(request, (bytes, Upload, Compressed)) else 0)

    def opened(context: Any, request: bytes) -> AccessRecord | None:
        # begin(), with the record passed by hand (h2infer.py: a call served from callbacks)
        if access is None:
            return None
        rid = next((v for k, v in call_metadata(context) if k == "x-request-id"), None)
        return access.open(rid if isinstance(rid, str) else None, len(request))

    admit = Admit(gate, limits, metrics)

    def wrap(api: str, fn: Callable[[Any, aio.ServicerContext, Seen], Awaitable[Any]]):
        # The compiled method itself: the gateway's own listener (h2calls.py) awaits it with no
        # interpreted coroutine frame between. grpc.aio (the fallback) asks of every call's
        # handler whether it is async (inspect.iscoroutinefunction), which for a compiled method
        # takes inspect's slow path: ~0.27 µs more per call there.
        return Unary(api, fn, route_label, metrics, begin if access is not None else None).run

    async def server_live(req: pb.ServerLiveRequest, ctx: aio.ServicerContext, seen: Seen):
        return pb.ServerLiveResponse(live=plane.server_live())

    async def server_ready(req: pb.ServerReadyRequest, ctx: aio.ServicerContext, seen: Seen):
        return pb.ServerReadyResponse(ready=plane.server_ready())

    async def server_metadata(req: pb.ServerMetadataRequest, ctx: aio.ServicerContext, seen: Seen):
        admit(ctx, "ServerMetadata")
        return pb.ServerMetadataResponse(**plane.server_metadata())

    async def model_ready(req: pb.ModelReadyRequest, ctx: aio.ServicerContext, seen: Seen):
        if not req.name:
            raise InvalidRequest("ModelReadyRequest.name is required")
        seen.note(req.name, req.version)
        admit(ctx, "ModelReady", req.name, req.version)
        return pb.ModelReadyResponse(ready=await plane.model_ready(req.name, req.version))

    async def model_metadata(req: pb.ModelMetadataRequest, ctx: aio.ServicerContext, seen: Seen):
        if not req.name:
            raise InvalidRequest("ModelMetadataRequest.name is required")
        seen.note(req.name, req.version)
        admit(ctx, "ModelMetadata", req.name, req.version)
        return _metadata_message(await plane.model_metadata(req.name, req.version))

    scan = InferScan(limits)  # routing fields + hard limits of every ModelInferRequest
    model_infer = Infer(plane, scan, metrics.bytes_in("grpc") if metrics is not None else None, admit)
    infer_unary = Unary("infer", model_infer, route_label, metrics, begin if access is not None else None)

    async def model_stream_infer(requests: AsyncIterator[bytes], ctx: aio.ServicerContext) -> AsyncIterator[bytes]:
        """Triton's ModelStreamInfer (not in the KServe proto; tritonclient's
        start_stream / async_stream_infer, decoupled models): passed through as bytes
        to the gRPC backend the first request routes to."""
        start = time.perf_counter()
        code = "OK"
        model = version = ""
        record = begin(ctx, b"")
        try:
            first = await anext(aiter(requests), None)
            if first is None:
                return  # the client closed the stream without a request
            model, version, sequence = scan.scan(first)
            if not model:
                raise InvalidRequest("ModelInferRequest.model_name is required")
            admit(ctx, "ModelStreamInfer", model, version)
            metadata = call_metadata(ctx)
            refused: list[GatewayError] = []

            async def checked(rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
                # Every request of the stream is an inference: each one passes the limits and
                # the guard (its own model, the rate limits). A refusal ends the requests; the
                # stream then ends with the refusal's status.
                async for message in rest:
                    try:
                        m, v, _ = scan.scan(message)
                        admit(ctx, "ModelStreamInfer", m, v)
                    except GatewayError as err:
                        refused.append(err)
                        return
                    yield message

            async for answer in plane.infer_stream(first, checked(requests), model, version, ctx.time_remaining(),
                                                   sequence, metadata):
                if refused:
                    break
                yield answer
            if refused:
                raise refused[0]
        except aio.AbortError:
            raise
        except Exception as exc:
            code = failure_code(exc)
            await abort_with(ctx, exc, record, "stream_infer")
        finally:
            if metrics is not None:
                label = route_label(model, version) if model else SERVER_LEVEL  # (the backend it went to)
                metrics.observe("grpc", "stream_infer", label, code, time.perf_counter() - start, model, version,
                                record)

    def extension(rpc: str):
        # ModelConfigRequest and ModelStatisticsRequest carry name and version in
        # fields 1 and 2, as ModelInferRequest does: the same wire scan finds them.
        async def handler(message: bytes, ctx: aio.ServicerContext, seen: Seen):
            model, version, _ = scan_infer_routing(message)
            if not model and rpc != "ModelStatistics":  # no name: every model's statistics
                raise InvalidRequest(f"{rpc}Request.name is required: the gateway routes by model")
            if model:
                seen.note(model, version)
            admit(ctx, rpc, model, version)
            return await plane.model_extension_grpc(rpc, message, model, version, ctx.time_remaining())

        return handler

    async def repository_index(message: bytes, ctx: aio.ServicerContext, seen: Seen):
        admit(ctx, "RepositoryIndex")
        return encode_index_pb(await plane.repository_index(index_request_ready(message)))

    def model_control(rpc: str):
        async def handler(message: bytes, ctx: aio.ServicerContext, seen: Seen):
            _, model = scan_name_version(message)  # RepositoryModel{Load,Unload}Request: model_name is field 2
            if not model:
                raise InvalidRequest(f"{rpc}Request.model_name is required: the gateway routes by model")
            seen.note(model, "")
            admit(ctx, rpc, model)
            return await plane.repository_grpc(rpc, model, message, ctx.time_remaining(), call_metadata(ctx))

        return handler

    def settings(kind: str):
        # Triton's TraceSetting (model_name: field 2; none: server-wide) and LogSettings.
        async def handler(message: bytes, ctx: aio.ServicerContext, seen: Seen):
            model = scan_name_version(message)[1] if kind == "trace" else ""
            if model:
                seen.note(model, "")
            admit(ctx, "TraceSetting" if kind == "trace" else "LogSettings", model)
            return await plane.settings(kind, model, ("pb", message), settings_change(message))

        return handler

    async def shared_memory(message: bytes, ctx: aio.ServicerContext, seen: Seen):
        raise Unsupported(SHARED_MEMORY_REFUSAL)

    def typed(fn, req_type, resp_type):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req_type.FromString, response_serializer=resp_type.SerializeToString
        )

    handlers = {
        "ServerLive": typed(wrap("server_live", server_live), pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": typed(wrap("server_ready", server_ready), pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ServerMetadata": typed(
            wrap("server_metadata", server_metadata), pb.ServerMetadataRequest, pb.ServerMetadataResponse
        ),
        "ModelReady": typed(wrap("model_ready", model_ready), pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ModelMetadata": typed(
            wrap("model_metadata", model_metadata), pb.ModelMetadataRequest, pb.ModelMetadataResponse
        ),
        # No (de)serializers: raw bytes in, raw bytes out.
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer_unary.run),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(model_stream_infer),
        "ModelConfig": grpc.unary_unary_rpc_method_handler(wrap("model_config", extension("ModelConfig"))),
        "ModelStatistics": grpc.unary_unary_rpc_method_handler(
            wrap("model_statistics", extension("ModelStatistics"))),
        "RepositoryIndex": grpc.unary_unary_rpc_method_handler(wrap("repository_index", repository_index)),
        "RepositoryModelLoad": grpc.unary_unary_rpc_method_handler(
            wrap("model_load", model_control("RepositoryModelLoad"))),
        "RepositoryModelUnload": grpc.unary_unary_rpc_method_handler(
            wrap("model_unload", model_control("RepositoryModelUnload"))),
        "TraceSetting": grpc.unary_unary_rpc_method_handler(wrap("trace_setting", settings("trace"))),
        "LogSettings": grpc.unary_unary_rpc_method_handler(wrap("log_settings", settings("log"))),
        **{rpc: grpc.unary_unary_rpc_method_handler(wrap("shared_memory", shared_memory))
           for rpc in _SHARED_MEMORY_RPCS},
    }
    now = InferNow(infer_unary, model_infer, opened if access is not None else None)
    return Service(SERVICE, handlers, {f"/{SERVICE}/ModelInfer": now})


class Service(grpc.GenericRpcHandler):
    """``grpc.method_handlers_generic_handler`` that also keeps the call's metadata for its
    handler (grpcunary.py ``CALL_METADATA``): grpc.aio has read it already, to ask for the handler.
    ``now``: the methods the gateway's own listener may serve from callbacks (h2infer.py)."""

    def __init__(self, service: str, handlers: dict[str, grpc.RpcMethodHandler],
                 now: dict[str, InferNow] | None = None) -> None:
        self._handlers = {f"/{service}/{name}": handler for name, handler in handlers.items()}
        self.now = now or {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._handlers.get(handler_call_details.method)
        if handler is not None:
            CALL_METADATA.set(tuple(handler_call_details.invocation_metadata or ()))
        return handler
