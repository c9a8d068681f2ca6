"""The HTTP/REST front end (spec "HTTP/REST"): the only Starlette code.

Six V2 endpoints. The route comes from the URL; an inference body is read
once (bounded by ``max_message_bytes``) and handed to the data plane as bytes.
Errors are mapped here, once: a GatewayError becomes ``{"error": ...}`` with
its status; a backend's own error body is relayed unchanged; anything else is
logged and becomes a plain 500 with no traceback.
"""
from __future__ import annotations

import functools
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..budget import ByteBudget
from ..codec.content import decode_content, is_count
from ..codec.jsondepth import InflatingScanner, too_deep
from ..codec.jsonscan import JsonScanner
from ..codec.limits import JsonCheck, check_names
from ..config.security import Limits
from ..dataplane import ClientDisconnected, DataPlane, HttpReply, StreamedBody, is_streamed
from ..errors import (
    SHARED_MEMORY_REFUSAL,
    BadUpstreamResponse,
    GatewayError,
    HeadTooLarge,
    InvalidRequest,
    PayloadTooLarge,
    Unsupported,
    UnsupportedEncoding,
    UpstreamError,
)
from ..security.guard import Gate
from ..observability.access import AccessRecord
from ..observability.metrics import SERVER_LEVEL, UNROUTED, Metrics, RouteLabel
from .generate import build_generate, generate_target
from .h1direct import DirectExchange, DirectRoute
from .incoming import IncomingBody as _IncomingBody
from .incoming import too_deep_message as _too_deep_message
from .kinds import http_kind
from .shims import endpoint_function, handler_function
from .v1_http import build_v1_http_app

__all__ = ["HttpApp", "build_http_app", "error_response"]

log = logging.getLogger("oip_gateway.http")

JSON = "application/json"
DEFAULT_LIMITS = Limits()


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


_INTERNAL = (500, orjson.dumps({"error": "internal gateway error"}), JSON)


# Bodies with a Content-Length above this are not read before the data plane is
# called: it gets an IncomingBody and reads it into one buffer of that size, or
# forwards it as it arrives (HTTP pass-through), never holding it whole.
_LARGE = 1 << 20


_ENCODINGS = frozenset({"", "identity", "gzip", "deflate"})


def json_part(body: bytes | bytearray | memoryview, json_length: str | None) -> bytes | bytearray | memoryview:
    """The JSON of an inference body: all of it, or its first Inference-Header-Content-Length bytes."""
    if json_length is not None and is_count(json_length) and int(json_length) <= len(body):
        return memoryview(body)[: int(json_length)]
    return body


def check_depth(body: bytes | bytearray | memoryview, limit: int) -> None:
    """Refuse a JSON body nesting deeper than ``limit`` (codec/jsondepth.py: a scan, not a parse)."""
    if limit and too_deep(body, limit):
        raise InvalidRequest(_too_deep_message(limit))


def _header_length(value: str | None, body_length: int) -> int | None:
    """Inference-Header-Content-Length, checked (binary extension): a number within the body."""
    if value is None:
        return None
    text = value.strip()
    if not is_count(text) or int(text) > body_length:
        raise InvalidRequest(f"Inference-Header-Content-Length {value!r} is not a byte count within the "
                             f"{body_length}-byte body")
    return int(text)


async def _send_streamed(ex: DirectExchange, status: int, headers: list[tuple[bytes, bytes]],
                         body: StreamedBody) -> int:
    """Relay a body as it arrives; returns the bytes sent. If it breaks off after the head
    went out there is no way to send an error any more: the connection is closed and the
    client sees a truncated answer (as behind any proxy)."""
    ex.start(status, headers, body.length)  # (chunked when the length is not known)
    sent = 0
    try:
        async for chunk in body:
            await ex.send(chunk, True)
            sent += len(chunk)
    except GatewayError as err:
        log.warning("answer cut off after its head was sent: %s", err.message)
        ex.abort()
        return sent
    finally:
        body.close()
    await ex.send(b"", False)
    return sent


class HttpApp:
    """The V2 HTTP app: an ASGI app, and ``direct(method, path)``, the requests the
    listener serves without ASGI (``frontend/h1direct.py``)."""

    __slots__ = ("asgi", "direct")

    def __init__(self, asgi: ASGIApp, direct: Callable[[str, str], DirectRoute | None]) -> None:
        self.asgi = asgi
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi(scope, receive, send)


