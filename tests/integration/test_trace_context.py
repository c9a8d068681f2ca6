"""Trace context (W3C ``traceparent`` / ``tracestate``) and ``x-request-id`` — and the
headers named in ``forward_headers`` — reach the backend on every path, as HTTP headers or
gRPC metadata, whichever the backend speaks, so Triton's OpenTelemetry tracing continues the
client's trace through the gateway."""
from __future__ import annotations

import urllib.request
from concurrent import futures

import grpc
import pytest

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.scripted import EMPTY_INFER_ANSWER, ScriptedHttp

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def http_backend():
    """A scripted HTTP backend recording every inference request's headers; its answers carry no outputs."""
    heads: list[dict[str, str]] = []

    def on_post(request_line: str, headers: dict[str, str], body: bytes) -> bytes:
        heads.append(headers)
        return EMPTY_INFER_ANSWER

    server = ScriptedHttp(on_post)
    yield server.address, heads
    server.close()


@pytest.fixture(scope="module")
def grpc_backend():
    """A grpc server recording the metadata of every ModelInfer; answers are empty responses."""
    seen: list[dict[str, str]] = []

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append({m.key: m.value for m in context.invocation_metadata()})
        return b""

    def ok(request: bytes, context: grpc.ServicerContext) -> bytes:
        return pb.ServerLiveResponse(live=True).SerializeToString()

    def ready(request: bytes, context: grpc.ServicerContext) -> bytes:
        return pb.ModelReadyResponse(ready=True).SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
        "ServerLive": grpc.unary_unary_rpc_method_handler(ok),
        "ModelReady": grpc.unary_unary_rpc_method_handler(ready),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", seen
    server.stop(None)


@pytest.fixture(scope="module")
def gw(http_backend, grpc_backend, tmp_path_factory):
    backends = {"h": {"protocol": "http", "endpoints": [http_backend[0]]},
                "g": {"protocol": "grpc", "endpoints": [grpc_backend[0]]}}
    routes = [{"model": "to_http", "backend": "h"}, {"model": "to_grpc", "backend": "g"}]
    cfg = gateway_config(backends, routes, forward_headers=["authorization"])
    with GatewayProcess(cfg, tmp_path_factory.mktemp("trace"), "gw-trace") as g:
        yield g


def http_call(g: GatewayProcess, model: str, request_id: str) -> int:
    body = b'{"inputs":[{"name":"I","shape":[1],"datatype":"FP32","data":[1]}]}'
    req = urllib.request.Request(f"http://{g.http_url}/v2/models/{model}/infer", data=body, method="POST", headers={
        "Content-Type": "application/json", "traceparent": TRACEPARENT, "tracestate": "vendor=1",
        "x-request-id": request_id, "x-unrelated": "dropped", "Authorization": "Bearer t0k"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def grpc_call(g: GatewayProcess, model: str, request_id: str) -> None:
    msg = pb.ModelInferRequest(model_name=model)
    msg.inputs.add(name="I", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(b"\0\0\x80\x3f")
    with grpc.insecure_channel(g.grpc_url) as ch:
        ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
            msg.SerializeToString(), timeout=10,
            metadata=(("traceparent", TRACEPARENT), ("tracestate", "vendor=1"), ("x-request-id", request_id),
                      ("x-unrelated", "dropped"), ("authorization", "Bearer t0k")))


@pytest.mark.parametrize("client", ["http", "grpc"])
@pytest.mark.parametrize("backend", ["http", "grpc"])
def test_trace_context_reaches_the_backend(gw, http_backend, grpc_backend, client, backend):
    request_id = f"{client}-to-{backend}"
    if client == "http":
        assert http_call(gw, f"to_{backend}", request_id) == 200
    else:
        grpc_call(gw, f"to_{backend}", request_id)
    seen = http_backend[1] if backend == "http" else grpc_backend[1]
    got = next(s for s in reversed(seen) if s.get("x-request-id") == request_id)
    assert got["traceparent"] == TRACEPARENT and got["tracestate"] == "vendor=1"
    assert got["authorization"] == "Bearer t0k"  # listed in forward_headers
    assert "x-unrelated" not in got  # not listed: not forwarded


def test_each_grpc_call_forwards_its_own_context(gw, grpc_backend):
    """Concurrent calls on one connection, some carrying trace context and some none: the
    backend sees each call's own metadata — none of another call's (the front end keeps each
    call's metadata for its handler as grpc read it: frontend/grpcunary.py CALL_METADATA)."""
    seen = grpc_backend[1]
    before = len(seen)
    msg = pb.ModelInferRequest(model_name="to_grpc")
    msg.inputs.add(name="I", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(b"\0\0\x80\x3f")
    body = msg.SerializeToString()

    def traced(i: int) -> tuple[tuple[str, str], ...]:
        return (("traceparent", f"00-{i:032x}-00f067aa0ba902b7-01"), ("x-request-id", f"own-{i}"))

    with grpc.insecure_channel(gw.grpc_url) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with futures.ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda i: call(body, timeout=10, metadata=traced(i) if i % 2 else None), range(40)))
    assert len(done) == 40
    got = seen[before:]
    assert len(got) == 40
    carried = {s["x-request-id"]: s.get("traceparent") for s in got if "x-request-id" in s}
    assert carried == {f"own-{i}": f"00-{i:032x}-00f067aa0ba902b7-01" for i in range(1, 40, 2)}
    assert sum(1 for s in got if "traceparent" not in s and "x-request-id" not in s) == 20
