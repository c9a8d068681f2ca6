"""HTTP backends: the only HTTP client code of the gateway.

Each endpoint has a pool of keep-alive HTTP/1.1 connections (``h1``; ``http_endpoint.py``).
Pass-through bodies go out and come back as bytes, untouched — a compressed
answer reaches a client that asked for it byte for byte. A gRPC client's request
is converted (``codec/convert.py``). Foreign errors are mapped to the gateway's
error tree once, where an exchange is made (``http_exchange.py``: ``raise ... from exc``).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson

from ..admission import COST_CONVERT, COST_PASS_HTTP
from ..codec.content import HEADER_LENGTH, sequence_of_json
from ..codec.convert import grpc_request_to_http, http_answer_to_grpc_parts
from ..codec.grpc import parts_length
from ..codec.grpcframe import frame
from ..codec.repository import INDEX_REQUEST_JSON, IndexEntry, parse_index_json
from ..codec.triton import (
    config_from_json,
    control_to_json,
    log_to_json,
    log_to_pb,
    trace_to_json,
    trace_to_pb,
    version_refusal,
)
from ..config.schema import BackendSpec
from ..dataplane import AnswerSink, HttpReply, IncomingBody, StreamedMessage
from ..errors import GatewayError, InvalidRequest, ModelNotReady
from ..observability.access import AccessRecord
from ..routing.table import STATEFUL
from .base import TRITON_GRPC_PREFIX
from .h1 import BodyStream, H1Response
from .http_affinity import http_affinity
from .grpc_control import GrpcControl
from .grpc_endpoint import GrpcEndpoint
from .http_endpoint import (
    _NOT_READY_STATUS,
    HttpEndpoint,
    UpstreamReply,
    _picked,
    _relayed,
    error_from_reply,
    family_of,
    model_path,
)
from .http_exchange import HttpExchange
from .refusal import Refused
from .streams import http_stream

# (http_affinity is http_affinity.py's; proxy.py imports it from here.)
__all__ = ["STREAM_MIN", "HttpBackend", "http_affinity"]

# Pass-through answers at least this large are relayed chunk by chunk as they
# arrive instead of being held whole; large binary-extension requests stream to
# the backend the same way (the front end hands them over unread). A request in
# flight then holds a few chunks, not 2x its payload: the memory target is a peak growth of at
# most 1.5 x the payload per request in flight on the binary and raw paths (benchmarks/conversion).
STREAM_MIN = 256 * 1024
# A gRPC client's converted answer at least this large goes to it as its pieces (the outputs as
# views of the HTTP answer, through the call's AnswerSink) instead of joined into one message.
_SINK_MIN = 256 * 1024


class HttpBackend(HttpExchange):
    protocol = "http"
    serves_now = True

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        port = spec.placement.grpc_port if spec.placement is not None else 0
        self._grpc_control = GrpcControl(spec, port) if port else None

    def http_cost(self, binary: bool) -> int:
        return COST_PASS_HTTP

    def grpc_cost(self, streamed: bool = False) -> int:
        return COST_CONVERT  # (a streamed message is read whole to be converted)

    def generate_cost(self) -> int:
        return COST_PASS_HTTP

    # -- health checker ----------------------------------------------------------------
    async def check_live(self, ep: HttpEndpoint, timeout: float) -> bool:
        try:
            reply = await self._send(ep, "GET", "/v2/health/live", headers=self._check_headers, timeout=timeout,
                                     max_body=self.spec.max_check_answer_bytes)
        except (GatewayError, Refused):
            ep.family = None  # (a restarted endpoint may be another server)
            return False
        if reply.status != 200:
            return False
        if ep.family is None and self.spec.server_family == "auto":
            ep.family = await self._read_family(ep, timeout)
        return True

    async def _read_family(self, ep: HttpEndpoint, timeout: float) -> str | None:
        """The endpoint's server family from its server metadata's ``name`` (spec "Server
        Metadata"): Triton answers "triton", MLServer "mlserver", KServe's server "kserve"."""
        try:
            reply = await self._send(ep, "GET", "/v2", headers=self._check_headers, timeout=timeout,
                                     max_body=self.spec.max_check_answer_bytes)
            if reply.status != 200 or isinstance(reply.body, BodyStream):
                return "other"
            name = orjson.loads(reply.body).get("name")
        except (GatewayError, Refused):
            return None  # asked again at the next round
        except (orjson.JSONDecodeError, AttributeError):
            return "other"
        return family_of(name)

    def family(self, ep: HttpEndpoint) -> str:
        """How this endpoint's servers answer over gRPC: config ``server_family``, or read."""
        configured = self.spec.server_family
        if configured != "auto":
            return configured
        return ep.family or "other"

    async def check_index_raw(self, ep: HttpEndpoint, timeout: float) -> bytes | bytearray | None:
        headers = {"content-type": "application/json", **self._check_headers}
        try:
            reply = await self._send(ep, "POST", "/v2/repository/index", body=INDEX_REQUEST_JSON,
                                     headers=headers, timeout=timeout, max_body=self.spec.max_check_answer_bytes)
        except (GatewayError, Refused):
            return None
        if reply.status != 200 or isinstance(reply.body, BodyStream):
            return None  # no repository extension (OVMS), or restricted (Triton: 4xx)
        return reply.body

    def parse_index(self, raw: bytes | bytearray) -> list[IndexEntry]:
        return parse_index_json(raw)

    async def check_model(self, ep: HttpEndpoint, model: str, version: str, timeout: float) -> bool | None:
        """Whether the model is ready there; None: no answer (the checker keeps what it knew)."""
        try:
            reply = await self._send(ep, "GET", model_path(model, version) + "/ready",
                                     headers=self._check_headers, timeout=timeout,
                                     max_body=self.spec.max_check_answer_bytes)
            return reply.status == 200
        except (GatewayError, Refused):
            return None

    # -- client-facing ------------------------------------------------------------------
    async def model_ready(self, model: str, version: str) -> bool:
        try:
            return (await self.request("GET", model_path(model, version) + "/ready", model, version)).status == 200
        except ModelNotReady:
            return False

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        reply = await self.request("GET", model_path(model, version), model, version)
        if reply.status != 200:
            raise error_from_reply(reply)
        assert not isinstance(reply.body, BodyStream)
        return orjson.loads(reply.body)

    async def config_http(self, model: str, version: str) -> HttpReply:
        reply = await self.request("GET", f"{model_path(model, version)}/config", model, version)
        return HttpReply(reply.status, reply.body, reply.headers)

    async def config_grpc(self, message: bytes, model: str, version: str, timeout: float | None) -> bytes:
        """Triton's HTTP ``/config`` JSON as its gRPC ModelConfigResponse (codec/triton.py)."""
        reply = await self.request("GET", f"{model_path(model, version)}/config", model, version, timeout=timeout)
        if reply.status != 200:
            raise error_from_reply(reply)
        assert not isinstance(reply.body, BodyStream)
        self.on_event("http_to_grpc")
        return config_from_json(reply.body)

    async def endpoint_stats(self, ep: HttpEndpoint, model: str, version: str,
                             timeout: float | None) -> tuple[bytes, str]:
        path = f"{model_path(model, version)}/stats" if model else "/v2/models/stats"
        reply = await self._send(ep, "GET", path, timeout=timeout)
        if reply.status != 200 or isinstance(reply.body, BodyStream):
            raise error_from_reply(reply)
        return bytes(reply.body), "json"

    async def endpoint_settings(self, ep: HttpEndpoint, kind: str, model: str,
                                request: tuple[str, bytes | None]) -> tuple[str, bytes]:
        form, body = request
        if form == "pb":
            self.on_event("grpc_to_http")
            if kind == "trace":
                model, body = trace_to_json(body or b"", answer=False)
            else:
                body = log_to_json(body or b"", answer=False)
        if kind == "log":
            path = "/v2/logging"
        else:
            path = f"{model_path(model, '')}/trace/setting" if model else "/v2/trace/setting"
        if body is None:
            reply = await self._send(ep, "GET", path)
        else:
            reply = await self._send(ep, "POST", path, body=body, headers={"content-type": "application/json"})
        if reply.status != 200 or isinstance(reply.body, BodyStream):
            raise error_from_reply(reply)
        answer = bytes(reply.body)
        if form == "json":
            return "json", answer
        return "pb", trace_to_pb(answer, "", answer=True) if kind == "trace" else log_to_pb(answer, answer=True)

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: tuple[tuple[str, str], ...]) -> bytes:
        """A gRPC client's RepositoryModelLoad / Unload, converted (codec/triton.py): the
        client's credentials (metadata, either spelling) go on as the HTTP header."""
        unload = rpc == "RepositoryModelUnload"
        _, body = control_to_json(message, unload)
        given = dict(metadata)
        headers = {k: v for k, _ in self.spec.check_headers
                   if (v := given.get(k, given.get(TRITON_GRPC_PREFIX + k))) is not None}
        self.on_event("grpc_to_http")
        await self.repository_http("unload" if unload else "load", model, body, headers)
        return b""  # an empty RepositoryModel{Load,Unload}Response

    async def control(self, ep: HttpEndpoint, action: str, model: str, timeout: float) -> None:
        grpc = self._grpc_control
        if grpc is not None:  # (placement.grpc_port: Triton's HTTP traffic does not wait for it)
            other = ep.control
            if other is None or other.address.port != grpc.port:  # (a reload may move the port)
                if other is not None:
                    self._retire(other)
                other = ep.control = grpc.endpoint(ep.address)
            assert isinstance(other, GrpcEndpoint)
            await grpc.send(other, action, model, timeout)
            return
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
        try:
            reply = await self._send(ep, "POST", path, body=b"{}", timeout=timeout,
                                     headers={"content-type": "application/json", **self._check_headers},
                                     max_body=self.spec.max_check_answer_bytes)
        except Refused as exc:
            raise exc.error from exc
        if reply.status != 200:
            raise error_from_reply(reply)

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        # The client's own credentials for a restricted repository API are passed on (the
        # names check_headers uses); the gateway never adds its own key to a client's call.
        fwd = {"content-type": "application/json",
               **{k: v for k, _ in self.spec.check_headers if (v := headers.get(k)) is not None}}
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"

        async def one(ep: HttpEndpoint) -> UpstreamReply:
            reply = await self._send(ep, "POST", path, body=body, headers=fwd)
            if reply.status != 200:
                raise error_from_reply(reply)
            return reply

        results = await self.each_endpoint(one)
        self.combined(action, model, [(ep, err) for ep, _, err in results])
        reply = results[0][1]
        assert reply is not None
        return HttpReply(reply.status, reply.body, reply.headers)

    def infer_stream(self, requests: AsyncIterator[bytes], model: str, version: str,
                     timeout: float | None, affinity: str | None,
                     metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
        """Triton's ModelStreamInfer over an HTTP backend: each request of the stream becomes an
        HTTP inference on one endpoint (a stream's requests may share sequence state), its
        answer streamed back in order as a ModelStreamInferResponse; a request that fails
        carries its error in ``error_message`` and the stream goes on, as Triton's does.
        One answer per request: a decoupled model behind an HTTP backend gets the server's
        own error for it. ``timeout`` (the client's deadline) bounds the stream, not each
        request: those have the backend's ``timeout_s``."""
        return http_stream(self, requests, model, version, timeout, affinity, metadata)

    # -- inference ----------------------------------------------------------------------
    async def infer_http(self, model: str, version: str, body: bytes | bytearray | IncomingBody,
                         headers: Mapping[str, str],
                         forwarded: Sequence[str], limit: int) -> HttpReply:
        """Pass-through: the body goes out as received (streamed when large), the
        backend's status, headers and body come back unchanged, errors included."""
        fwd = _picked(headers, forwarded)
        if isinstance(body, (bytes, bytearray)) and "content-encoding" not in headers:
            affinity = sequence_of_json(body, headers.get(HEADER_LENGTH))  # (no coroutine for the common case)
        else:
            body, affinity = await http_affinity(body, headers, limit, len(self.endpoints) > 1)
        reply = await self.request("POST", self._infer_path(model, version), model, version, body=body,
                                   headers=fwd, affinity=affinity, stream_min=STREAM_MIN)
        return HttpReply(reply.status, reply.body, reply.headers)

    def _infer_path(self, model: str, version: str) -> str:
        path = self._infer_paths.get((model, version))
        if path is None:  # quoted once per model and version (bounded: names are routed ones)
            if len(self._infer_paths) >= 4096:
                self._infer_paths.clear()
            path = self._infer_paths[(model, version)] = model_path(model, version) + "/infer"
        return path

    def infer_http_now(self, model: str, version: str, body: bytes | bytearray | memoryview,
                       headers: Mapping[str, str],
                       forwarded: Sequence[str], record: AccessRecord | None,
                       done: Callable[[HttpReply | Exception | None], None]) -> bool:
        """:meth:`infer_http` for a whole, uncompressed body, without a coroutine, when the
        chosen endpoint has a kept-alive connection free (``H1ConnectionPool.request_now``):
        the answer (or the error :meth:`infer_http` would raise) goes to ``done`` from the
        connection's callbacks. False: nothing was sent (the caller awaits :meth:`infer_http`).

        ``done(None)``: what :meth:`attempt` would have sent to another endpoint — the
        endpoint could not be reached or reset the request before answering (on a fresh
        connection: the keep-alive race was retried in h1), or it said the model is not
        (or no longer) there though the checker saw it ready. The endpoint is marked as
        :meth:`attempt` marks it; nothing was answered, and the caller sends the request
        again through :meth:`infer_http`, which chooses again. Raises what
        :meth:`candidates` raises."""
        affinity = sequence_of_json(body, headers.get(HEADER_LENGTH))
        stateful = affinity is not None or STATEFUL.get()
        ep = self.candidates(model, version, affinity)[0]
        tmo = self.spec.timeout_s
        budget = self.budget

        def answered(result: H1Response | Exception) -> None:
            budget.active -= 1
            if isinstance(result, Exception):
                error = self._mapped(ep, result, tmo, stateful)
                if isinstance(error, Refused):
                    # Unreachable or reset before any answer on a fresh connection: as
                    # attempt() does, no traffic to it until a check sees it live; sent again.
                    self.transport_failed(ep, live=False)
                    self.on_event("retry")
                    done(None)
                    return
                done(error)
                return
            if ep.health.failures or ep.health.check_failures:  # live traffic is evidence too
                ep.health.succeeded()
            if result.status in _NOT_READY_STATUS and not isinstance(result.body, BodyStream):
                error = error_from_reply(self._reply(ep, result, tmo))
                if self.refusal(ep, model, version, error, True) is not error:
                    ep.health.not_ready(model, version)  # as attempt() does with the Refused
                    self.on_event("retry")
                    done(None)
                    return
            # (The answer built once, as the front end takes it: no UpstreamReply on the way.)
            done(HttpReply(result.status, self._answer_body(ep, result, tmo), _relayed(result.headers)))

        fwd = _picked(headers, forwarded)
        budget.active += 1
        if not ep.connections.request_now("POST", self._infer_path(model, version), body, fwd, tmo, STREAM_MIN,
                                          answered, not stateful):
            budget.active -= 1
            return False
        if record is not None:
            record.endpoint = str(ep.address)
            record.protocol_out = self.protocol
        return True

    async def infer_grpc(self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
                         affinity: str | None, metadata: tuple[tuple[str, str], ...],
                         sink: AnswerSink | None = None, tried: int = 0) -> bytes:
        """A gRPC client's request, converted: binary extension (or JSON) out, raw back."""
        whole = message if isinstance(message, bytes) else await message.read()
        self.on_event("grpc_to_http")
        chunks, headers, typed = grpc_request_to_http(whole, binary=self.spec.binary_extension,
                                                           base64_bytes=self._base64_bytes)
        message = whole = b""  # (mypyc compiles no del of a local)
        reply = await self.request("POST", model_path(model, version) + "/infer", model, version, body=chunks,
                                   headers={**headers, **dict(metadata)}, timeout=timeout, affinity=affinity)
        chunks = []
        if reply.status != 200:
            error = error_from_reply(reply)
            refusal = version_refusal(version)
            if refusal is not None and reply.status == 404 and error.message == "Not Found":
                # Triton's HTTP route takes only digits; its gRPC side refuses such a version so.
                raise InvalidRequest(refusal)
            raise error
        assert not isinstance(reply.body, BodyStream)  # no stream_min asked
        # The answer's form is the one the backend's servers give over gRPC: Triton's gRPC side
        # always answers raw_output_contents (tritonclient reads nothing else); MLServer and
        # KServe answer a typed request typed.
        ep = reply.endpoint
        triton = ep is not None and self.family(ep) == "triton"
        parts = http_answer_to_grpc_parts(reply.body, reply.headers, self.spec.max_message_bytes, self.name,
                                          typed=typed and not triton)
        if sink is not None and len(parts) > 1:
            n = parts_length(parts)
            if n >= _SINK_MIN and sink.open():
                # A large answer goes to the client as its pieces: the outputs' bytes are not copied.
                sink.send(frame(n))
                for part in parts:
                    sink.send(part)
                return b""
        return b"".join(parts)

    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       forwarded: Sequence[str], stream: bool) -> HttpReply:
        """Triton's generate extension, passed through (backends/generate.py)."""
        from .generate import via_http  # (it imports this module)

        return await via_http(self, model, version, body, headers, forwarded, stream)
