"""Every foreign failure of a backend call — socket (refused, reset, closed mid-answer,
silent), malformed HTTP, grpc status codes — comes out as the gateway's own error tree
(GatewayError), never as an OSError, httptools or grpc exception. Real sockets and a real
grpc server; nothing mocked."""
from __future__ import annotations

import asyncio
import socket
from concurrent import futures

import grpc
import pytest

from gateway.backends.grpc import GrpcBackend
from gateway.backends.http import HttpBackend
from gateway.config.backends import BackendSpec
from gateway.config.network import HostPort
from gateway.errors import (
    BadUpstreamResponse,
    GatewayError,
    ModelNotReady,
    NoEndpointAvailable,
    UpstreamError,
    UpstreamFraming,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTooLarge,
)


def _closed_port() -> HostPort:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return HostPort("127.0.0.1", port)


async def _server(answer: bytes | None, *, close: bool = True) -> tuple[asyncio.AbstractServer, HostPort]:
    """A TCP server that reads a request head, writes ``answer`` (None: nothing), then
    closes (or, with ``close=False``, keeps the connection silent)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is not None:
            writer.write(answer)
            await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, HostPort("127.0.0.1", server.sockets[0].getsockname()[1])


def _http_backend(*addrs: HostPort, timeout_s: float = 2.0, retries: int = 0) -> HttpBackend:
    return HttpBackend(BackendSpec("b", "http", addrs, timeout_s=timeout_s, connect_timeout_s=1.0, retries=retries))


@pytest.mark.parametrize("answer, close, expected", [
    (None, True, NoEndpointAvailable),  # closed before a byte of the answer: refused (retryable)
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", True, UpstreamReset),  # cut mid-answer
    (b"NOT HTTP AT ALL\r\n\r\n", True, UpstreamFraming),  # httptools parse error
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab", True, UpstreamFraming),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\nab", False, UpstreamTooLarge),  # over the backend's limit
    (b"HTTP/1.0 200 OK\r\n\r\n{}", True, None),  # close-delimited: read to the end
    (None, False, UpstreamTimeout),  # never answers
])
async def test_http_socket_failures_map_into_the_tree(answer, close, expected):
    server, addr = await _server(answer, close=close)
    backend = _http_backend(addr, timeout_s=0.5)
    try:
        if expected is None:
            reply = await backend.request("POST", "/v2/models/m/infer", "m", "", body=b"{}")
            assert (reply.status, bytes(reply.body)) == (200, b"{}")
            return
        with pytest.raises(expected) as info:
            await backend.request("POST", "/v2/models/m/infer", "m", "", body=b"{}")
        assert isinstance(info.value, GatewayError) and info.value.http_status in (502, 503, 504)
    finally:
        await backend.close()
        server.close()


async def test_http_refused_connection_is_a_gateway_error_and_is_retried_elsewhere():
    good, good_addr = await _server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", close=True)
    backend = _http_backend(_closed_port(), retries=0)
    try:
        with pytest.raises(NoEndpointAvailable):
            await backend.request("GET", "/v2/health/live", "m", "")
    finally:
        await backend.close()
    # With a retry, a refused endpoint's request goes to the other one.
    backend = _http_backend(_closed_port(), good_addr, retries=1)
    try:
        for _ in range(4):  # whichever endpoint round robin picks first
            reply = await backend.request("GET", "/v2/health/live", "m", "")
            assert reply.status == 200 and reply.body == b"ok"
    finally:
        await backend.close()
        good.close()


@pytest.fixture(scope="module")
def grpc_backend():
    """A grpc server whose ModelInfer answers with the status code named by the model."""

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        from gateway.codec.wire import scan_name_version

        model, _ = scan_name_version(request)
        if model == "slow":
            import time

            time.sleep(2)
            return b""
        code, _, message = model.partition(":")
        context.abort(grpc.StatusCode[code], message or code)
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield HostPort("127.0.0.1", port)
    server.stop(None)


def _infer_message(model: str) -> bytes:
    from gateway._pb import grpc_predict_v2_pb2 as pb

    return pb.ModelInferRequest(model_name=model).SerializeToString()


@pytest.mark.parametrize("model, expected", [
    ("INVALID_ARGUMENT:bad tensor", UpstreamError),
    ("INTERNAL:boom", UpstreamError),
    ("NOT_FOUND:Request for unknown model: 'x' is not found", UpstreamError),  # not checked ready: relayed
    ("UNAVAILABLE:Exceeds maximum queue size", UpstreamError),  # refused for now; no other endpoint
    ("RESOURCE_EXHAUSTED:too big", UpstreamError),
    ("slow", UpstreamTimeout),
])
async def test_grpc_status_codes_map_into_the_tree(grpc_backend, model, expected):
    backend = GrpcBackend(BackendSpec("g", "grpc", (grpc_backend,), timeout_s=0.5, retries=0))
    await backend.start()
    try:
        with pytest.raises(expected) as info:
            await backend.infer_grpc(_infer_message(model), model, "", None, None, ())
        assert isinstance(info.value, GatewayError)
        if isinstance(info.value, UpstreamError):
            assert info.value.grpc_code == model.partition(":")[0]  # the backend's code, relayed
    finally:
        await backend.close()


async def test_grpc_unreachable_endpoint_maps_to_unavailable():
    backend = GrpcBackend(BackendSpec("g", "grpc", (_closed_port(),), timeout_s=2, retries=0))
    await backend.start()
    try:
        with pytest.raises(NoEndpointAvailable):
            await backend.infer_grpc(_infer_message("m"), "m", "", None, None, ())
    finally:
        await backend.close()


async def test_grpc_unknown_model_from_an_endpoint_checked_ready_is_model_not_ready(grpc_backend):
    """The checker saw the model ready there; the endpoint says it does not have it: the
    request is refused as "not ready" (503 / UNAVAILABLE), and the endpoint marked."""
    model = "NOT_FOUND:Request for unknown model: 'm' is not found"
    backend = GrpcBackend(BackendSpec("g", "grpc", (grpc_backend,), timeout_s=2, retries=0))
    await backend.start()
    try:
        ep = next(iter(backend.endpoints.values()))
        ep.health.set_live(True)
        ep.health.set_index([(model, "1", True)])
        with pytest.raises(ModelNotReady):
            await backend.infer_grpc(_infer_message(model), model, "", None, None, ())
        assert not ep.health.ready_exactly(model, "")
    finally:
        await backend.close()
