"""Triton's generate extension on the HTTP front end (docs/protocol/extension_generate.md):
``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``.

A plain ASGI handler, dispatched from ``frontend/http.py`` like inference. The JSON body
is read whole (generate bodies are small text) and handed to the data plane's optional
``generate``; its answer is JSON, or server-sent events relayed chunk by chunk as they
come — never gathered — with no Content-Length (uvicorn sends them chunked, as Triton
does). Errors before the first event are a plain ``{"error": ...}`` with their status
(extension_generate.md "generate vs. generate_stream"); a backend stream that breaks off
later ends with an error event when it broke between two events, else it is cut off.

The client may leave at any time: its disconnect is watched (uvicorn's ``receive``
yields ``http.disconnect``; its ``send`` then only drops what it is given), and the
whole exchange — the backend call, the relay — is cancelled, which closes the backend's
connection (HTTP backends: Triton cancels the request) or cancels its gRPC call.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from ..codec.generate import error_json, sse_event
from ..dataplane import ClientDisconnected, DataPlane, StreamedBody, is_streamed
from ..errors import GatewayError, UpstreamError
from .answers import INTERNAL_ANSWER, error_parts, read_body
from ..observability.metrics import Metrics, RouteLabel

__all__ = ["GenerateHandler", "build_generate", "generate_target"]

log = logging.getLogger("oip_gateway.http")

_JSON = b"application/json"
_SSE = "text/event-stream"
# A client that left before the answer's head went out (nginx's "client closed request").
_CLIENT_CLOSED = 499

GenerateHandler = Callable[[Scope, Receive, Send, str, str, bool], Awaitable[None]]


def generate_target(path: str) -> tuple[str, str, bool] | None:
    """(model, version, stream) of ``/v2/models/{m}[/versions/{v}]/generate[_stream]``, else None."""
    if not path.startswith("/v2/models/"):
        return None
    if path.endswith("/generate"):
        parts, stream = path[11:-9].split("/"), False
    elif path.endswith("/generate_stream"):
        parts, stream = path[11:-16].split("/"), True
    else:
        return None
    if len(parts) == 1 and parts[0]:
        return parts[0], "", stream
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2], stream
    return None


class _Outcome:
    __slots__ = ("finished", "label", "sent", "status")

    def __init__(self) -> None:
        self.status = _CLIENT_CLOSED  # until a head goes out
        self.sent = 0
        self.finished = False
        self.label: RouteLabel | None = None


async def _gone(receive: Receive) -> None:
    """Returns when the client has disconnected (the body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def build_generate(plane: DataPlane, metrics: Metrics | None, *, max_message_bytes: int,
                   route_label: Callable[[str, str], RouteLabel],
                   check: Callable[[bytes], None] = lambda body: None) -> GenerateHandler:
    """``check``: run on every body before it goes on (the HTTP front end's JSON nesting limit)."""
    access = metrics.access if metrics is not None else None

    async def send_whole(send: Send, out: _Outcome, status: int, body: bytes | bytearray,
                         headers: list[tuple[bytes, bytes]]) -> None:
        headers.append((b"content-length", str(len(body)).encode("latin-1")))
        out.status, out.finished = status, True
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        out.sent = len(body)

    async def relay(send: Send, out: _Outcome, status: int, body: StreamedBody,
                    headers: list[tuple[bytes, bytes]], events: bool) -> None:
        if body.length is not None:
            headers.append((b"content-length", str(body.length).encode("latin-1")))
        try:
            out.status = status
            await send({"type": "http.response.start", "status": status, "headers": headers})
            tail = b"\n\n"
            async for chunk in body:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    out.sent += len(chunk)
                    tail = (tail + chunk)[-2:]
        except GatewayError as err:
            log.warning("generate stream broke off after its head was sent: %s", err.message)
            if not (events and tail == b"\n\n"):
                return  # mid-event (or not events): left incomplete, the client sees it truncated
            # Between two events: end with an error event, as Triton ends a failed response.
            last = sse_event(error_json(err.message))
            out.finished = True
            await send({"type": "http.response.body", "body": last, "more_body": False})
            out.sent += len(last)
            return
        finally:
            body.close()  # a client that left: the backend's call stops here
        out.finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def respond(send: Send, out: _Outcome, record: Any, model: str, version: str, body: bytes,
                      headers: dict[str, str], stream: bool) -> None:
        try:
            reply = await plane.generate(model, version, body, headers, stream)
        except GatewayError as err:
            out.label = route_label(model, version)
            status, content, ctype = error_parts(err)
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
            await send_whole(send, out, status, content, [(b"content-type", ctype.encode("latin-1"))])
            return
        except Exception:
            out.label = route_label(model, version)
            log.exception("unhandled error in generate")
            await send_whole(send, out, 500, INTERNAL_ANSWER, [(b"content-type", _JSON)])
            return
        # The route's label is read in the task that routed the request (the data plane may
        # note there which side of a split it took).
        out.label = route_label(model, version)
        head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
        if isinstance(reply.body, (bytes, bytearray)):
            await send_whole(send, out, reply.status, reply.body, head)
        elif is_streamed(reply.body):
            events = reply.headers.get("content-type", "").startswith(_SSE)
            await relay(send, out, reply.status, reply.body, head, events)
        else:
            parts: Any = reply.body  # (not streamed: a sequence of parts)
            await send_whole(send, out, reply.status, b"".join(parts), head)

    async def run(receive: Receive, send: Send, out: _Outcome, record: Any, model: str, version: str,
                  body: bytes, headers: dict[str, str], stream: bool) -> None:
        """``respond`` while watching the client: if it leaves first, everything stops."""
        if metrics is not None:
            metrics.bytes_in("http").observe(len(body))
        if record is not None:
            record.bytes_in = len(body)
        work = asyncio.ensure_future(respond(send, out, record, model, version, body, headers, stream))
        gone = asyncio.ensure_future(_gone(receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done() and not out.finished:
                work.cancel()  # the client left: the backend's call and the relay stop
            await asyncio.wait((work,))
        if not work.cancelled() and work.exception() is not None:  # (respond maps every error)
            log.error("generate failed", exc_info=work.exception())

    async def handle(scope: Scope, receive: Receive, send: Send, model: str, version: str, stream: bool) -> None:
        start = time.perf_counter()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        record = access.begin(headers.get("x-request-id")) if access is not None else None
        out = _Outcome()
        try:
            body = await read_body(receive, max_message_bytes, headers.get("content-length")) \
                if scope["method"] == "POST" else None
            if body is not None:
                check(body)
        except ClientDisconnected:
            return
        except GatewayError as err:
            status, content, ctype = error_parts(err)
            await send_whole(send, out, status, content, [(b"content-type", ctype.encode("latin-1"))])
        else:
            if body is None:  # Triton's answer to any other method
                await send_whole(send, out, 405, error_json("Method Not Allowed"), [(b"content-type", _JSON)])
            else:
                await run(receive, send, out, record, model, version, body, headers, stream)
        if metrics is not None:
            if record is not None:
                record.bytes_out = out.sent
            label = out.label if out.label is not None else route_label(model, version)
            metrics.observe("http", "generate_stream" if stream else "generate", label,
                            out.status, time.perf_counter() - start, model, version, record)

    return handle
