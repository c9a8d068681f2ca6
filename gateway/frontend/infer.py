"""The HTTP inference path (``POST /v2/models/{m}[/versions/{v}]/infer``), served without ASGI:
the listener (h1listen.py) hands each request the router claims (:meth:`HttpInference.direct`)
to an exchange (h1direct.py), and this class serves it — from callbacks when it can
(:meth:`~HttpInference.infer_now`), else in a task (:meth:`~HttpInference.infer`). Every request
is checked once before its body is read (:meth:`~HttpInference.head_refusal`: head limits, a UTF-8
path, name lengths, the guard), planned once by the data plane, and its body checked once.

Compiled with mypyc (setup.py): it is on every HTTP inference.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..budget import ByteBudget
from ..codec.content import decode_content, is_count
from ..codec.jsondepth import InflatingScanner
from ..codec.jsonscan import JsonScanner
from ..codec.bounds import check_names
from ..codec.limits import JSON_CHECK_MAX, JsonCheck
from ..config.security import Limits
from ..dataplane import ClientDisconnected, DataPlane, HttpReply, RouteLabel, StreamedBody, is_streamed
from ..errors import (
    BadUpstreamResponse,
    GatewayError,
    HeadTooLarge,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedEncoding,
    UpstreamError,
)
from ..gcpolicy import grown
from ..observability.access import AccessLog, AccessRecord
from ..observability.metrics import Metrics
from ..security.guard import Gate
from .answers import INTERNAL, error_answer
from .h1direct import DirectExchange, DirectRoute
from .incoming import IncomingBody as _IncomingBody
from .incoming import too_deep_message as _too_deep_message
from .inferchecks import check_depth, header_length, infer_target, json_part, utf8_path
from .kinds import http_kind

__all__ = ["HttpInference"]

log = logging.getLogger("oip_gateway.http")

# Bodies with a Content-Length above this are not read before the data plane is
# called: it gets an IncomingBody and reads it into one buffer of that size, or
# forwards it as it arrives (HTTP pass-through), never holding it whole.
_LARGE = 1 << 20

_ENCODINGS = frozenset({"", "identity", "gzip", "deflate"})

# The status logged for a request whose client left before its answer (nginx's 499).
CLIENT_LEFT = 499

# Preallocated request bodies in flight may add up to this many max-size messages.
_PREALLOC_BUDGET_MESSAGES = 4


async def _send_streamed(ex: DirectExchange, status: int, headers: list[tuple[bytes, bytes]],
                         body: StreamedBody) -> int:
    """Relay a body as it arrives; returns the bytes sent. If it breaks off after the head
    went out there is no way to send an error any more: the connection is closed and the
    client sees a truncated answer (as behind any proxy)."""
    ex.start(status, headers, body.length)  # (chunked when the length is not known)
    sent = 0
    try:
        async for chunk in body:
            # With what else came in the same pass of the loop: one write for all of it.
            parts = [chunk, *body.ready()]
            await ex.send(parts, True)
            for part in parts:
                sent += len(part)
    except GatewayError as err:
        log.warning("answer cut off after its head was sent: %s", err.message)
        ex.abort()
        return sent
    finally:
        body.close()
    await ex.send((), False)
    return sent


class HttpInference:
    """Serves HTTP inference for one listener; its collaborators are given, typed: the data
    plane, the metrics (None: not measured), the gate to the current guard, the limits."""

    def __init__(self, plane: DataPlane, metrics: Metrics | None, gate: Gate, limits: Limits, *,
                 max_message_bytes: int, max_json_depth: int, max_header_count: int, max_header_bytes: int) -> None:
        self.plane = plane
        self.metrics = metrics
        self.gate = gate
        self.limits = limits
        self.max_message_bytes = max_message_bytes
        self.max_json_depth = max_json_depth
        self.max_header_count = max_header_count
        self.max_header_bytes = max_header_bytes
        self.route_label: Callable[[str, str], RouteLabel] = plane.route_label
        self.infer_http_now: Callable[..., RouteLabel | None] = plane.infer_http_now
        # Preallocated bodies in flight are bounded: a client can declare 256 MiB and then send a
        # trickle; without a bound, a few hundred such connections would make the gateway allocate
        # (and zero) their declared sizes. Past it a body is gathered as it arrives instead.
        self.budget = ByteBudget(_PREALLOC_BUDGET_MESSAGES * max_message_bytes)
        self.access: AccessLog | None = metrics.access if metrics is not None else None
        self.long_path = limits.max_name_length + 16
        self.bytes_in = metrics.bytes_in("http") if metrics is not None else None
        self.check_json = JsonCheck(limits)
        # Each inference path's route, made once (bounded: clients choose paths).
        self._claimed: dict[str, DirectRoute | None] = {}

    def direct(self, method: str, path: str) -> DirectRoute | None:
        """The requests the listener serves without ASGI: inference."""
        if method != "POST":
            return None
        claimed = self._claimed
        try:
            return claimed[path]
        except KeyError:
            pass
        target = infer_target(path)
        route: DirectRoute | None = None
        if target is not None:
            model, version = target
            route = (lambda ex: self.infer(ex, model, version)), (lambda ex: self.infer_now(ex, model, version))
            grown()  # (long-lived: frozen out of the collector's way with the rest, gcpolicy.py)
        if len(path) <= 1024:  # (bounded in count and size: clients choose paths)
            if len(claimed) >= 4096:
                claimed.clear()
            claimed[path] = route
        return route

    def head_refusal(self, method: str, path: str, raw_path: bytes, query: bytes,
                     headers: list[tuple[bytes, bytes]]) -> GatewayError | None:
        """The checks every request passes before anything reads its body: the limits of its
        head, a path that is UTF-8, names within their limit, and who may call what."""
        size = len(raw_path) + len(query)
        for k, v in headers:
            size += len(k) + len(v)
        if len(headers) > self.max_header_count or size > self.max_header_bytes:
            head_bytes = size - len(raw_path) - len(query)
            return HeadTooLarge(f"request headers too large: {len(headers)} headers, {head_bytes} "
                                f"bytes (limits: max_header_count {self.max_header_count}, max_header_bytes "
                                f"{self.max_header_bytes})")
        # (find, not `in`: a bytes `in` first tries its operand as an integer, and the TypeError
        # it formats and drops costs more than the search.)
        if raw_path.find(b"%") >= 0 and not utf8_path(raw_path):
            # %-decoding (as ASGI's path is decoded) puts replacement characters where the bytes
            # are not UTF-8: a model name would reach a backend changed. Refused instead (a name
            # is UTF-8 text).
            return InvalidRequest("the request path is not valid UTF-8 once %-decoded")
        if len(path) > self.long_path:
            # A path long enough to hold a name over limits.max_name_length.
            try:
                _, name, version = http_kind(method, path)
                check_names(name, version, self.limits)
            except GatewayError as err:
                return err
        guard = self.gate.current
        if guard is not None:
            # Who may call what (security/guard.py), before a byte of the body is read.
            kind, model, version = http_kind(method, path)
            try:
                auth = next((v.decode("latin-1") for k, v in headers if k == b"authorization"), None)
                lower = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers} if model else None
                guard.admit(kind, model, version, auth, lower)
            except GatewayError as err:
                if self.metrics is not None:
                    self.metrics.refused("http", err)
                return err
        return None

    def check_whole(self, body: bytes | bytearray | memoryview, encoding: str | None, ihcl: str | None) -> None:
        """The checks of a body read whole, before it goes anywhere."""
        # A compressed body is checked inflated (what the backend will parse). (A view is a
        # binary body read whole past the parser: never a compressed one, h1conn.py.)
        plain = decode_content(bytes(body) if isinstance(body, memoryview) else body, encoding,
                               self.max_message_bytes) if encoding else body
        header_length(ihcl, len(plain))
        head = json_part(plain, ihcl)
        if len(head) > JSON_CHECK_MAX:
            # One scan gives the depth and the skeleton the limits read (codec/jsonscan.py), where
            # the depth count and the limits' own skeleton scan were two: callgrind counted ~2.3 M
            # instructions per MB for the depth count alone.
            scanner = JsonScanner(self.max_json_depth or -1, True)  # (0: no depth limit)
            if scanner.feed(head):
                raise InvalidRequest(_too_deep_message(self.max_json_depth))
            self.check_json.check(scanner.skeleton())  # hard limits: tensors, dims, elements, names, ids
        else:
            check_depth(head, self.max_json_depth)
            self.check_json(head)

    def reply_answer(self, reply: HttpReply) -> tuple[int, list[tuple[bytes, bytes]],
                                                   list[bytes | bytearray | memoryview], StreamedBody | None]:
        """A data self.plane's answer as the wire carries it: status, headers, body parts (or the
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

    def failure_answer(self, err: Exception, record: AccessRecord | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if isinstance(err, GatewayError):
            if record is not None and not isinstance(err, UpstreamError):
                record.reason = err.message
            return error_answer(err)
        log.error("unhandled error in infer", exc_info=err)
        status, content, ctype = INTERNAL
        return status, [(b"content-type", ctype.encode("latin-1"))], content

    def observe(self, label: RouteLabel, model: str, version: str, status: int, start: float,
                record: AccessRecord | None, length: int) -> None:
        if self.metrics is not None:
            if record is not None:
                record.bytes_out = length
            self.metrics.observe("http", "infer", label, status, time.perf_counter() - start, model, version, record)

    async def stream_answer(self, ex: DirectExchange, status: int, out_headers: list[tuple[bytes, bytes]],
                            streamed: StreamedBody, label: RouteLabel, model: str, version: str, start: float,
                            record: AccessRecord | None) -> None:
        length = await _send_streamed(ex, status, out_headers, streamed)
        self.observe(label, model, version, status, start, record, length)

    async def infer(self, ex: DirectExchange, model: str, version: str) -> None:
        """``POST /v2/models/{m}[/versions/{v}]/infer``, served without ASGI (h1direct.py)."""
        refusal = None if ex.admitted else self.head_refusal(ex.method, ex.path, ex.raw_path, ex.query, ex.headers)
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
            # Header names come lower-cased from the protocol; the data self.plane relies on it.
            headers = ex.fields or {k.decode("latin-1"): v.decode("latin-1") for k, v in ex.headers}
            if self.access is not None:
                record = self.access.begin(headers.get("x-request-id"))
            encoding = headers.get("content-encoding")
            if encoding is not None and encoding.strip().lower() not in _ENCODINGS:
                # Not passed on for a backend to puzzle over (Triton answers 501): the gateway
                # reads gzip and deflate only, on every path.
                raise UnsupportedEncoding(f"Unsupported compression type '{encoding}'; use gzip or deflate")
            declared = headers.get("content-length")
            if declared is not None and is_count(declared) and int(declared) > self.max_message_bytes:
                raise PayloadTooLarge(
                    f"request body of {declared} bytes exceeds the limit of {self.max_message_bytes} bytes")
            coding = (encoding or "").strip().lower()
            compressed = coding in ("gzip", "deflate")
            ihcl = headers.get("inference-header-content-length")
            if declared is not None and is_count(declared) and int(declared) > _LARGE:
                # Inference-Header-Content-Length counts inflated bytes of a compressed body.
                json_length = header_length(ihcl, self.max_message_bytes if compressed else int(declared))
                # The JSON part's depth and self.limits, checked as it streams by (frontend/incoming.py).
                scanner = JsonScanner(self.max_json_depth or -1, True)  # (0: no depth limit)
                scan = InflatingScanner(scanner, coding, json_length) if compressed else scanner
                incoming = _IncomingBody(ex.chunks(), int(declared), self.budget, scan,
                                         None if compressed else json_length, self.check_json.check)
                body: bytes | _IncomingBody = incoming
                size = int(declared)
            else:
                body = await ex.body(self.max_message_bytes, self.too_large)
                size = len(body)
                if not ex.checked:
                    self.check_whole(body, encoding if compressed else None, ihcl)
            if self.bytes_in is not None and not ex.resent:  # (a resent one was counted by infer_now)
                self.bytes_in.observe(size)
            if record is not None:
                record.bytes_in = size
            call = self.plane.infer_http(model, version, body, headers, ex.plan)
            del body  # the data plane owns it now: freed as soon as it is encoded/sent upstream
            status, out_headers, parts, streamed = self.reply_answer(await call)
        except ClientDisconnected:
            return
        except Exception as err:
            status, out_headers, content = self.failure_answer(err, record)
            parts = [content]
        except asyncio.CancelledError:
            if not ex.disconnected:
                raise
            # The client left while the backend worked: the listener cancelled this task (and
            # so the backend call). Logged as nginx logs it: 499, the client's doing.
            if record is not None:
                record.reason = "the client left before the answer"
            self.observe(self.route_label(model, version), model, version, CLIENT_LEFT, start, record, 0)
            return
        finally:
            if incoming is not None:
                incoming.release()  # the data plane is done with the body's buffer
        if streamed is not None:
            length = await _send_streamed(ex, status, out_headers, streamed)
        else:
            ex.respond(status, out_headers, parts)
            length = sum(len(p) for p in parts) if record is not None else 0
        self.observe(self.route_label(model, version), model, version, status, start, record, length)

    def infer_now(self, ex: DirectExchange, model: str, version: str) -> bool:
        """:func:`infer` without a task, coroutine or future, when it can be: the listener
        held the request until its whole body was here (h1conn.py: a small declared
        length), it is not compressed, and the data plane can send it at once
        (``Proxy.infer_http_now``: one plain HTTP backend with a kept-alive connection free).
        The answer is written from the backend connection's callbacks. Every check, error
        answer and metric is :func:`infer`'s. False: nothing was done; :func:`infer` serves it.

        Why: a task per request, a future per exchange and the coroutine chain through
        proxy, backend and connection cost about as much CPU as nginx spends on the whole
        request (docs/design-notes.md, "Inference from callbacks")."""
        refusal = self.head_refusal(ex.method, ex.path, ex.raw_path, ex.query, ex.headers)
        if refusal is not None:
            status, out, content = error_answer(refusal)
            ex.respond(status, out, (content,), close=isinstance(refusal, HeadTooLarge))
            return True
        ex.admitted = True  # (whichever path serves it now: the guard has counted it once)
        headers = ex.fields = {k.decode("latin-1"): v.decode("latin-1") for k, v in ex.headers}
        if "content-encoding" in headers:
            return False
        try:
            plan = ex.plan = self.plane.plan_http(model, version, headers)
        except GatewayError:
            return False  # (the task answers it, after the body's checks, as any request)
        if plan is None or not plan.now:
            return False  # the task serves it with this plan; nothing is checked twice
        start = time.perf_counter()
        body = ex.whole()
        record = self.access.open(headers.get("x-request-id")) if self.access is not None else None
        label: RouteLabel | None = None

        def answered(result: HttpReply | Exception | None) -> None:
            # Called from the backend connection's data_received (or connection_lost, or
            # the timeout's timer) once: nothing may escape into that protocol's parser.
            assert label is not None  # (set below before any answer can come: none comes synchronously)
            try:
                if result is None:  # the backend would have retried it: infer() sends it again
                    if not ex.disconnected:
                        ex.run_later(body)
                    return
                streamed = None
                if isinstance(result, Exception):
                    status, out_headers, content = self.failure_answer(result, record)
                    parts: list[bytes | bytearray | memoryview] = [content]
                else:
                    try:
                        status, out_headers, parts, streamed = self.reply_answer(result)
                    except GatewayError as err:
                        status, out_headers, content = self.failure_answer(err, record)
                        parts = [content]
                if streamed is not None:
                    ex.spawn(self.stream_answer(ex, status, out_headers, streamed, label, model, version, start,
                                                record))
                    return
                ex.respond(status, out_headers, parts)
                self.observe(label, model, version, status, start, record,
                             sum(len(p) for p in parts) if record is not None else 0)
            except Exception:
                log.exception("unhandled error answering %s", ex.path)
                ex.fail()

        checked = False
        try:
            if len(body) > self.max_message_bytes:
                raise self.too_large()
            self.check_whole(body, None, headers.get("inference-header-content-length"))
            checked = ex.checked = True
            label = self.infer_http_now(plan, model, version, body, headers, record, answered)
        except GatewayError as err:
            if checked:  # (as infer(): a body that passed its checks is counted)
                self.received(len(body), record)
            status, out_headers, content = self.failure_answer(err, record)
            ex.respond(status, out_headers, (content,))
            self.observe(self.route_label(model, version), model, version, status, start, record,
                         len(content) if record is not None else 0)
            return True
        if label is None:
            return False
        ex.taken()
        self.received(len(body), record)
        return True

    def received(self, size: int, record: AccessRecord | None) -> None:
        if self.bytes_in is not None:
            self.bytes_in.observe(size)
        if record is not None:
            record.bytes_in = size

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds the limit of {self.max_message_bytes} bytes")
