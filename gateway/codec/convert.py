"""Cross-protocol inference as pure functions: prepare the outgoing message, finish
the answer. No I/O: the backends (``backends/``) call these around their own sends.

Each direction is decode → encode through the codec, which keeps tensor bytes as
memoryview slices of the received buffers: on the binary and raw paths the bytes are
copied once per direction, when the outgoing message is joined.

- HTTP → gRPC: JSON ``data`` and binary-extension inputs become
  ``raw_input_contents``; the answer's outputs go back as JSON or binary as the
  request asked (``binary_data`` per output, ``binary_data_output`` per request).
- gRPC → HTTP: raw or typed contents become a binary-extension request (JSON
  for backends with ``binary_extension: false``, e.g. MLServer); the answer goes back in
  the request's form: ``raw_output_contents`` for a raw request (tritonclient reads
  nothing else), typed ``contents`` for a typed one (as MLServer answers directly).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import (
    BadUpstreamResponse,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedEncoding,
    UpstreamEncoding,
    UpstreamTooLarge,
)
from . import grpc as grpc_codec
from . import httpdecode, httpencode
from .content import HEADER_LENGTH, decode_content, encode_content, header_length, reply_headers, sequence_key

__all__ = ["AnswerForm", "grpc_answer_to_http", "grpc_request_to_http", "http_answer_to_grpc",
           "http_answer_to_grpc_parts", "http_request_to_grpc"]

Chunks = list[bytes | memoryview]


@dataclass(frozen=True, slots=True)
class AnswerForm:
    """How an HTTP client wants its outputs: binary or JSON per output, and compression."""

    default_binary: bool
    overrides: dict[str, bool]
    accept_encoding: str | None


def http_request_to_grpc(body: bytes | bytearray | memoryview, headers: Mapping[str, str], model: str, version: str,
                         limit: int) -> tuple[list[bytes | memoryview], str | None, AnswerForm]:
    """An HTTP inference body → (ModelInferRequest as its pieces, sequence affinity, answer
    form): binary tensors are views of ``body``, not copies (grpc.encode_request_parts)."""
    body = decode_content(body, headers.get("content-encoding"), limit)
    request = httpdecode.decode_request(body, header_length(headers.get(HEADER_LENGTH), len(body)), model, version)
    default_binary, overrides = httpdecode.binary_policy(request)
    message = grpc_codec.encode_request_parts(request)
    form = AnswerForm(default_binary, overrides, headers.get("accept-encoding"))
    return message, sequence_key(request.parameters.get("sequence_id")), form


def grpc_answer_to_http(answer: bytes | memoryview, form: AnswerForm, backend: str) -> tuple[Chunks, dict[str, str]]:
    """A ModelInferResponse → (HTTP body parts, headers) in the form the client asked for."""
    try:
        response = grpc_codec.decode_response(answer)
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"backend '{backend}' sent an unreadable response: {exc.message}") from exc
    chunks, json_length = httpencode.encode_response(response, default_binary=form.default_binary,
                                                     overrides=form.overrides)
    chunks, coding = encode_content(chunks, form.accept_encoding)
    return chunks, reply_headers(json_length, coding)


def grpc_request_to_http(message: bytes | bytearray | memoryview, *, binary: bool,
                         base64_bytes: bool = False) -> tuple[Chunks, dict[str, str], bool]:
    """A ModelInferRequest → (HTTP body parts, headers, whether its data came typed — then
    so goes its answer): binary extension, or JSON only (``base64_bytes``: BYTES that are
    not UTF-8 go as MLServer's base64 content type instead of being refused)."""
    request = grpc_codec.decode_request(message)
    chunks, json_length = httpencode.encode_request(request, binary=binary, base64_bytes=base64_bytes)
    return chunks, reply_headers(json_length), grpc_codec.uses_typed_contents(message)


def http_answer_to_grpc(body: bytes | bytearray, headers: Mapping[str, str], limit: int, backend: str,
                        *, typed: bool = False, final_flag: bool = False) -> bytes:
    """A 200 HTTP inference answer → ModelInferResponse bytes (raw contents, or typed). What the
    codec refuses of the answer is the backend's fault (502), never the client's 413 / 415."""
    return b"".join(http_answer_to_grpc_parts(body, headers, limit, backend, typed=typed, final_flag=final_flag))


def http_answer_to_grpc_parts(body: bytes | bytearray, headers: Mapping[str, str], limit: int, backend: str,
                              *, typed: bool = False, final_flag: bool = False) -> list[bytes | memoryview]:
    """:func:`http_answer_to_grpc` as the message's pieces: raw outputs are views of ``body``."""
    try:
        plain = decode_content(body, headers.get("content-encoding"), limit)
    except UnsupportedEncoding as exc:
        raise UpstreamEncoding(f"backend '{backend}' answered in a Content-Encoding the gateway cannot read: "
                               f"{headers.get('content-encoding')!r}") from exc
    except PayloadTooLarge as exc:
        raise UpstreamTooLarge(f"backend '{backend}' sent an answer over max_message_bytes: {exc.message}") from exc
    try:
        # Read by Inference-Header-Content-Length, never by content type: OVMS sends
        # binary answers as application/json with that header.
        response = httpdecode.decode_response(plain, header_length(headers.get(HEADER_LENGTH), len(plain)))
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"backend '{backend}' sent an unreadable response: {exc.message}") from exc
    if final_flag:
        # Triton marks each ModelStreamInfer answer so (its decoupled-model protocol); a stream
        # through an HTTP backend of Triton answers as Triton's own gRPC side does.
        response = replace(response, parameters={**response.parameters, "triton_final_response": True})
    return grpc_codec.encode_response_parts(response, typed=typed)