def _infer_target(path: str) -> tuple[str, str] | None:
    """(model, version) of ``/v2/models/{m}[/versions/{v}]/infer``, else None."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], ""
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def _utf8_path(raw_path: bytes) -> bool:
    try:
        urllib.parse.unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), 200, media_type=JSON)


# Preallocated request bodies in flight may add up to this many max-size messages.
_PREALLOC_BUDGET_MESSAGES = 4


def build_http_app(plane: DataPlane, metrics: Metrics | None, gate: Gate, *, max_message_bytes: int,
                   max_json_depth: int = 64, max_header_count: int = 100,
                   max_header_bytes: int = 32768, limits: Limits = DEFAULT_LIMITS) -> HttpApp:
    """The V2 HTTP app. Inference (the hot path) is served by a plain ASGI handler
    — no Request/Response objects, no middleware stack, one string split to find
    the model — and everything else by a Starlette app; measured, Starlette's
    layers were a third of the pass-through proxy's own CPU per request."""
    route_label: Callable[[str, str], RouteLabel] = plane.route_label
    # Preallocated bodies in flight are bounded: a client can declare 256 MiB and then send a
    # trickle; without a bound, a few hundred such connections would make the gateway allocate
    # (and zero) their declared sizes. Past it a body is gathered as it arrives instead.
    budget = ByteBudget(_PREALLOC_BUDGET_MESSAGES * max_message_bytes)

    access = metrics.access if metrics is not None else None
    long_path = limits.max_name_length + 16

    # The route table's handlers are closures one level deep and take their parameters by
    # functools.partial: mypyc (setup.py) loses an async function nested two levels deep.
    async def run_endpoint(api: str, handler: Callable[[Request, str, str], Awaitable[Response]],
                           request: Request) -> Response:
        start = time.perf_counter()
        params = request.path_params
        model = params.get("model", "")
        version = params.get("version", "")
        record = access.begin(request.headers.get("x-request-id")) if access is not None else None
        try:
            response = await handler(request, model, version)
        except GatewayError as err:
            response = error_response(err)
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
        except Exception:
            log.exception("unhandled error in %s", api)
            response = Response(_INTERNAL[1], _INTERNAL[0], media_type=_INTERNAL[2])
        if metrics is not None:
            if record is not None:
                record.bytes_out = len(response.body)
            label = route_label(model, version) if model else SERVER_LEVEL
            metrics.observe("http", api, label, response.status_code, time.perf_counter() - start,
                            model, version, record)
        return response

    def endpoint(api: str, handler: Callable[[Request, str, str], Awaitable[Response]]) -> Callable[..., Any]:
        return endpoint_function(functools.partial(run_endpoint, api, handler))

    # Health answers carry KServe's bodies ($live_server_response, $ready_server_response,
    # $ready_model_response: kserve-v2-data-plane text) with the status the Open Inference
    # Protocol gives; tritonclient reads only the status, KServe's SDK parses the body.
    async def live(request: Request, model: str, version: str) -> Response:
        ok = plane.server_live()
        return Response(b'{"live":true}' if ok else b'{"live":false}', 200 if ok else 400, media_type=JSON)

    async def ready(request: Request, model: str, version: str) -> Response:
        ok = plane.server_ready()
        return Response(b'{"ready":true}' if ok else b'{"ready":false}', 200 if ok else 400, media_type=JSON)

    async def server_metadata(request: Request, model: str, version: str) -> Response:
        return _json(plane.server_metadata())

    async def model_ready(request: Request, model: str, version: str) -> Response:
        ok = await plane.model_ready(model, version)
        return Response(orjson.dumps({"name": model, "ready": ok}), 200 if ok else 400, media_type=JSON)

    async def model_metadata(request: Request, model: str, version: str) -> Response:
        return _json(await plane.model_metadata(model, version))

    def head_refusal(method: str, path: str, raw_path: bytes, query: bytes,
                     headers: list[tuple[bytes, bytes]]) -> GatewayError | None:
        """The checks every request passes before anything reads its body: the limits of its
        head, a path that is UTF-8, names within their limit, and who may call what."""
        size = len(raw_path) + len(query)
        for k, v in headers:
            size += len(k) + len(v)
        if len(headers) > max_header_count or size > max_header_bytes:
            head_bytes = size - len(raw_path) - len(query)
            return HeadTooLarge(f"request headers too large: {len(headers)} headers, {head_bytes} "
                                f"bytes (limits: max_header_count {max_header_count}, max_header_bytes "
                                f"{max_header_bytes})")
        # (find, not `in`: a bytes `in` first tries its operand as an integer, and the TypeError
        # it formats and drops costs more than the search.)
        if raw_path.find(b"%") >= 0 and not _utf8_path(raw_path):
            # uvicorn decodes %-escapes with replacement characters: a model name would
            # reach a backend changed. Refused instead (a name is UTF-8 text).
            return InvalidRequest("the request path is not valid UTF-8 once %-decoded")
        if len(path) > long_path:
            # A path long enough to hold a name over limits.max_name_length.
            try:
                _, name, version = http_kind(method, path)
                check_names(name, version, limits)
            except GatewayError as err:
                return err
        guard = gate.current
        if guard is not None:
            # Who may call what (security/guard.py), before a byte of the body is read.
            kind, model, version = http_kind(method, path)
            try:
                auth = next((v.decode("latin-1") for k, v in headers if k == b"authorization"), None)
                lower = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers} if model else None
                guard.admit(kind, model, version, auth, lower)
            except GatewayError as err:
                if metrics is not None:
                    metrics.refused("http", err)
                return err
        return None

    bytes_in = metrics.bytes_in("http") if metrics is not None else None

    check_json = JsonCheck(limits)

    def check_whole(body: bytes | bytearray | memoryview, encoding: str | None, ihcl: str | None) -> None:
        """The checks of a body read whole, before it goes anywhere."""
        # A compressed body is checked inflated (what the backend will parse). (A view is a
        # binary body read whole past the parser: never a compressed one, h1listen.py.)
        plain = decode_content(bytes(body) if isinstance(body, memoryview) else body, encoding,
                               max_message_bytes) if encoding else body
        _header_length(ihcl, len(plain))
        head = json_part(plain, ihcl)
        check_depth(head, max_json_depth)
        check_json(head)  # hard limits: tensors, dims, elements, names, ids

    def reply_answer(reply: HttpReply) -> tuple[int, list[tuple[bytes, bytes]],
                                                   list[bytes | bytearray | memoryview], StreamedBody | None]:
        """A data plane's answer as the wire carries it: status, headers, body parts (or the
        streamed body)."""
        out_headers = []
        for k, v in reply.headers.items():
            value = v.encode("latin-1")
            if value.find(b"\r") >= 0 or value.find(b"\n") >= 0:  # never relay a header that could split the answer
                raise BadUpstreamResponse(f"backend header {k!r} holds a line break")
            out_headers.append((k.encode("latin-1"), value))
        body = reply.body
        if isinstance(body, (bytes, bytearray)):
            return reply.status, out_headers, [body], None
        if is_streamed(body):
            return reply.status, out_headers, [], body
        parts = list(body)  # type: ignore[arg-type]  # (not streamed: a sequence of parts)
        # Each part goes to the transport as it is (uvloop sends a memoryview without
        # copying it): the tensor bytes are not joined into one more copy of the answer.
        return reply.status, out_headers, [p if isinstance(p, (bytes, bytearray)) else memoryview(p).cast("B")
                                           for p in parts], None

    def failure_answer(err: Exception, record: AccessRecord | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if isinstance(err, GatewayError):
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
            return error_answer(err)
        log.error("unhandled error in infer", exc_info=err)
        status, content, ctype = _INTERNAL
        return status, [(b"content-type", ctype.encode("latin-1"))], content

    def observe(label: RouteLabel, model: str, version: str, status: int, start: float,
                record: AccessRecord | None, length: int) -> None:
        if metrics is not None:
            if record is not None:
                record.bytes_out = length
            metrics.observe("http", "infer", label, status, time.perf_counter() - start, model, version, record)

    async def stream_answer(ex: DirectExchange, status: int, out_headers: list[tuple[bytes, bytes]],
                            streamed: StreamedBody, label: RouteLabel, model: str, version: str, start: float,
                            record: AccessRecord | None) -> None:
        length = await _send_streamed(ex, status, out_headers, streamed)
        observe(label, model, version, status, start, record, length)

    async def infer(ex: DirectExchange, model: str, version: str) -> None:
        """``POST /v2/models/{m}[/versions/{v}]/infer``, served without ASGI (h1direct.py)."""
        refusal = None if ex.admitted else head_refusal(ex.method, ex.path, ex.raw_path, ex.query, ex.headers)
        if refusal is not None:
            status, out, content = error_answer(refusal)
            ex.respond(status, out, (content,), close=isinstance(refusal, HeadTooLarge))
            return
        start = time.perf_counter()
        streamed: StreamedBody | None = None
        incoming: _IncomingBody | None = None
        record = None
        parts: list[bytes | bytearray | memoryview]
        try:
            # Header names come lower-cased from the protocol; the data plane relies on it.
            headers = ex.fields or {k.decode("latin-1"): v.decode("latin-1") for k, v in ex.headers}
            if access is not None:
                record = access.begin(headers.get("x-request-id"))
            encoding = headers.get("content-encoding")
            if encoding is not None and encoding.strip().lower() not in _ENCODINGS:
                # Not passed on for a backend to puzzle over (Triton answers 501): the gateway
                # reads gzip and deflate only, on every path.
                raise UnsupportedEncoding(f"Unsupported compression type '{encoding}'; use gzip or deflate")
            declared = headers.get("content-length")
            if declared is not None and is_count(declared) and int(declared) > max_message_bytes:
                raise PayloadTooLarge(
                    f"request body of {declared} bytes exceeds the limit of {max_message_bytes} bytes")
            coding = (encoding or "").strip().lower()
            compressed = coding in ("gzip", "deflate")
            ihcl = headers.get("inference-header-content-length")
            if declared is not None and is_count(declared) and int(declared) > _LARGE:
                # Inference-Header-Content-Length counts inflated bytes of a compressed body.
                json_length = _header_length(ihcl, max_message_bytes if compressed else int(declared))
                # The JSON part's depth and limits, checked as it streams by (frontend/incoming.py).
                scanner = JsonScanner(max_json_depth or -1, True)  # (0: no depth limit)
                scan = InflatingScanner(scanner, coding, json_length) if compressed else scanner
                incoming = _IncomingBody(ex.chunks(), int(declared), budget, scan,
                                         None if compressed else json_length, check_json.check)
                body: bytes | _IncomingBody = incoming
                size = int(declared)
            else:
                body = await ex.body(max_message_bytes, too_large)
                size = len(body)
                if not ex.checked:
                    check_whole(body, encoding if compressed else None, ihcl)
            if bytes_in is not None and not ex.resent:  # (a resent one was counted by infer_now)
                bytes_in.observe(size)
            if record is not None:
                record.bytes_in = size
            call = plane.infer_http(model, version, body, headers, ex.plan)
            del body  # the data plane owns it now: freed as soon as it is encoded/sent upstream
            status, out_headers, parts, streamed = reply_answer(await call)
        except ClientDisconnected:
            return
        except Exception as err:
            status, out_headers, content = failure_answer(err, record)
            parts = [content]
        finally:
            if incoming is not None:
                incoming.release()  # the data plane is done with the body's buffer
        if streamed is not None:
            length = await _send_streamed(ex, status, out_headers, streamed)
        else:
            ex.respond(status, out_headers, parts)
            length = sum(len(p) for p in parts) if record is not None else 0
        observe(route_label(model, version), model, version, status, start, record, length)

    infer_http_now = plane.infer_http_now

    def infer_now(ex: DirectExchange, model: str, version: str) -> bool:
        """:func:`infer` without a task, coroutine or future, when it can be: the listener
        held the request until its whole body was here (h1listen.py: a small declared
        length), it is not compressed, and the data plane can send it at once
        (``Proxy.infer_http_now``: one plain HTTP pool with a kept-alive connection free).
        The answer is written from the backend connection's callbacks. Every check, error
        answer and metric is :func:`infer`'s. False: nothing was done; :func:`infer` serves it.

        Why: a task per request, a future per exchange and the coroutine chain through
        proxy, pool and connection cost about as much CPU as nginx spends on the whole
        request (docs/design-notes.md, "Inference from callbacks")."""
        refusal = head_refusal(ex.method, ex.path, ex.raw_path, ex.query, ex.headers)
        if refusal is not None:
            status, out, content = error_answer(refusal)
            ex.respond(status, out, (content,), close=isinstance(refusal, HeadTooLarge))
            return True
        ex.admitted = True  # (whichever path serves it now: the guard has counted it once)
        headers = ex.fields = {k.decode("latin-1"): v.decode("latin-1") for k, v in ex.headers}
        if "content-encoding" in headers:
            return False
        try:
            plan = ex.plan = plane.plan_http(model, version, headers)
        except GatewayError:
            return False  # (the task answers it, after the body's checks, as any request)
        if plan is None or not plan.now:
            return False  # the task serves it with this plan; nothing is checked twice
        start = time.perf_counter()
        body = ex.whole()
        record = access.open(headers.get("x-request-id")) if access is not None else None
        label: RouteLabel | None = None

        def answered(result: HttpReply | Exception | None) -> None:
            # Called from the backend connection's data_received (or connection_lost, or
            # the timeout's timer) once: nothing may escape into that protocol's parser.
            assert label is not None  # (set below before any answer can come: none comes synchronously)
            try:
                if result is None:  # the pool would have retried it: infer() sends it again
                    if not ex.disconnected:
                        ex.run_later(body)
                    return
                streamed = None
                if isinstance(result, Exception):
                    status, out_headers, content = failure_answer(result, record)
                    parts: list[bytes | bytearray | memoryview] = [content]
                else:
                    try:
                        status, out_headers, parts, streamed = reply_answer(result)
                    except GatewayError as err:
                        status, out_headers, content = failure_answer(err, record)
                        parts = [content]
                if streamed is not None:
                    ex.spawn(stream_answer(ex, status, out_headers, streamed, label, model, version, start, record))
                    return
                ex.respond(status, out_headers, parts)
                observe(label, model, version, status, start, record,
                        sum(len(p) for p in parts) if record is not None else 0)
            except Exception:
                log.exception("unhandled error answering %s", ex.path)
                ex.fail()

        checked = False
        try:
            if len(body) > max_message_bytes:
                raise too_large()
            check_whole(body, None, headers.get("inference-header-content-length"))
            checked = ex.checked = True
            label = infer_http_now(plan, model, version, body, headers, record, answered)
        except GatewayError as err:
            if checked:  # (as infer(): a body that passed its checks is counted)
                received(len(body), record)
            status, out_headers, content = failure_answer(err, record)
            ex.respond(status, out_headers, (content,))
            observe(route_label(model, version), model, version, status, start, record,
                    len(content) if record is not None else 0)
            return True
        if label is None:
            return False
        ex.taken()
        received(len(body), record)
        return True

    def received(size: int, record: AccessRecord | None) -> None:
        if bytes_in is not None:
            bytes_in.observe(size)
        if record is not None:
            record.bytes_in = size

    def too_large() -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds the limit of {max_message_bytes} bytes")

    async def repository_index(request: Request, model: str, version: str) -> Response:
        index = plane.repository_index
        raw = await request.body()
        try:
            doc = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"malformed repository index request: {exc}") from exc
        ready = isinstance(doc, dict) and doc.get("ready") is True
        return _json([e.as_json() for e in await index(ready)])

    async def model_control_handler(action: str, request: Request, model: str, version: str) -> Response:
        control = plane.repository_http
        body = await request.body()
        check_depth(body, max_json_depth)  # relayed as it came to a same-protocol pool
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = await control(action, model, body, headers)
        content = reply.body if isinstance(reply.body, (bytes, bytearray)) else b""
        return Response(content, reply.status, media_type=reply.headers.get("content-type", JSON))

    def model_control(action: str) -> Callable[[Request, str, str], Awaitable[Response]]:
        return functools.partial(model_control_handler, action)

    # Triton's trace (server-wide or per model) and log settings: GET reads, POST changes.
    async def settings_handler(kind: str, request: Request, model: str, version: str) -> Response:
        change = plane.settings
        body = (await request.body() or b"{}") if request.method == "POST" else None
        if body is not None:
            check_depth(body, max_json_depth)
        answer = await change(kind, model, ("json", body), body is not None)
        return Response(answer, 200, media_type=JSON)

    def settings(kind: str) -> Callable[[Request, str, str], Awaitable[Response]]:
        return functools.partial(settings_handler, kind)

    async def shared_memory(request: Request, model: str, version: str) -> Response:
        raise Unsupported(SHARED_MEMORY_REFUSAL)

    async def extension_handler(what: str, request: Request, model: str, version: str) -> Response:
        reply = await plane.model_extension_http(model, version, what)
        body = reply.body if isinstance(reply.body, (bytes, bytearray)) else b"".join(reply.body)  # type: ignore[arg-type]
        return Response(body, reply.status, media_type=reply.headers.get("content-type", JSON))

    def extension(what: str) -> Callable[[Request, str, str], Awaitable[Response]]:
        return functools.partial(extension_handler, what)

    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version}"
    routes = [
        # Triton's statistics of every model (tritonclient get_inference_statistics() with no
        # name); before the model routes, which would take "stats" for a model's name.
        Route("/v2/models/stats", endpoint("model_statistics", extension("stats")), methods=["GET"]),
        Route("/v2/health/live", endpoint("server_live", live), methods=["GET"]),
        Route("/v2/health/ready", endpoint("server_ready", ready), methods=["GET"]),
        Route("/v2", endpoint("server_metadata", server_metadata), methods=["GET"]),
        Route(m, endpoint("model_metadata", model_metadata), methods=["GET"]),
        Route(mv, endpoint("model_metadata", model_metadata), methods=["GET"]),
        Route(m + "/ready", endpoint("model_ready", model_ready), methods=["GET"]),
        Route(mv + "/ready", endpoint("model_ready", model_ready), methods=["GET"]),
        # Triton's extensions (tritonclient get_model_config, get_inference_statistics;
        # perf_analyzer reads the config): from any pool, statistics summed over its endpoints.
        Route(m + "/config", endpoint("model_config", extension("config")), methods=["GET"]),
        Route(mv + "/config", endpoint("model_config", extension("config")), methods=["GET"]),
        Route(m + "/stats", endpoint("model_statistics", extension("stats")), methods=["GET"]),
        Route(mv + "/stats", endpoint("model_statistics", extension("stats")), methods=["GET"]),
        # Triton's repository index, merged over every pool and endpoint.
        Route("/v2/repository/index", endpoint("repository_index", repository_index), methods=["POST"]),
        # Model control, sent to every endpoint of the model's pool (combined answer).
        Route("/v2/repository/models/{model}/load", endpoint("model_load", model_control("load")), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", endpoint("model_unload", model_control("unload")),
              methods=["POST"]),
        # Triton's trace and log settings: per model to the model's pool, server-wide to every endpoint.
        Route("/v2/trace/setting", endpoint("trace_setting", settings("trace")), methods=["GET", "POST"]),
        Route(m + "/trace/setting", endpoint("trace_setting", settings("trace")), methods=["GET", "POST"]),
        Route("/v2/logging", endpoint("log_settings", settings("log")), methods=["GET", "POST"]),
        # Triton's shared-memory extension: a region lives in the memory of one host (or GPU),
        # which a network hop cannot reach — a clear refusal, never a blind relay.
        Route("/v2/systemsharedmemory{rest:path}", endpoint("shared_memory", shared_memory),
              methods=["GET", "POST"]),
        Route("/v2/cudasharedmemory{rest:path}", endpoint("shared_memory", shared_memory), methods=["GET", "POST"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        # Unknown paths and wrong methods: still a V2-style JSON error.
        status = exc.status_code if isinstance(exc, HTTPException) else 400
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return Response(orjson.dumps({"error": f"{detail}: {request.method} {request.url.path}"}), status,
                        media_type=JSON)

    rest = Starlette(routes=routes, exception_handlers={HTTPException: handler_function(http_error)})

    # Triton's generate extension (frontend/generate.py): any method, so others get its 405.
    generate = build_generate(plane, metrics, max_message_bytes=max_message_bytes, route_label=route_label,
                              check=lambda body: check_depth(body, max_json_depth))

    # The first-generation API (/api/...), translated to V2: frontend/v1_http.py.
    v1 = build_v1_http_app(plane, metrics, max_message_bytes=max_message_bytes, limits=limits)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = head_refusal(scope["method"], scope["path"], scope.get("raw_path") or b"",
                                   scope.get("query_string", b""), scope["headers"])
            if refusal is not None:
                await send_error(send, refusal, close=isinstance(refusal, HeadTooLarge))
                return
            if scope["path"].startswith("/api/"):
                await v1(scope, receive, send)
                return
            if (gen := generate_target(scope["path"])) is not None:
                await generate(scope, receive, send, *gen)
                return
        await rest(scope, receive, send)

    claimed: dict[str, DirectRoute | None] = {}

    def direct(method: str, path: str) -> DirectRoute | None:
        """The requests the listener serves without ASGI: inference (each path's answer
        made once; bounded, as clients choose paths)."""
        if method != "POST":
            return None
        try:
            return claimed[path]
        except KeyError:
            pass
        target = _infer_target(path)
        route: DirectRoute | None = None
        if target is not None:
            model, version = target
            route = (lambda ex: infer(ex, model, version)), (lambda ex: infer_now(ex, model, version))
        if len(path) <= 1024:  # (bounded in count and size: clients choose paths)
            if len(claimed) >= 4096:
                claimed.clear()
            claimed[path] = route
        return route

    return HttpApp(app, direct)



