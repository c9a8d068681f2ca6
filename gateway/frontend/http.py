"""The HTTP/REST front end (spec "HTTP/REST"): inference through :class:`~.infer.HttpInference`
(no ASGI), everything else through a Starlette app: health, metadata, readiness, Triton's
extensions (model configuration, statistics, repository index and control, trace and log
settings, shared memory refused by name), generate (generate.py) and the first-generation API
(v1_http.py).

Errors are mapped once (answers.py): a GatewayError becomes ``{"error": ...}`` with its status; a
backend's own error body is relayed unchanged; anything else is logged and becomes a plain 500.
Measured, Starlette's layers were a third of the pass-through proxy's own CPU per request: the
inference path does not cross them.
"""
from __future__ import annotations

import functools
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
from starlette.types import Receive, Scope, Send

from ..config.security import Limits
from ..dataplane import DataPlane
from ..errors import SHARED_MEMORY_REFUSAL, GatewayError, HeadTooLarge, InvalidRequest, Unsupported, UpstreamError
from ..observability.metrics import SERVER_LEVEL, Metrics
from ..security.guard import Gate
from .answers import INTERNAL, JSON, error_response, send_error
from .generate import build_generate, generate_target
from .h1direct import DirectRoute
from .infer import HttpInference
from .inferchecks import check_depth
from .shims import endpoint_function, handler_function
from .v1_http import build_v1_http_app

__all__ = ["HttpApp", "HttpFrontEnd", "build_http_app"]

log = logging.getLogger("oip_gateway.http")

DEFAULT_LIMITS = Limits()

Handler = Callable[[Request, str, str], Awaitable[Response]]


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), 200, media_type=JSON)


class HttpApp:
    """What the HTTP listener serves: an ASGI app, and ``direct(method, path)``, the requests
    the listener serves without ASGI (``frontend/h1direct.py``)."""

    __slots__ = ("asgi", "direct")

    def __init__(self, asgi: Callable[[Scope, Receive, Send], Awaitable[None]],
                 direct: Callable[[str, str], DirectRoute | None]) -> None:
        self.asgi = asgi
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi(scope, receive, send)


