"""Cross-protocol inference: HTTP client → gRPC pool and gRPC client → HTTP pool.

Each direction is decode → encode → call → decode → encode through the codec,
which keeps tensor bytes as memoryview slices of the received buffers: on the
binary and raw paths the bytes are copied once per direction, when the
outgoing message is joined (the transports copy on their own beyond that).

- HTTP → gRPC: JSON ``data`` and binary-extension inputs become
  ``raw_input_contents``; the answer's outputs go back as JSON or binary as the
  request asked (``binary_data`` per output, ``binary_data_output`` per request).
- gRPC → HTTP: raw or typed contents become a binary-extension request (JSON
  for pools with ``binary_extension: false``, e.g. MLServer); the answer always
  goes back as ``raw_output_contents`` — tritonclient's gRPC client reads nothing else.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .codec import grpc as grpc_codec
from .codec import http as http_codec
from .codec.content import (
    HEADER_LENGTH,
    decode_content,
    encode_content,
    header_length,
    reply_headers,
    sequence_key,
)
from .dataplane import HttpReply, IncomingBody, pick_headers
from .errors import BadUpstreamResponse, InvalidRequest
from .upstream.http import error_from_reply, model_path

if TYPE_CHECKING:
    from .proxy import Proxy
    from .upstream.grpc import GrpcPool
    from .upstream.http import HttpPool

__all__ = ["grpc_to_http", "http_to_grpc"]


async def http_to_grpc(
    proxy: Proxy, pool: GrpcPool, model: str, version: str, body: bytes | IncomingBody,
    headers: Mapping[str, str],
) -> HttpReply:
    limit = proxy.config.max_message_bytes
    if not isinstance(body, (bytes, bytearray)):
        body = await body.read()
    body = decode_content(body, headers.get("content-encoding"), limit)
    request = http_codec.decode_request(body, header_length(headers.get(HEADER_LENGTH), len(body)), model, version)
    default_binary, overrides = http_codec.binary_policy(request)
    message = grpc_codec.encode_request(request)
    affinity = sequence_key(request.parameters.get("sequence_id"))
    del body, request  # the HTTP body is not needed while the backend works
    answer = await proxy.timed(pool, pool.infer(message, None, affinity, pick_headers(headers, proxy.context_headers)))
    del message
    try:
        response = grpc_codec.decode_response(answer)
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"backend '{pool.name}' sent an unreadable response: {exc.message}") from exc
    chunks, json_length = http_codec.encode_response(response, default_binary=default_binary, overrides=overrides)
    chunks, coding = encode_content(chunks, headers.get("accept-encoding"))
    return HttpReply(200, chunks, reply_headers(json_length, coding))


async def grpc_to_http(
    proxy: Proxy, pool: HttpPool, model: str, version: str, message: bytes, timeout: float | None,
    affinity: str | None = None, trace: tuple[tuple[str, str], ...] = (),
) -> bytes:
    request = grpc_codec.decode_request(message)
    chunks, json_length = http_codec.encode_request(request, binary=pool.backend.binary_extension)
    reply = await proxy.timed(
        pool,
        pool.request(
            "POST", model_path(model, version) + "/infer",
            body=chunks, headers={**reply_headers(json_length), **dict(trace)}, timeout=timeout, affinity=affinity,
        ),
    )
    if reply.status != 200:
        raise error_from_reply(reply)
    try:
        body = decode_content(reply.body, reply.headers.get("content-encoding"), pool.backend.max_message_bytes)
        # Read by Inference-Header-Content-Length, never by content type: OVMS sends
        # binary answers as application/json with that header.
        response = http_codec.decode_response(body, header_length(reply.headers.get(HEADER_LENGTH), len(body)))
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"backend '{pool.name}' sent an unreadable response: {exc.message}") from exc
    del reply, body
    return grpc_codec.encode_response(response)
