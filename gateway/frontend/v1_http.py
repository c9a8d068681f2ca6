"""The first-generation HTTP API (``/api/...``), answered by translating to V2.

API text (../shared/spec/legacy-v1-inference-server-api.txt): ``GET /api/health/live`` and
``/api/health/ready``; ``GET /api/status[/<model>]`` (ServerStatus, text format unless
``?format=binary``); ``POST /api/infer/<model>[/<version>]`` with the ``NV-InferRequest``
header (text-format InferRequestHeader) and the raw inputs as the body, in header order; the
answer's body is the raw outputs in header order, then the InferResponseHeader (text, or
binary with ``?format=binary``). Every answer carries ``NV-Status``, a one-line text-format
RequestStatus. A plain ASGI app: ``frontend/http.py`` hands it every ``/api/`` request.

Errors are mapped here, once: a GatewayError becomes its RequestStatus code
(``codec.v1.request_status``) in NV-Status and the HTTP status the V2 side gives the same
failure (400, 404, 503, 504…). The first-generation server answered 400 to every failure;
the API text only says that the status code tells success (200) from failure, and its
clients test ``!= 200`` and read NV-Status. Nothing a client sends produces a traceback.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from ..codec.v1 import parse_header_text, status_text
from ..config.security import Limits
from ..dataplane import ClientDisconnected, DataPlane
from ..errors import INTERNAL_MESSAGE, GatewayError, InvalidRequest, ModelNotFound, UpstreamError
from .answers import read_body
from ..observability.metrics import SERVER_LEVEL, Metrics, RouteLabel
from .v1_bridge import V1Bridge, path_version

__all__ = ["build_v1_http_app"]

log = logging.getLogger("oip_gateway.v1")

_TEXT = b"text/plain; charset=utf-8"
_BINARY = b"application/octet-stream"


class _Answer(Exception):
    """A finished answer raised from inside a handler (a 405 with its status line)."""

    def __init__(self, status: int, err: GatewayError) -> None:
        super().__init__(err.message)
        self.status = status
        self.err = err


def build_v1_http_app(plane: DataPlane, metrics: Metrics | None, *, max_message_bytes: int,
                      bridge: V1Bridge | None = None, limits: Limits | None = None) -> ASGIApp:
    bridge = bridge or V1Bridge(plane, limits)
    route_label: Callable[[str, str], RouteLabel] = plane.route_label
    access = metrics.access if metrics is not None else None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        path: str = scope["path"]
        method: str = scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        binary = query.get("format", [""])[-1] == "binary"
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        record = access.begin(headers.get("x-request-id")) if access is not None else None
        request_id = bridge.next_id()
        parts = path[len("/api/"):].split("/")
        api, model, version = "v1_" + (parts[0] or "unknown"), "", ""
        status, ctype = 200, _TEXT
        body: list[bytes | memoryview] = [b""]
        err: GatewayError | None = None
        try:
            if parts[0] == "health" and len(parts) == 2 and parts[1] in ("live", "ready"):
                api = "v1_health"
                _method(method, "GET")
                # API text "Health": any status but 200 means not live / not ready. The request
                # itself succeeded: NV-Status says SUCCESS (the first-generation server's answer).
                if not (bridge.live() if parts[1] == "live" else bridge.ready()):
                    status = 400
            elif parts[0] == "status" and len(parts) <= 2:
                _method(method, "GET")
                model = parts[1] if len(parts) == 2 else ""
                status_msg = await bridge.status(model)
                if binary:
                    body, ctype = [status_msg.SerializeToString()], _BINARY
                else:
                    body = [status_text(status_msg).encode("utf-8")]
            elif parts[0] == "infer" and len(parts) in (2, 3) and parts[1]:
                _method(method, "POST")
                model = parts[1]
                version = path_version(parts[2]) if len(parts) == 3 else ""
                text = headers.get("nv-inferrequest")
                if text is None:
                    raise InvalidRequest("the NV-InferRequest header is required (API text \"Inference\")")
                header, legacy = parse_header_text(text)
                data = await read_body(receive, max_message_bytes)
                if metrics is not None:
                    metrics.bytes_in("http").observe(len(data))
                if record is not None:
                    record.bytes_in = len(data)
                answer, raws = await bridge.infer(model, version, header, legacy, data, None, None,
                                                  tuple(headers.items()))
                del data
                tail = answer.SerializeToString() if binary else status_text(answer).encode("utf-8")
                body, ctype = [*raws, tail], _BINARY
            else:
                raise ModelNotFound(f"no such first-generation API endpoint: {method} {path}")
        except ClientDisconnected:
            return
        except _Answer as answer_err:
            status, err = answer_err.status, answer_err.err
        except GatewayError as exc:
            err = exc
        except Exception:
            log.exception("unhandled error in %s", api)
            err = GatewayError(INTERNAL_MESSAGE)
        if err is not None:
            if status == 200:
                status = err.http_status
            body, ctype = [], _TEXT
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
        nv_status = status_text(bridge.status_of(err, request_id), one_line=True)
        out = [(b"nv-status", nv_status.encode("latin-1")), (b"content-type", ctype)]
        if err is not None and err.retry_after is not None:
            out.append((b"retry-after", str(err.retry_after).encode("latin-1")))
        length = sum(len(p) for p in body)
        out.append((b"content-length", str(length).encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": out})
        last = len(body) - 1
        if last < 0:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        for i, part in enumerate(body):  # raw outputs go out as they are: no join
            await send({"type": "http.response.body", "body": part, "more_body": i < last})
        if metrics is not None:
            if record is not None:
                record.bytes_out = length
            label = route_label(model, version) if model else SERVER_LEVEL
            metrics.observe("http", api, label, status, time.perf_counter() - start, model, version, record)

    return app


def _method(method: str, allowed: str) -> None:
    if method != allowed:
        raise _Answer(405, InvalidRequest(f"method {method} is not allowed here; use {allowed}"))