class HttpFrontEnd:
    """The V2 HTTP API over one data plane: :attr:`inference` serves ``/infer``; :meth:`app` (ASGI)
    serves the rest."""

    def __init__(self, plane: DataPlane, metrics: Metrics | None, gate: Gate, *, max_message_bytes: int,
                 max_json_depth: int = 64, max_header_count: int = 100, max_header_bytes: int = 32768,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.plane = plane
        self.metrics = metrics
        self.max_json_depth = max_json_depth
        self.inference = HttpInference(plane, metrics, gate, limits, max_message_bytes=max_message_bytes,
                                       max_json_depth=max_json_depth, max_header_count=max_header_count,
                                       max_header_bytes=max_header_bytes)
        self.rest = Starlette(routes=self._routes(),
                              exception_handlers={HTTPException: handler_function(self._http_error)})
        # Triton's generate extension (frontend/generate.py): any method, so others get its 405.
        self.generate = build_generate(plane, metrics, max_message_bytes=max_message_bytes,
                                       route_label=plane.route_label,
                                       check=lambda body: check_depth(body, max_json_depth))
        # The first-generation API (/api/...), translated to V2: frontend/v1_http.py.
        self.v1 = build_v1_http_app(plane, metrics, max_message_bytes=max_message_bytes, limits=limits)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app: every request the listener does not serve directly."""
        if scope["type"] == "http":
            refusal = self.inference.head_refusal(scope["method"], scope["path"], scope.get("raw_path") or b"",
                                                  scope.get("query_string", b""), scope["headers"])
            if refusal is not None:
                await send_error(send, refusal, close=isinstance(refusal, HeadTooLarge))
                return
            if scope["path"].startswith("/api/"):
                await self.v1(scope, receive, send)
                return
            if (gen := generate_target(scope["path"])) is not None:
                await self.generate(scope, receive, send, *gen)
                return
        await self.rest(scope, receive, send)

    # -- the Starlette routes -------------------------------------------------------------
    async def _run(self, api: str, handler: Handler, request: Request) -> Response:
        start = time.perf_counter()
        params = request.path_params
        model = params.get("model", "")
        version = params.get("version", "")
        metrics = self.metrics
        access = metrics.access if metrics is not None else None
        record = access.begin(request.headers.get("x-request-id")) if access is not None else None
        try:
            response = await handler(request, model, version)
        except GatewayError as err:
            response = error_response(err)
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
        except Exception:
            log.exception("unhandled error in %s", api)
            response = Response(INTERNAL[1], INTERNAL[0], media_type=INTERNAL[2])
        if metrics is not None:
            if record is not None:
                record.bytes_out = len(response.body)
            label = self.plane.route_label(model, version) if model else SERVER_LEVEL
            metrics.observe("http", api, label, response.status_code, time.perf_counter() - start,
                            model, version, record)
        return response

    def _endpoint(self, api: str, handler: Handler) -> Callable[..., Any]:
        return endpoint_function(functools.partial(self._run, api, handler))

    # Health answers carry KServe's bodies ($live_server_response, $ready_server_response,
    # $ready_model_response: kserve-v2-data-plane text) with the status the Open Inference
    # Protocol gives; tritonclient reads only the status, KServe's SDK parses the body.
    async def live(self, request: Request, model: str, version: str) -> Response:
        ok = self.plane.server_live()
        return Response(b'{"live":true}' if ok else b'{"live":false}', 200 if ok else 400, media_type=JSON)

    async def ready(self, request: Request, model: str, version: str) -> Response:
        ok = self.plane.server_ready()
        return Response(b'{"ready":true}' if ok else b'{"ready":false}', 200 if ok else 400, media_type=JSON)

    async def server_metadata(self, request: Request, model: str, version: str) -> Response:
        return _json(self.plane.server_metadata())

    async def model_ready(self, request: Request, model: str, version: str) -> Response:
        ok = await self.plane.model_ready(model, version)
        return Response(orjson.dumps({"name": model, "ready": ok}), 200 if ok else 400, media_type=JSON)

    async def model_metadata(self, request: Request, model: str, version: str) -> Response:
        return _json(await self.plane.model_metadata(model, version))

    async def repository_index(self, request: Request, model: str, version: str) -> Response:
        raw = await request.body()
        try:
            doc = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"malformed repository index request: {exc}") from exc
        ready = isinstance(doc, dict) and doc.get("ready") is True
        return _json([e.as_json() for e in await self.plane.repository_index(ready)])

    async def model_control(self, action: str, request: Request, model: str, version: str) -> Response:
        body = await request.body()
        check_depth(body, self.max_json_depth)  # relayed as it came to a same-protocol backend
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = await self.plane.repository_http(action, model, body, headers)
        content = reply.body if isinstance(reply.body, (bytes, bytearray)) else b""
        return Response(content, reply.status, media_type=reply.headers.get("content-type", JSON))

    # Triton's trace (server-wide or per model) and log settings: GET reads, POST changes.
    async def settings(self, kind: str, request: Request, model: str, version: str) -> Response:
        body = (await request.body() or b"{}") if request.method == "POST" else None
        if body is not None:
            check_depth(body, self.max_json_depth)
        answer = await self.plane.settings(kind, model, ("json", body), body is not None)
        return Response(answer, 200, media_type=JSON)

    async def shared_memory(self, request: Request, model: str, version: str) -> Response:
        raise Unsupported(SHARED_MEMORY_REFUSAL)

    async def extension(self, what: str, request: Request, model: str, version: str) -> Response:
        reply = await self.plane.model_extension_http(model, version, what)
        body = reply.body if isinstance(reply.body, (bytes, bytearray)) else b"".join(reply.body)  # type: ignore[arg-type]
        return Response(body, reply.status, media_type=reply.headers.get("content-type", JSON))

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        # Unknown paths and wrong methods: still a V2-style JSON error.
        status = exc.status_code if isinstance(exc, HTTPException) else 400
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return Response(orjson.dumps({"error": f"{detail}: {request.method} {request.url.path}"}), status,
                        media_type=JSON)

    def _routes(self) -> list[Route]:
        endpoint = self._endpoint
        stats = functools.partial(self.extension, "stats")
        config = functools.partial(self.extension, "config")
        trace = functools.partial(self.settings, "trace")
        m = "/v2/models/{model}"
        mv = "/v2/models/{model}/versions/{version}"
        return [
            # Triton's statistics of every model (tritonclient get_inference_statistics() with no
            # name); before the model routes, which would take "stats" for a model's name.
            Route("/v2/models/stats", endpoint("model_statistics", stats), methods=["GET"]),
            Route("/v2/health/live", endpoint("server_live", self.live), methods=["GET"]),
            Route("/v2/health/ready", endpoint("server_ready", self.ready), methods=["GET"]),
            Route("/v2", endpoint("server_metadata", self.server_metadata), methods=["GET"]),
            Route(m, endpoint("model_metadata", self.model_metadata), methods=["GET"]),
            Route(mv, endpoint("model_metadata", self.model_metadata), methods=["GET"]),
            Route(m + "/ready", endpoint("model_ready", self.model_ready), methods=["GET"]),
            Route(mv + "/ready", endpoint("model_ready", self.model_ready), methods=["GET"]),
            # Triton's extensions (tritonclient get_model_config, get_inference_statistics;
            # perf_analyzer reads the config): from any backend, statistics summed over its endpoints.
            Route(m + "/config", endpoint("model_config", config), methods=["GET"]),
            Route(mv + "/config", endpoint("model_config", config), methods=["GET"]),
            Route(m + "/stats", endpoint("model_statistics", stats), methods=["GET"]),
            Route(mv + "/stats", endpoint("model_statistics", stats), methods=["GET"]),
            # Triton's repository index, merged over every backend and endpoint.
            Route("/v2/repository/index", endpoint("repository_index", self.repository_index), methods=["POST"]),
            # Model control, sent to every endpoint of the model's backend (combined answer).
            Route("/v2/repository/models/{model}/load",
                  endpoint("model_load", functools.partial(self.model_control, "load")), methods=["POST"]),
            Route("/v2/repository/models/{model}/unload",
                  endpoint("model_unload", functools.partial(self.model_control, "unload")), methods=["POST"]),
            # Triton's trace and log settings: per model to the model's backend, server-wide to every endpoint.
            Route("/v2/trace/setting", endpoint("trace_setting", trace), methods=["GET", "POST"]),
            Route(m + "/trace/setting", endpoint("trace_setting", trace), methods=["GET", "POST"]),
            Route("/v2/logging", endpoint("log_settings", functools.partial(self.settings, "log")),
                  methods=["GET", "POST"]),
            # Triton's shared-memory extension: a region lives in the memory of one host (or GPU),
            # which a network hop cannot reach — a clear refusal, never a blind relay.
            Route("/v2/systemsharedmemory{rest:path}", endpoint("shared_memory", self.shared_memory),
                  methods=["GET", "POST"]),
            Route("/v2/cudasharedmemory{rest:path}", endpoint("shared_memory", self.shared_memory),
                  methods=["GET", "POST"]),
        ]


def build_http_app(plane: DataPlane, metrics: Metrics | None, gate: Gate, *, max_message_bytes: int,
                   max_json_depth: int = 64, max_header_count: int = 100,
                   max_header_bytes: int = 32768, limits: Limits = DEFAULT_LIMITS) -> HttpApp:
    """The V2 HTTP app for the listener (h1listen.py)."""
    front = HttpFrontEnd(plane, metrics, gate, max_message_bytes=max_message_bytes, max_json_depth=max_json_depth,
                         max_header_count=max_header_count, max_header_bytes=max_header_bytes, limits=limits)
    return HttpApp(front.app, front.inference.direct)
