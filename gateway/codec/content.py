"""HTTP body framing shared by every HTTP path that decodes a body (no I/O).

- ``Inference-Header-Content-Length`` parsing (binary data extension: the JSON
  header's length; the binary section follows it).
- Content-Encoding: requests with gzip or deflate bodies are accepted as
  Triton accepts them (http_server.cc: inflateInit2 with 32 + MAX_WBITS, so a
  zlib or a gzip header); responses are compressed when Accept-Encoding asks
  (tritonclient's ``response_compression_algorithm``). Decompression is bounded
  so a small "zip bomb" cannot allocate past the body limit.
"""
from __future__ import annotations

import zlib

import orjson

from ..errors import InvalidRequest, PayloadTooLarge, Unsupported, UnsupportedEncoding
from .jsondup import check_unique, members

__all__ = [
    "HEADER_LENGTH",
    "JSON",
    "OCTET_STREAM",
    "decode_content",
    "encode_content",
    "header_length",
    "is_count",
    "reply_headers",
    "sequence_key",
    "sequence_of_json",
]

HEADER_LENGTH = "inference-header-content-length"
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


def is_count(text: str) -> bool:
    """ASCII digits only: a byte count, a version, a length read from the network.
    ``str.isdigit()`` also takes '²', which ``int()`` then refuses."""
    return text.isascii() and text.isdigit()


def header_length(value: str | None, body_length: int) -> int | None:
    """Parse Inference-Header-Content-Length; None when absent (the body is all JSON)."""
    if value is None:
        return None
    text = value.strip()
    if not is_count(text):
        raise InvalidRequest(f"Unable to parse Inference-Header-Content-Length, got: {value}")
    n = int(text)
    if n > body_length:
        raise InvalidRequest(f"inference header size should be in range (0, {body_length}), got: {value}")
    if n == 0:
        # Triton reads a 0 as "the whole body is one raw input tensor", a mode
        # that cannot cross protocols (the tensor has no name, type or shape).
        raise Unsupported("Inference-Header-Content-Length: 0 (a raw binary input body) is not supported")
    return n


def decode_content(body: bytes | bytearray | memoryview, encoding: str | None,
                   limit: int) -> bytes | bytearray | memoryview:
    """Undo a gzip or deflate Content-Encoding, never inflating past ``limit`` bytes."""
    coding = (encoding or "").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"Unsupported compression type '{encoding}'; use gzip or deflate")
    try:
        return _inflate(body, 32 + zlib.MAX_WBITS, coding, limit)
    except zlib.error as exc:
        if coding == "deflate":
            try:  # some clients send raw deflate (no zlib header) as "deflate"
                return _inflate(body, -zlib.MAX_WBITS, coding, limit)
            except zlib.error:
                pass
        raise InvalidRequest(f"cannot decompress the {coding} body: {exc}") from exc


def inflate_prefix(raw: bytes | bytearray, n: int) -> bytes | None:
    """Up to ``n`` bytes inflated from the start of a gzip / zlib / raw-deflate stream,
    which may be cut short (a prefix of a body still arriving); None if it is not one."""
    for wbits in (32 + zlib.MAX_WBITS, -zlib.MAX_WBITS):
        try:
            return zlib.decompressobj(wbits).decompress(raw, n)
        except zlib.error:
            continue
    return None


def sequence_of_compressed(raw: bytes | bytearray, header_length_value: str | None, limit: int) -> str | None:
    """``parameters.sequence_id`` of a gzip/deflate pass-through request. With
    Inference-Header-Content-Length (which counts the *uncompressed* JSON) only that
    much is inflated, so ``raw`` may be a prefix; an all-JSON body must be whole."""
    text = (header_length_value or "").strip()
    n = int(text) if is_count(text) else limit
    out = inflate_prefix(raw, n)
    return sequence_of_json(out, header_length_value) if out else None


def _inflate(body: bytes | bytearray | memoryview, wbits: int, coding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise InvalidRequest(f"the {coding} body is truncated or has trailing data")
    return out


def _accepted(accept_encoding: str | None) -> str | None:
    """The first of gzip/deflate the client accepts (q=0 excluded), else None."""
    if not accept_encoding:
        return None
    for part in accept_encoding.split(","):
        token, _, q = part.strip().partition(";")
        token = token.strip().lower()
        if token in ("gzip", "deflate") and q.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            return token
    return None


def encode_content(
    chunks: list[bytes | memoryview], accept_encoding: str | None
) -> tuple[list[bytes | memoryview], str | None]:
    """Compress a response body when the client asked for gzip or deflate."""
    coding = _accepted(accept_encoding)
    if coding is None:
        return chunks, None
    comp = zlib.compressobj(6, zlib.DEFLATED, 31 if coding == "gzip" else zlib.MAX_WBITS)
    out: list[bytes | memoryview] = [comp.compress(c) for c in chunks]
    out.append(comp.flush())
    return out, coding


def reply_headers(json_length: int | None, content_encoding: str | None = None) -> dict[str, str]:
    """Response headers as Triton sets them: octet-stream + header length when binary bytes follow."""
    headers = {"content-type": JSON} if json_length is None else {
        "content-type": OCTET_STREAM, HEADER_LENGTH: str(json_length)}
    if content_encoding:
        headers["content-encoding"] = content_encoding
    return headers


def sequence_key(value: object) -> str | None:
    """A ``sequence_id`` parameter as an affinity key; None for absent, 0, "" or other types
    (Triton: 0 means "not part of a sequence")."""
    if isinstance(value, bool) or value in (None, 0, ""):
        return None
    if isinstance(value, (int, str)):
        return str(value)
    return None


_SEQUENCE = b'"sequence_id"'


def sequence_of_json(body: bytes | bytearray | memoryview, header_length_value: str | None) -> str | None:
    """``parameters.sequence_id`` of a pass-through JSON (or binary-extension) request.

    The body is not parsed unless its JSON part mentions ``"sequence_id"`` at all (one
    C-speed ``find``), so requests outside sequences cost next to nothing. Compressed
    bodies are not looked into: they are spread like any other request.
    """
    end = len(body)
    if header_length_value is not None:
        text = header_length_value.strip()
        if is_count(text):
            end = min(int(text), end)
    if isinstance(body, memoryview):  # (a binary body read whole: its JSON part is small)
        body = bytes(body[:end])
    if body.find(_SEQUENCE, 0, end) < 0:
        return None
    part = memoryview(body)[:end]
    try:
        doc = orjson.loads(part)
    except orjson.JSONDecodeError:
        return None  # malformed: the backend will say so
    if not isinstance(doc, dict):
        return None
    # A repeated name would route by the last sequence_id while the backend reads the first
    # (codec/jsondup.py): refused. (A body read whole was refused already by the limits check;
    # a streamed one is checked there once its JSON part has gone by — after it is routed.)
    check_unique(part, members(doc), "request")
    params = doc.get("parameters")
    return sequence_key(params.get("sequence_id")) if isinstance(params, dict) else None
