"""DemoPlane: the data plane of the embedded reference V2 server.

The gateway's own front ends serve it (``gateway/frontend``), so the demo
speaks HTTP and gRPC exactly as the gateway does; only the last step differs:
instead of proxying, each inference is decode → run a local model → encode
(the MLServer shape, DESIGN.md). The HTTP details follow Triton's
``http_server.cc``: the model is looked up before the body is read, request
bodies may be gzip- or deflate-encoded, and a response carrying binary
tensors is ``application/octet-stream`` with ``Inference-Header-Content-Length``.

Models are tiny, so they run inline on the event loop: a thread hop would cost
more than the compute, and the JSON work (orjson) holds the GIL either way.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from .. import __version__
from ..codec import grpc as grpc_codec
from ..codec import http as http_codec
from ..codec.content import HEADER_LENGTH, decode_content, encode_content, header_length, reply_headers
from ..codec.wire import encode_len_field, scan_infer_routing
from ..config import DEFAULT_MAX_MESSAGE_BYTES
from ..dataplane import AnswerSink, DataPlane, HttpReply, IncomingBody, Plan, StreamedMessage
from ..errors import GatewayError, Unsupported
from .models import ModelRepository, default_repository

__all__ = ["EXTENSIONS", "SERVER_NAME", "DemoPlane"]

SERVER_NAME = "oip-gateway-demo"
# Only what this server really implements: the binary tensor data extension
# (Triton's name for it). No shared memory, statistics, model control, ...
EXTENSIONS = ("binary_tensor_data",)



class DemoPlane(DataPlane):
    """A :class:`gateway.dataplane.DataPlane` answering from a :class:`ModelRepository`."""

    def __init__(
        self,
        repository: ModelRepository | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.repository = repository if repository is not None else default_repository()
        # Bounds a decompressed request body, as the front end bounds the received one.
        self.max_message_bytes = max_message_bytes

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    async def model_ready(self, model: str, version: str) -> bool:
        return self.repository.is_ready(model, version)

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return self.repository.metadata(model, version)

    async def model_extension_http(self, model: str, version: str, what: str) -> HttpReply:
        self.repository.resolve(model, version)  # an unknown model is still NOT_FOUND
        raise Unsupported(f"the reference server has no model {what} (a Triton extension)")

    async def model_extension_grpc(self, rpc: str, message: bytes, model: str, version: str,
                                   timeout: float | None) -> bytes:
        self.repository.resolve(model, version)
        raise Unsupported(f"the reference server does not implement {rpc} (a Triton extension)")

    async def infer_http(
        self, model: str, version: str, body: bytes | bytearray | IncomingBody, headers: Mapping[str, str],
        plan: Plan | None = None,
    ) -> HttpReply:
        target = self.repository.resolve(model, version)
        whole = body if isinstance(body, (bytes, bytearray)) else await body.read_view()
        plain = decode_content(whole, headers.get("content-encoding"), self.max_message_bytes)
        json_length = header_length(headers.get(HEADER_LENGTH), len(plain))
        request = http_codec.decode_request(plain, json_length, model, version)
        response = target.infer(request)
        default_binary, overrides = http_codec.binary_policy(request)
        chunks, json_length = http_codec.encode_response(
            response, default_binary=default_binary, overrides=overrides
        )
        chunks, coding = encode_content(chunks, headers.get("accept-encoding"))
        return HttpReply(200, chunks, reply_headers(json_length, coding))

    async def infer_grpc(
        self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
        affinity: str | None = None, metadata: Sequence[tuple[str, str]] = (), sink: AnswerSink | None = None,
        tried: int = 0,
    ) -> bytes:
        # ``timeout`` is moot: the models answer in microseconds, inline.
        whole = message if isinstance(message, bytes) else await message.read()
        target = self.repository.resolve(model, version)
        request = grpc_codec.decode_request(whole)
        return grpc_codec.encode_response(target.infer(request))

    async def infer_stream(self, first: bytes, rest: AsyncIterator[bytes], model: str, version: str,
                           timeout: float | None, affinity: str | None = None,
                           metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[bytes]:
        """Each request answered in turn, as Triton does for a model that is not
        decoupled; a failed request gets ModelStreamInferResponse.error_message and the
        stream goes on (Triton's behaviour)."""
        async def every() -> AsyncIterator[bytes]:
            yield first
            async for message in rest:
                yield message

        async for message in every():
            m, v, _ = scan_infer_routing(message)
            try:
                answer = await self.infer_grpc(message, m, v, timeout)
            except GatewayError as err:
                text = err.message.encode()
                yield encode_len_field(1, len(text)) + text  # error_message
                continue
            yield encode_len_field(2, len(answer)) + answer  # infer_response
