"""A gRPC backend endpoint: its channel, the channel's options, and the calls it makes.

One channel per endpoint, max message sizes set on each (gRPC's 4 MiB default is the most
reported failure of other gateways): the gateway's own HTTP/2 client (``h2channel.py``) where
``gateway.h2.native("client")`` holds, else a ``grpc.aio`` channel. Either way the endpoint
offers the same callables — ``infer``, ``raw[name]``, ``typed[name]`` (protobuf in and out),
``stream`` — called as ``rpc(request, timeout=..., metadata=...)``. ModelInfer sends the request
bytes as received and returns the response bytes as received. What a backend does with its
endpoints' calls is ``grpc.py``'s (:class:`~.grpc.GrpcBackend`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from operator import attrgetter
from typing import Any

import grpc
from grpc import aio

from .. import h2
from .._pb import grpc_predict_v2_pb2 as pb
from ..config.schema import BackendSpec, BackendTls, HostPort
from ..dataplane import AnswerSink
from ..grpcengine import READ_BUFFER_OPTION
from .endpoints import Endpoint

__all__ = ["METHOD_PREFIX", "RAW_RPCS", "GrpcEndpoint", "channel_options"]

METHOD_PREFIX = "/inference.GRPCInferenceService/"

# Triton's extension RPCs, relayed as bytes (their messages are Triton's own,
# grpc_service.proto / model_config.proto, which the V2 spec does not define).
RAW_RPCS = ("ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
            "TraceSetting", "LogSettings")

# A unary call on an endpoint: a grpc.aio multi-callable.
_Rpc = Callable[..., Awaitable[Any]]

# An endpoint's ModelInfer callable: attrgetter is C, where a lambda is a Python frame per call.
_INFER: Callable[[GrpcEndpoint], _Rpc] = attrgetter("infer")
# ModelInfer whose answer is read whole to be converted (see GrpcEndpoint.convert).
_CONVERT: Callable[[GrpcEndpoint], _Rpc] = attrgetter("convert")


# Unary RPCs other than ModelInfer: (request type, response type).
_TYPED: dict[str, tuple[Any, Any]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
}


def channel_options(max_message_bytes: int) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # The backend retries itself (safe retries only); grpc-core's transparent-retry
        # machinery only adds per-call buffering. Measured here on a pass-through
        # proxy: +37% RPC/s with retries off, +42% with throughput tuning too.
        ("grpc.enable_retries", 0),
        ("grpc.optimization_target", "throughput"),
        # A restarted pod is reconnected within a second or two of coming back, not
        # after grpc's default backoff (up to 120 s): the health checker decides when
        # it takes traffic again.
        # (Not min_reconnect_backoff_ms: grpc also takes it as the connect timeout.)
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        READ_BUFFER_OPTION,  # what the backend connection keeps allocated between reads (grpcengine.py)
    ]


def _credentials(tls: BackendTls) -> grpc.ChannelCredentials:
    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as fh:
            return fh.read()

    return grpc.ssl_channel_credentials(read(tls.ca), read(tls.key), read(tls.cert))


class _Typed:
    """A unary call on the native channel with protobuf messages in and out."""

    __slots__ = ("method", "parse", "unary")

    def __init__(self, unary: Callable[..., Awaitable[bytes | memoryview]], method: str,
                 parse: Callable[[bytes | memoryview], Any]) -> None:
        self.unary = unary
        self.method = method
        self.parse = parse

    async def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        return self.parse(await self.unary(self.method, request.SerializeToString(), timeout, metadata))


class GrpcEndpoint(Endpoint):
    __slots__ = ("_drained", "_grace", "_inflight", "channel", "convert", "infer", "now", "raw", "relay", "stream",
                 "typed")
    channel: Any  # an h2channel.Channel or a grpc.aio.Channel: both have ``async close()``
    infer: _Rpc
    # ModelInfer for an answer read whole (converted): the gateway's own client gathers a large
    # one into one buffer as it arrives (a memoryview; h2stream.Gathered); grpc.aio's is ``infer``.
    convert: _Rpc
    # ModelInfer with its answer streamed to a sink (request, timeout, metadata, sink): the
    # gateway's own client only; None on grpc.aio, which hands a message over only whole.
    relay: Callable[[Any, float | None, Any, AnswerSink], Awaitable[bytes | memoryview]] | None
    # ModelInfer from callbacks (request, timeout, metadata, sink, then) -> the call or None
    # (``Channel.unary_now``): the gateway's own client only.
    now: Callable[[bytes, float | None, Any, AnswerSink | None, Callable[[Any], None]], Any] | None
    stream: Callable[..., Any]  # (requests, timeout=, metadata=) -> an async iterator with cancel()
    typed: dict[str, _Rpc]
    raw: dict[str, _Rpc]

    def __init__(self, address: HostPort, spec: BackendSpec) -> None:
        super().__init__(address)
        self._inflight = 0  # calls and open streams on this endpoint now
        self._grace = spec.timeout_s
        self._drained: asyncio.Event | None = None  # set when _inflight reaches 0, while closing
        self.relay = None
        self.now = None
        if h2.native("client"):
            self._native(address, spec)
            return
        opts = channel_options(spec.max_message_bytes)
        tls = spec.tls
        if tls is None:
            ch = aio.insecure_channel(str(address), options=opts)
        else:
            extra = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
            ch = aio.secure_channel(str(address), _credentials(tls), options=opts + extra)
        self.channel = ch
        # ModelInfer, every inference, through grpc.aio's public multi-callable. (grpc's Cython call
        # object awaited in the caller's own task saved ~32 k instructions per call, but only
        # through grpcio's private modules: not an interface any release keeps.)
        self.infer = ch.unary_unary(METHOD_PREFIX + "ModelInfer")
        self.convert = self.infer
        self.stream = ch.stream_stream(METHOD_PREFIX + "ModelStreamInfer")
        self.typed = {
            name: ch.unary_unary(METHOD_PREFIX + name, request_serializer=req.SerializeToString,
                                 response_deserializer=resp.FromString)
            for name, (req, resp) in _TYPED.items()
        }
        self.raw = {name: ch.unary_unary(METHOD_PREFIX + name) for name in RAW_RPCS}

    def _native(self, address: HostPort, spec: BackendSpec) -> None:
        from .h2channel import Channel, ChannelLimits  # (built only where libnghttp2 is)
        from .h2stream import GATHER_MIN

        ch = Channel(address, spec.tls, spec.max_message_bytes, ChannelLimits(connect_timeout_s=spec.connect_timeout_s))
        self.channel = ch
        # partial is C: the call goes straight to Channel.unary, no Python frame between.
        self.infer = partial(ch.unary, METHOD_PREFIX + "ModelInfer")
        self.relay = self.infer  # (Channel.unary takes the sink as its fifth argument)
        self.now = partial(ch.unary_now, METHOD_PREFIX + "ModelInfer")
        self.convert = partial(ch.unary, METHOD_PREFIX + "ModelInfer", gather=GATHER_MIN)
        self.stream = partial(ch.stream, METHOD_PREFIX + "ModelStreamInfer")
        self.typed = {name: _Typed(ch.unary, METHOD_PREFIX + name, resp.FromString)
                      for name, (_, resp) in _TYPED.items()}
        self.raw = {name: partial(ch.unary, METHOD_PREFIX + name) for name in RAW_RPCS}

    @property
    def inflight(self) -> int:
        return self._inflight

    async def close(self) -> None:
        # Calls in flight finish (within timeout_s) before the channel goes: the endpoint waits
        # for its own count, streams included. What is still in flight after that is cancelled
        # by the close.
        if self._inflight:
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), self._grace)
            except TimeoutError:
                pass
        await self.channel.close()

    def left(self) -> None:
        """A call or stream on this endpoint has ended."""
        self._inflight -= 1
        if self._drained is not None and self._inflight == 0:
            self._drained.set()
