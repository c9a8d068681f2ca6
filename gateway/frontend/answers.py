"""HTTP error answers, written in one place for every HTTP path (inference, the Starlette
routes, generate, v1): a :class:`~gateway.errors.GatewayError` becomes ``{"error": "..."}`` with
its status — or the backend's own body when it sent one — plus the headers its kind calls for;
a failure of the gateway's own becomes one fixed 500 with no detail. Also the one reader of an
ASGI request body.
"""
from __future__ import annotations

import orjson
from starlette.responses import Response
from starlette.types import Receive, Send

from ..codec.content import is_count
from ..dataplane import ClientDisconnected
from ..errors import INTERNAL_MESSAGE, GatewayError, PayloadTooLarge, UpstreamError

__all__ = ["INTERNAL", "INTERNAL_ANSWER", "JSON", "error_answer", "error_headers", "error_parts", "error_response",
           "read_body", "send_error"]

JSON = "application/json"

# The answer to a failure of the gateway's own (a bug): no traceback, no detail.
INTERNAL_ANSWER = orjson.dumps({"error": INTERNAL_MESSAGE})
INTERNAL = (500, INTERNAL_ANSWER, JSON)


def error_parts(err: GatewayError) -> tuple[int, bytes, str]:
    """(status, body, content type) of an error: the backend's own body when it sent one."""
    if isinstance(err, UpstreamError) and err.body is not None:
        return err.http_status, err.body, err.content_type or JSON
    return err.http_status, orjson.dumps({"error": err.message}), JSON


def error_headers(err: GatewayError) -> dict[str, str]:
    """Headers an error answer carries: Retry-After for load and rate refusals (RFC 9110
    section 10.2.3), WWW-Authenticate on 401 (RFC 6750 section 3)."""
    extra = {}
    if err.retry_after is not None:
        extra["retry-after"] = str(err.retry_after)
    if err.http_status == 401:
        extra["www-authenticate"] = 'Bearer realm="oip-gateway"'
    return extra


def error_response(err: GatewayError) -> Response:
    status, body, ctype = error_parts(err)
    return Response(body, status, media_type=ctype, headers=error_headers(err) or None)


def error_answer(err: GatewayError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of an error answer, headers as the wire carries them."""
    status, content, ctype = error_parts(err)
    out = [(b"content-type", ctype.encode("latin-1"))]
    out += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error_headers(err).items()]
    return status, out, content


async def send_error(send: Send, err: GatewayError, close: bool = False) -> None:
    """An error answer sent straight on the ASGI channel (before any app code ran)."""
    status, headers, body = error_answer(err)
    headers.append((b"content-length", str(len(body)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_body(receive: Receive, limit: int, declared: str | None = None) -> bytes:
    """An ASGI request's whole body, at most ``limit`` bytes (PayloadTooLarge past it, before
    reading when the Content-Length ``declared`` says so); ClientDisconnected if the client
    leaves first."""
    if declared is not None and is_count(declared) and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
