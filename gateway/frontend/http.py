"""The HTTP/REST front end (spec "HTTP/REST"): the only Starlette code.

Six V2 endpoints. The route comes from the URL; an inference body is read
once (bounded by ``max_message_bytes``) and handed to the data plane as bytes.
Errors are mapped here, once: a GatewayError becomes ``{"error": ...}`` with
its status; a backend's own error body is relayed unchanged; anything else is
logged and becomes a plain 500 with no traceback.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dataplane import DataPlane
from ..errors import GatewayError, PayloadTooLarge, UpstreamError
from ..observability.metrics import UNROUTED, Metrics

__all__ = ["build_http_app", "error_response"]

log = logging.getLogger("oip_gateway.http")

JSON = "application/json"


def error_response(err: GatewayError) -> Response:
    if isinstance(err, UpstreamError) and err.body is not None:
        return Response(err.body, err.http_status, media_type=err.content_type or JSON)
    return Response(orjson.dumps({"error": err.message}), err.http_status, media_type=JSON)


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), 200, media_type=JSON)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def build_http_app(plane: DataPlane, metrics: Metrics | None, *, max_message_bytes: int) -> Starlette:
    route_label: Callable[[str, str], str] = getattr(plane, "route_label", lambda m, v: UNROUTED)

    def endpoint(api: str, handler: Callable[[Request, str, str], Awaitable[Response]]):
        async def run(request: Request) -> Response:
            start = time.perf_counter()
            params = request.path_params
            model = params.get("model", "")
            version = params.get("version", "")
            try:
                response = await handler(request, model, version)
            except GatewayError as err:
                response = error_response(err)
            except Exception:
                log.exception("unhandled error in %s", api)
                response = Response(orjson.dumps({"error": "internal gateway error"}), 500, media_type=JSON)
            if metrics is not None:
                label = route_label(model, version) if model else ""
                metrics.observe("http", api, label, response.status_code, time.perf_counter() - start,
                                model, version)
            return response

        return run

    async def live(request: Request, model: str, version: str) -> Response:
        return Response(status_code=200 if plane.server_live() else 400)

    async def ready(request: Request, model: str, version: str) -> Response:
        return Response(status_code=200 if plane.server_ready() else 400)

    async def server_metadata(request: Request, model: str, version: str) -> Response:
        return _json(plane.server_metadata())

    async def model_ready(request: Request, model: str, version: str) -> Response:
        return Response(status_code=200 if await plane.model_ready(model, version) else 400)

    async def model_metadata(request: Request, model: str, version: str) -> Response:
        return _json(await plane.model_metadata(model, version))

    async def infer(request: Request, model: str, version: str) -> Response:
        body = await _read_body(request, max_message_bytes)
        if metrics is not None:
            metrics.request_bytes.labels("http").observe(len(body))
        headers = request.headers  # case-insensitive; lower-case lookups below
        hdr = {k: v for k, v in headers.items()}
        reply = await plane.infer_http(model, version, body, hdr)
        content = reply.body if isinstance(reply.body, bytes) else b"".join(reply.body)
        return Response(content, reply.status, headers=dict(reply.headers))

    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2/health/live", endpoint("server_live", live), methods=["GET"]),
        Route("/v2/health/ready", endpoint("server_ready", ready), methods=["GET"]),
        Route("/v2", endpoint("server_metadata", server_metadata), methods=["GET"]),
        Route(m, endpoint("model_metadata", model_metadata), methods=["GET"]),
        Route(mv, endpoint("model_metadata", model_metadata), methods=["GET"]),
        Route(m + "/ready", endpoint("model_ready", model_ready), methods=["GET"]),
        Route(mv + "/ready", endpoint("model_ready", model_ready), methods=["GET"]),
        Route(m + "/infer", endpoint("infer", infer), methods=["POST"]),
        Route(mv + "/infer", endpoint("infer", infer), methods=["POST"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        # Unknown paths and wrong methods: still a V2-style JSON error.
        status = exc.status_code if isinstance(exc, HTTPException) else 400
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return Response(orjson.dumps({"error": f"{detail}: {request.method} {request.url.path}"}), status,
                        media_type=JSON)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


