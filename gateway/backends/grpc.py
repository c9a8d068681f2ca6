"""gRPC backends: the only grpc client code of the gateway.

One channel per endpoint (``grpc_endpoint.py``: the gateway's own HTTP/2 client, or a
``grpc.aio`` channel; the calls it makes; ModelInfer's request and response bytes go as
received). An HTTP client's request is converted (``codec/convert.py``).

A backend is untrusted input here too (docs/design-notes.md, "Backends are untrusted input"): a
failed call is read into the error of the party at fault, or a Refused when nothing can have run,
by ``grpc_outcome.py``; only a status the backend chose is relayed as its own (UpstreamError).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any, cast

from grpc import aio

from .. import h2
from .._pb import grpc_predict_v2_pb2 as pb
from .._pb import triton_extensions_pb2 as tx
from ..admission import COST_CONVERT, COST_CONVERT_BINARY, COST_PASS_GRPC, COST_PASS_HTTP
from ..codec.convert import grpc_answer_to_http, http_request_to_grpc
from ..codec.repository import INDEX_REQUEST_PB, IndexEntry, parse_index_pb
from ..codec.triton import (
    config_to_json,
    control_from_json,
    log_to_json,
    log_to_pb,
    trace_to_json,
    trace_to_pb,
    version_refusal,
)
from ..config.schema import BackendSpec, HostPort
from ..dataplane import AnswerSink, GrpcOutcome, HttpReply, IncomingBody, Pending, StreamedMessage
from ..errors import BadUpstreamResponse, GatewayError, ModelNotReady, UpstreamError, UpstreamFraming, UpstreamReset
from ..routing.table import STATEFUL
from .base import TRITON_GRPC_PREFIX, Backend
from .grpc_endpoint import _CONVERT, _INFER, GrpcEndpoint, _Rpc, channel_options
from .grpc_outcome import call_outcome, mapped_error
from .grpcfault import Fault, fault
from .h2frames import CallError
from .refusal import Refused
from .streams import grpc_stream

# (channel_options is grpc_endpoint.py's; benchmarks/ import it from here.)
__all__ = ["Fault", "GrpcBackend", "channel_options", "fault"]


class GrpcBackend(Backend[GrpcEndpoint]):
    protocol = "grpc"

    def http_cost(self, binary: bool) -> int:
        return COST_CONVERT_BINARY if binary else COST_CONVERT

    def grpc_cost(self, streamed: bool = False) -> int:
        # A streamed message goes on as it arrives, holding about a window (h2upload.py): counted
        # as a streamed HTTP body is, at its size once.
        return COST_PASS_HTTP if streamed else COST_PASS_GRPC

    def generate_cost(self) -> int:
        return COST_CONVERT

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self.serves_grpc_now = h2.native("client")  # (grpc.aio's calls are awaited only)
        # Triton's --grpc-restricted-protocol=<api>:<key>=<value> wants the metadata key
        # "triton-grpc-protocol-<key>"; other servers take the plain name. Both are sent.
        self._check_metadata = tuple(
            pair for k, v in spec.check_headers
            for pair in ([(k, v)] if k.startswith(TRITON_GRPC_PREFIX) else [(k, v), (TRITON_GRPC_PREFIX + k, v)])
        ) or None

    def _make(self, address: HostPort) -> GrpcEndpoint:
        return GrpcEndpoint(address, self.spec)

    # -- one call on one endpoint --------------------------------------------------------
    async def _call(self, ep: GrpcEndpoint, pick: Callable[[GrpcEndpoint], _Rpc],
                    request: Any, timeout: float | None, metadata: Sequence[tuple[str, str]] | None = None,
                    model: str = "", version: str = "", refusing: bool = False, stateful: bool = False,
                    sink: AnswerSink | None = None) -> Any:
        """Raises Refused on UNAVAILABLE: the endpoint could not be reached (or went away
        before answering), so the request may go to another one. ``refusing``: a NOT_FOUND or
        INVALID_ARGUMENT answer is the endpoint's refusal too (it may lack the model another has).
        ``stateful``: a request of a sequence, sent again only if it never left (see _mapped).
        ``sink``: a ModelInfer answer may be streamed there (``GrpcEndpoint.relay``); once a byte
        of it has gone to the client, nothing is sent again, so no failure is a Refused."""
        tmo = self.spec.timeout_s if timeout is None else min(timeout, self.spec.timeout_s)
        ep._inflight += 1
        try:
            relay = ep.relay
            if sink is not None and relay is not None:
                answer = await relay(request, tmo, metadata or None, sink)
            else:
                if sink is not None and type(request) is not bytes:
                    request = bytes(await request.read())  # (a streamed request: grpcio's call takes bytes)
                elif relay is None and type(request) is list:
                    request = b"".join(request)  # (a converted request's pieces: grpcio takes one buffer)
                answer = await pick(ep)(request, timeout=tmo, metadata=metadata or None)
            if answer is None:
                # grpc-core ends a unary call OK without a message when the stream ended before
                # the message its length prefix announced (or carried none): no answer to relay.
                self.transport_failed(ep)
                raise UpstreamFraming(f"backend '{self.name}' endpoint {ep.address}: answered OK without a "
                                      "complete response message (a unary call has exactly one)")
            return answer
        except (aio.AioRpcError, CallError) as exc:
            error = self._mapped(ep, exc, tmo, model, version, stateful)
            if sink is not None and isinstance(error, Refused) and \
                    (sink.opened or (type(request) is not bytes and not request.resendable)):
                # Part of the answer reached the client, or of a streamed request the backend, past
                # what is kept to send it again: nothing is sent again. A status the backend chose
                # is relayed as it came; a broken exchange is a reset.
                inner = error.error
                error = inner if isinstance(inner, UpstreamError) else UpstreamReset(
                    inner.message if sink.opened else f"{inner.message} (the request was streamed on to it and is "
                    "not kept whole: not sent again)")
            if refusing and isinstance(error, UpstreamError) and error.grpc_code in ("NOT_FOUND", "INVALID_ARGUMENT"):
                error = self.refusal(ep, model, version, error, True)
            raise error from exc
        finally:
            ep.left()

    def _mapped(self, ep: GrpcEndpoint, exc: aio.AioRpcError | CallError, tmo: float | None, model: str = "",
                version: str = "", stateful: bool = False) -> Exception:
        """The client's error as the gateway's (grpc_outcome.py ``mapped_error``)."""
        return mapped_error(self, ep, exc, tmo, model, version, stateful)

    def _unary(self, model: str, version: str, affinity: str | None,
               pick: Callable[[GrpcEndpoint], _Rpc], request: Any,
               timeout: float | None, metadata: Sequence[tuple[str, str]] = ()) -> Coroutine[Any, Any, Any]:
        # (A plain function handing back attempt's coroutine, and _call's arguments handed to it
        # as they are, not wrapped: each coroutine between the front end and grpc's call is work
        # on every inference, once when it starts and again when the answer resumes it.)
        return self.attempt(model, version, affinity, self._call,
                            (pick, request, timeout, metadata, model, version, True,
                             affinity is not None or STATEFUL.get()))

    # -- health checker ------------------------------------------------------------------
    async def check_live(self, ep: GrpcEndpoint, timeout: float) -> bool:
        try:
            resp = await self._call(ep, lambda e: e.typed["ServerLive"], pb.ServerLiveRequest(), timeout,
                                    self._check_metadata)
            return bool(resp.live)
        except (GatewayError, Refused):
            return False

    async def check_index_raw(self, ep: GrpcEndpoint, timeout: float) -> bytes | bytearray | None:
        try:
            answer: bytes = await self._call(ep, lambda e: e.raw["RepositoryIndex"], INDEX_REQUEST_PB, timeout,
                                             self._check_metadata)
        except (GatewayError, Refused):
            return None  # no repository extension (UNIMPLEMENTED), or restricted
        return answer

    def parse_index(self, raw: bytes | bytearray) -> list[IndexEntry]:
        return parse_index_pb(bytes(raw))

    async def check_model(self, ep: GrpcEndpoint, model: str, version: str, timeout: float) -> bool | None:
        """Whether the model is ready there; None: no answer (the checker keeps what it knew). The
        backend's own error status is its "no" (Triton: NOT_FOUND for a model it does not have)."""
        try:
            resp = await self._call(ep, lambda e: e.typed["ModelReady"],
                                    pb.ModelReadyRequest(name=model, version=version), timeout, self._check_metadata)
            return bool(resp.ready)
        except UpstreamError:
            return False
        except (GatewayError, Refused):
            return None

    # -- client-facing -------------------------------------------------------------------
    async def model_ready(self, model: str, version: str) -> bool:
        try:
            resp = await self._unary(model, version, None, lambda e: e.typed["ModelReady"],
                                     pb.ModelReadyRequest(name=model, version=version), None)
        except ModelNotReady:
            return False
        return bool(resp.ready)

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        resp = await self._unary(model, version, None, lambda e: e.typed["ModelMetadata"],
                                 pb.ModelMetadataRequest(name=model, version=version), None)
        return _metadata_to_dict(resp)

    async def config_http(self, model: str, version: str) -> HttpReply:
        """Triton's ModelConfig answer as its HTTP ``/config`` JSON (codec/triton.py)."""
        request = tx.ModelConfigRequest(name=model, version=version).SerializeToString()
        answer = await self._unary(model, version, None, lambda e: e.raw["ModelConfig"], request, None)
        self.on_event("grpc_to_http")
        return HttpReply(200, config_to_json(answer), _JSON)

    async def config_grpc(self, message: bytes, model: str, version: str, timeout: float | None) -> bytes:
        return await self._unary(model, version, None, lambda e: e.raw["ModelConfig"], message, timeout)

    async def endpoint_stats(self, ep: GrpcEndpoint, model: str, version: str,
                             timeout: float | None) -> tuple[bytes, str]:
        request = tx.ModelStatisticsRequest(name=model, version=version).SerializeToString()
        return await self._call(ep, lambda e: e.raw["ModelStatistics"], request, timeout, None, model, version), "pb"

    async def endpoint_settings(self, ep: GrpcEndpoint, kind: str, model: str,
                                request: tuple[str, bytes | None]) -> tuple[str, bytes]:
        form, payload = request
        if form == "json":
            self.on_event("http_to_grpc")
            message = trace_to_pb(payload or b"", model, answer=False) if kind == "trace" else \
                log_to_pb(payload or b"", answer=False)
        else:
            message = payload or b""
        rpc = "TraceSetting" if kind == "trace" else "LogSettings"
        answer = await self._call(ep, lambda e: e.raw[rpc], message, None)
        if form == "pb":
            return "pb", answer
        body = trace_to_json(answer, answer=True)[1] if kind == "trace" else log_to_json(answer, answer=True)
        return "json", body or b"{}"

    async def control(self, ep: GrpcEndpoint, action: str, model: str, timeout: float) -> None:
        if action == "unload":
            rpc, request = "RepositoryModelUnload", tx.RepositoryModelUnloadRequest(model_name=model)
        else:
            rpc, request = "RepositoryModelLoad", tx.RepositoryModelLoadRequest(model_name=model)
        try:
            await self._call(ep, lambda e: e.raw[rpc], request.SerializeToString(), timeout, self._check_metadata)
        except Refused as exc:
            raise exc.error from exc

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: tuple[tuple[str, str], ...]) -> bytes:
        # The client's metadata for a restricted repository API is passed on as it came.
        names = {k for k, _ in self.spec.check_headers}
        mine = names | {TRITON_GRPC_PREFIX + k for k in names}
        keys = tuple((k, v) for k, v in metadata if k in mine)
        results = await self.each_endpoint(lambda ep: self._call(ep, lambda e: e.raw[rpc], message, timeout, keys))
        self.combined(rpc, model, [(ep, err) for ep, _, err in results])
        return results[0][1] or b""

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        """An HTTP client's load / unload, converted (codec/triton.py): the client's own
        credentials for a restricted repository API go on as metadata in both spellings."""
        message = control_from_json(body, model, action == "unload")
        metadata = tuple(pair for k, _ in self.spec.check_headers if (v := headers.get(k)) is not None
                         for pair in ((k, v), (TRITON_GRPC_PREFIX + k.removeprefix(TRITON_GRPC_PREFIX), v)))
        rpc = "RepositoryModelUnload" if action == "unload" else "RepositoryModelLoad"
        self.on_event("http_to_grpc")
        await self.repository_grpc(rpc, model, message, None, metadata)
        return HttpReply(200, b"", {})  # Triton's HTTP answer to a load / unload that worked

    # -- inference -----------------------------------------------------------------------
    def infer_grpc(self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
                   affinity: str | None, metadata: tuple[tuple[str, str], ...],
                   sink: AnswerSink | None = None, tried: int = 0) -> Coroutine[Any, Any, bytes]:
        """Pass-through: the serialized request out, the serialized response back — or, with a
        ``sink`` and the gateway's own client, a large response streamed to it as it arrives."""
        if sink is None and not tried:
            return self._unary(model, version, affinity, _INFER, message, timeout, metadata)
        return self.attempt(model, version, affinity, self._call,
                            (_INFER, message, timeout, metadata, model, version, True,
                             affinity is not None or STATEFUL.get(), sink), tried=tried)

    def infer_grpc_now(self, message: bytes, model: str, version: str, timeout: float | None, affinity: str | None,
                       metadata: tuple[tuple[str, str], ...], sink: AnswerSink | None, record: Any,
                       done: Callable[[GrpcOutcome], None]) -> Pending | None:
        """:meth:`infer_grpc` of a whole request from callbacks, when the chosen endpoint's
        channel has a stream free now (``Channel.unary_now``): the answer, or the error
        :meth:`infer_grpc` would raise, goes to ``done`` from the channel's events. What
        :meth:`attempt` would send again goes to ``done`` as RETRY (the endpoint is marked as
        attempt marks it; the retry is counted) or AGAIN (the server refused the stream unread,
        which Channel.unary sends again itself); nothing was answered. None: nothing was sent.
        Raises what :meth:`candidates` raises."""
        order = self.candidates(model, version, affinity)
        ep = order[0]
        now = ep.now
        if now is None:
            return None
        tmo = self.spec.timeout_s if timeout is None else min(timeout, self.spec.timeout_s)
        stateful = affinity is not None or STATEFUL.get()
        budget = self.budget

        def answered(result: bytes | memoryview | BaseException) -> None:
            # From the channel's connection callbacks, once (Settled).
            ep.left()
            budget.active -= 1
            try:
                outcome = call_outcome(self, ep, result, tmo, model, version, stateful, sink, len(order) - 1)
            except Exception as exc:  # (nothing may escape into the connection's event dispatch)
                outcome = exc
            done(outcome)

        ep._inflight += 1
        budget.active += 1
        try:
            call = now(message, tmo, metadata or None, sink, answered)
        except BaseException:  # (a session that failed under the send: raised on, as the awaited call raises it)
            ep.left()
            budget.active -= 1
            raise
        if call is None:
            ep.left()
            budget.active -= 1
            return None
        if record is not None:
            record.endpoint = str(ep.address)
            record.protocol_out = self.protocol
        return cast(Pending, call)

    async def infer_http(self, model: str, version: str, body: bytes | bytearray | IncomingBody,
                         headers: Mapping[str, str],
                         forwarded: Sequence[str], limit: int) -> HttpReply:
        """An HTTP client's request, converted: raw contents out, JSON or binary back."""
        whole = body if isinstance(body, (bytes, bytearray)) else await body.read_view()
        self.on_event("http_to_grpc")
        # The message's tensors are views of the body (sent as they are by the gateway's own client),
        # which the gateway's own client lets go at the answer's first DATA (h2stream.Gathered):
        # from then on the message list is empty and the request is not sent again.
        message, affinity, form = http_request_to_grpc(whole, headers, model, version, limit)
        whole = b""  # (mypyc compiles no del of a local)
        trace = tuple((k, v) for k in forwarded if k not in _FRAMING and (v := headers.get(k)) is not None)
        try:
            answer, ep = await self.attempt(model, version, affinity, self._call_from,
                                            (_CONVERT, message, None, trace, model, version, True,
                                             affinity is not None or STATEFUL.get()),
                                            lambda: bool(message))  # (empty: the backend answered; no resend)
        except UpstreamError as err:
            if err.grpc_code == "INVALID_ARGUMENT" and err.message == version_refusal(version):
                # Triton's HTTP route takes only digits: its answer to this version is a 404.
                raise UpstreamError("Not Found", http_status=404, body=b'{"error":"Not Found"}',
                                    content_type="application/json") from err
            raise
        message = []
        try:
            chunks, out_headers = grpc_answer_to_http(answer, form, self.name)
        except BadUpstreamResponse as exc:
            # Not a ModelInferResponse: the endpoint that sent it is named (and counted).
            self.transport_failed(ep)
            where = f"backend '{self.name}' endpoint {ep.address}:"
            raise BadUpstreamResponse(exc.message.replace(f"backend '{self.name}'", where, 1)) from exc
        return HttpReply(200, chunks, out_headers)

    async def _call_from(self, ep: GrpcEndpoint, *args: Any) -> tuple[Any, GrpcEndpoint]:
        """:meth:`_call`, and the endpoint that answered."""
        return await self._call(ep, *args), ep

    def infer_stream(self, requests: AsyncIterator[bytes], model: str, version: str,
                     timeout: float | None, affinity: str | None,
                     metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
        """Triton's ModelStreamInfer, passed through: serialized ModelInferRequests out,
        serialized ModelStreamInferResponses back, as they come, on one endpoint (a
        stream's requests may depend on each other, so there is no retry once it is
        open). ``timeout`` is the client's deadline, if any: a stream carries many
        requests, so ``timeout_s`` does not bound it."""
        return grpc_stream(self, requests, model, version, timeout, affinity, metadata)

    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       forwarded: Sequence[str], stream: bool) -> HttpReply:
        """Triton's generate extension, converted to ModelInfer / ModelStreamInfer (backends/generate.py)."""
        from .generate import via_grpc  # (it imports this module)

        return await via_grpc(self, model, version, body, headers, forwarded, stream)


_JSON = {"content-type": "application/json"}

# Headers an HTTP client sends that become gRPC metadata on a converted request: all
# forwarded ones except the HTTP body's own framing.
_FRAMING = frozenset({"content-type", "inference-header-content-length", "content-encoding", "accept-encoding"})


def _metadata_to_dict(msg: Any) -> dict[str, Any]:
    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]

    out: dict[str, Any] = {"name": msg.name}
    if msg.versions:
        out["versions"] = list(msg.versions)
    out["platform"] = msg.platform
    out["inputs"] = tensors(msg.inputs)
    out["outputs"] = tensors(msg.outputs)
    return out
