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

import zlib
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..codec import grpc as grpc_codec
from ..codec import http as http_codec
from ..config import DEFAULT_MAX_MESSAGE_BYTES
from ..dataplane import HttpReply
from ..errors import InvalidRequest, PayloadTooLarge, Unsupported
from .models import ModelRepository, default_repository

__all__ = ["EXTENSIONS", "SERVER_NAME", "DemoPlane"]

SERVER_NAME = "oip-gateway-demo"
# Only what this server really implements: the binary tensor data extension
# (Triton's name for it). No shared memory, statistics, model control, ...
EXTENSIONS = ("binary_tensor_data",)

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
HEADER_LENGTH = "inference-header-content-length"


class DemoPlane:
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

    async def infer_http(
        self, model: str, version: str, body: bytes, headers: Mapping[str, str]
    ) -> HttpReply:
        target = self.repository.resolve(model, version)
        body = _decode_content(body, headers.get("content-encoding", ""), self.max_message_bytes)
        header_length = _header_length(headers.get(HEADER_LENGTH), len(body))
        request = http_codec.decode_request(body, header_length, model, version)
        response = target.infer(request)
        default_binary, overrides = http_codec.binary_policy(request)
        chunks, json_length = http_codec.encode_response(
            response, default_binary=default_binary, overrides=overrides
        )
        if json_length is None:
            return HttpReply(200, chunks, {"content-type": JSON})
        return HttpReply(200, chunks, {"content-type": OCTET_STREAM, HEADER_LENGTH: str(json_length)})

    async def infer_grpc(
        self, message: bytes, model: str, version: str, timeout: float | None
    ) -> bytes:
        # ``timeout`` is moot: the models answer in microseconds, inline.
        target = self.repository.resolve(model, version)
        request = grpc_codec.decode_request(message)
        return grpc_codec.encode_response(target.infer(request))


def _header_length(value: str | None, body_length: int) -> int | None:
    """Parse Inference-Header-Content-Length (binary tensor data extension)."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise InvalidRequest(f"Unable to parse Inference-Header-Content-Length, got: {value}")
    n = int(text)
    if n > body_length:
        raise InvalidRequest(f"inference header size should be in range (0, {body_length}), got: {value}")
    if n == 0:
        # Triton reads a 0 as "the whole body is one raw input tensor", a mode
        # this server does not offer.
        raise Unsupported("Inference-Header-Content-Length: 0 (a raw binary input body) is not supported")
    return n


def _decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo a gzip or deflate Content-Encoding, never inflating past ``limit`` bytes."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "deflate"):
        raise Unsupported(f"Unsupported compression type '{encoding}'; use gzip or deflate")
    try:
        # 32 + MAX_WBITS takes a zlib or a gzip header, as Triton's inflateInit2 does.
        return _inflate(body, 32 + zlib.MAX_WBITS, coding, limit)
    except zlib.error as exc:
        if coding == "deflate":
            try:  # some clients send raw deflate (no zlib header) as "deflate"
                return _inflate(body, -zlib.MAX_WBITS, coding, limit)
            except zlib.error:
                pass
        raise InvalidRequest(f"cannot decompress the {coding} request body: {exc}") from exc


def _inflate(body: bytes, wbits: int, coding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    # max_length stops a small "zip bomb" from allocating past the limit.
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit:
        raise PayloadTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise InvalidRequest(f"the {coding} request body is truncated or has trailing data")
    return out
