"""The first-generation ("v1") API through the gateway, answered by real Triton on an HTTP
backend and on a gRPC backend.

The client here is written from the spec text (../shared/spec/legacy-v1-inference-server-
api.txt, legacy-v1-infer-request-header.proto.txt): HTTP requests by hand with
http.client — the NV-InferRequest header in text format, raw tensors as the body, the
answer's raw outputs followed by the InferResponseHeader — and gRPC through a stub generated
from our proto (gateway/_pb/legacy_v1_pb2_grpc.py). Models: tests/models/triton_v1
(v1_batch: batching, two versions, a label file; v1_sequence: sequence batcher; add_sub:
not batching)."""
from __future__ import annotations

import http.client
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from google.protobuf import text_format

from gateway._pb import legacy_v1_pb2 as v1
from gateway._pb import legacy_v1_pb2_grpc as v1_grpc
from tests.conftest import start_gateway
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer, triton_available

REPOSITORY = Path(__file__).resolve().parent.parent / "models" / "triton_v1"
MODELS = ["add_sub", "v1_batch", "v1_sequence"]
LABELS = ["cat", "dog", "bird", "fish"]


@pytest.fixture(scope="module")
def triton_v1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    reason = triton_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Triton must run in CI: {reason}")
        pytest.skip(f"Triton unavailable: {reason}")
    with TritonServer(REPOSITORY).start(tmp_path_factory.mktemp("triton-v1")) as server:
        yield server


@pytest.fixture(scope="module", params=["http", "grpc"])
def gw(request, triton_v1, tmp_path_factory) -> Iterator[GatewayProcess]:
    g = start_gateway(tmp_path_factory.mktemp(f"v1-{request.param}"), triton_v1.http_url, triton_v1.grpc_url,
                      request.param, models=MODELS, v1={"model_repositories": [str(REPOSITORY)]})
    yield g
    g.stop()


# ------------------------------------------------------------------ a v1 HTTP client
class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body
        self.nv_status = text_format.Parse(headers["nv-status"], v1.RequestStatus())


def call(gw: GatewayProcess, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> Answer:
    host, port = gw.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def infer(gw: GatewayProcess, model: str, header: str, body: bytes, *, version: str = "",
          binary: bool = False, raw_bytes: int = 0) -> tuple[Answer, v1.InferResponseHeader | None, bytes]:
    """POST /api/infer/<model>[/<version>]: the answer, its InferResponseHeader and its raw part.
    A text header follows the raw outputs; a binary one is read after ``raw_bytes`` of them."""
    path = f"/api/infer/{model}" + (f"/{version}" if version else "") + ("?format=binary" if binary else "")
    answer = call(gw, "POST", path, body, {"NV-InferRequest": header})
    if answer.status != 200:
        return answer, None, b""
    if binary:
        return answer, v1.InferResponseHeader.FromString(answer.body[raw_bytes:]), answer.body[:raw_bytes]
    raw = answer.body[:raw_bytes]
    return answer, text_format.Parse(answer.body[raw_bytes:].decode(), v1.InferResponseHeader()), raw


def f32(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


# ------------------------------------------------------------------ HTTP
def test_health(gw) -> None:
    for path in ("/api/health/live", "/api/health/ready"):
        answer = call(gw, "GET", path)
        assert answer.status == 200 and answer.nv_status.code == v1.SUCCESS, path


def test_status_text_and_binary(gw) -> None:
    text = call(gw, "GET", "/api/status")
    assert text.status == 200 and text.nv_status.code == v1.SUCCESS
    status = text_format.Parse(text.body.decode(), v1.ServerStatus())
    assert set(MODELS) <= set(status.model_status)
    assert status.ready_state == v1.SERVER_READY and status.uptime_ns > 0 and status.version
    batch = status.model_status["v1_batch"]
    assert batch.config.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in batch.config.input] == [("INPUT0", v1.TYPE_FP32, [4])]
    assert batch.config.output[1].label_filename == "labels.txt"
    assert {v: s.ready_state for v, s in batch.version_status.items()} == {1: v1.MODEL_READY, 2: v1.MODEL_READY}
    assert status.model_status["add_sub"].config.max_batch_size == 0

    one = call(gw, "GET", "/api/status/v1_sequence?format=binary")
    assert one.status == 200 and one.headers["content-type"] == "application/octet-stream"
    only = v1.ServerStatus.FromString(one.body)
    assert list(only.model_status) == ["v1_sequence"]
    assert only.model_status["v1_sequence"].version_status[1].ready_state == v1.MODEL_READY

    missing = call(gw, "GET", "/api/status/no_such_model")
    assert missing.status == 404 and missing.nv_status.code == v1.NOT_FOUND


@pytest.mark.parametrize("batch", [1, 2])
def test_infer_batching_model(gw, batch: int) -> None:
    """v1 dims exclude the batch dimension; batch_size prepends it. The latest version (2)
    answers when none is named; outputs come in header order, then the text header."""
    x = np.arange(4 * batch, dtype="<f4") + 1
    header = (f'batch_size: {batch} id: 7 input {{ name: "INPUT0" }} output {{ name: "PROB" }} '
              'output { name: "OUTPUT0" }')
    answer, resp, raw = infer(gw, "v1_batch", header, x.tobytes(), raw_bytes=2 * x.nbytes)
    assert answer.status == 200 and answer.nv_status.code == v1.SUCCESS
    assert resp is not None
    assert (resp.model_name, resp.model_version, resp.batch_size, resp.id) == ("v1_batch", 2, batch, 7)
    assert [(o.name, o.data_type, list(o.raw.dims), o.raw.batch_byte_size) for o in resp.output] == \
        [("PROB", v1.TYPE_FP32, [4], x.nbytes), ("OUTPUT0", v1.TYPE_FP32, [4], x.nbytes)]
    assert raw == x.tobytes() + (x * 2).tobytes()


def test_infer_named_version_and_byte_size(gw) -> None:
    x = f32(1, 2, 3, 4)
    header = 'batch_size: 1 input { name: "INPUT0" batch_byte_size: 16 } output { name: "OUTPUT0" }'
    answer, resp, raw = infer(gw, "v1_batch", header, x, version="1", raw_bytes=16)
    assert answer.status == 200 and resp is not None and resp.model_version == 1
    assert raw == x  # version 1 multiplies by one


def test_infer_non_batching_model(gw) -> None:
    """A model that does not batch: batch_size 1, dims are its whole shape."""
    header = ('batch_size: 1 input { name: "INPUT0" dims: [4] } input { name: "INPUT1" dims: [4] } '
              'output { name: "OUTPUT0" } output { name: "OUTPUT1" }')
    answer, resp, raw = infer(gw, "add_sub", header, f32(1, 2, 3, 4) + f32(10, 20, 30, 40), raw_bytes=32)
    assert answer.status == 200 and resp is not None and resp.batch_size == 1
    assert [list(o.raw.dims) for o in resp.output] == [[4], [4]]
    assert raw == f32(11, 22, 33, 44) + f32(-9, -18, -27, -36)
    refused, _, _ = infer(gw, "add_sub", header.replace("batch_size: 1", "batch_size: 2"), bytes(64))
    assert refused.status == 400 and refused.nv_status.code == v1.INVALID_ARG
    assert "does not support batching" in refused.nv_status.msg


def test_classification_top_k_with_labels(gw, triton_v1) -> None:
    """cls { count: K }: the top K per batch entry with the labels of the model's label file,
    as Triton's own V2 classification names them, and the values unchanged."""
    x = np.array([[0.1, 0.6, 0.25, 0.05], [0.3, 0.1, 0.2, 0.4]], dtype="<f4")
    header = 'batch_size: 2 input { name: "INPUT0" } output { name: "PROB" cls { count: 3 } }'
    answer, resp, raw = infer(gw, "v1_batch", header, x.tobytes())
    assert answer.status == 200 and resp is not None and raw == b""
    got = [[(c.idx, c.value, c.label) for c in e.cls] for e in resp.output[0].batch_classes]
    want = [[(int(i), x[b, i], LABELS[i]) for i in np.argsort(-x[b], kind="stable")[:3]] for b in range(2)]
    assert got == want
    # Triton's V2 classification extension agrees on indices and labels.
    with httpclient.InferenceServerClient(triton_v1.http_url) as c:
        inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        direct = c.infer("v1_batch", [inp], outputs=[httpclient.InferRequestedOutput("PROB", class_count=3)])
    triton = [[tuple(s.decode().split(":")[1:]) for s in row] for row in direct.as_numpy("PROB")]
    assert [[(str(i), label) for i, _, label in row] for row in got] == triton


def test_binary_response_header(gw) -> None:
    x = f32(1, 2, 3, 4, 5, 6, 7, 8)
    header = ('batch_size: 2 input { name: "INPUT0" } output { name: "OUTPUT0" } '
              'output { name: "PROB" cls { count: 1 } }')
    answer, resp, raw = infer(gw, "v1_batch", header, x, binary=True, raw_bytes=32)
    assert answer.status == 200 and resp is not None
    assert raw == (np.frombuffer(x, "<f4") * 2).tobytes()
    assert resp.output[0].raw.batch_byte_size == 32
    assert [(e.cls[0].idx, e.cls[0].label) for e in resp.output[1].batch_classes] == [(3, "fish"), (3, "fish")]


def test_sequence_flags_reach_the_sequence_batcher(gw) -> None:
    """Correlation id and START / END flags become Triton's sequence controls."""
    outs = ''.join(f'output {{ name: "{n}" }} ' for n in ("SUM", "START_OUT", "END_OUT", "CORRID_OUT"))
    seen = []
    for flags, value in ((1, 5), (0, 3), (2, 1)):
        header = f'batch_size: 1 correlation_id: 4242 flags: {flags} input {{ name: "INPUT0" }} {outs}'
        answer, _, raw = infer(gw, "v1_sequence", header, np.array([value], "<i4").tobytes(), raw_bytes=20)
        assert answer.status == 200, answer.nv_status
        total, start, end = np.frombuffer(raw[:12], "<i4")
        seen.append((int(total), int(start), int(end), int(np.frombuffer(raw[12:], "<u8")[0])))
    assert seen == [(5, 1, 0, 4242), (8, 0, 0, 4242), (9, 0, 1, 4242)]


@pytest.mark.parametrize("path, header, body, status, code, words", [
    ("/api/infer/no_such_model", 'batch_size: 1 input { name: "INPUT0" }', f32(1, 2, 3, 4), 404, v1.NOT_FOUND,
     "no_such_model"),
    ("/api/infer/v1_batch", 'batch_size: 1 input { name: "INPUT0" ', f32(1, 2, 3, 4), 400, v1.INVALID_ARG,
     "malformed NV-InferRequest header"),
    ("/api/infer/v1_batch", 'batch_size: 2 input { name: "INPUT0" }', f32(1, 2, 3, 4), 400, v1.INVALID_ARG,
     "shorter than the inputs the header declares"),
    ("/api/infer/v1_batch", None, f32(1, 2, 3, 4), 400, v1.INVALID_ARG, "NV-InferRequest header is required"),
    ("/api/infer/v1_batch/x", 'batch_size: 1 input { name: "INPUT0" }', f32(1, 2, 3, 4), 400, v1.INVALID_ARG,
     "not a number"),
    ("/api/nothing", None, None, 404, v1.NOT_FOUND, "no such first-generation API endpoint"),
    # The V2 request the bridge builds is held to the same limits as one a V2 client sends.
    ("/api/infer/add_sub", 'batch_size: 1 input { name: "INPUT0" dims: [3000000000] } '
     'input { name: "INPUT1" dims: [3000000000] }', f32(1, 2, 3, 4), 400, v1.INVALID_ARG, "limits.max_elements"),
])
def test_errors_have_nv_status_and_the_gateway_keeps_serving(gw, path, header, body, status, code, words) -> None:
    answer = call(gw, "POST", path, body, {"NV-InferRequest": header} if header is not None else {})
    assert answer.status == status
    assert answer.nv_status.code == code and words in answer.nv_status.msg
    ok, _, raw = infer(gw, "v1_batch", 'batch_size: 1 input { name: "INPUT0" } output { name: "OUTPUT0" }',
                          f32(1, 2, 3, 4), raw_bytes=16)
    assert ok.status == 200 and raw == f32(2, 4, 6, 8)


# ------------------------------------------------------------------ gRPC
def stub(gw) -> v1_grpc.GRPCServiceStub:
    return v1_grpc.GRPCServiceStub(grpc.insecure_channel(gw.grpc_url))


def test_grpc_health_and_status(gw) -> None:
    s = stub(gw)
    for mode in ("live", "ready"):
        answer = s.Health(v1.HealthRequest(mode=mode))
        assert answer.request_status.code == v1.SUCCESS and answer.health
    bad = s.Health(v1.HealthRequest(mode="sideways"))
    assert bad.request_status.code == v1.INVALID_ARG
    status = s.Status(v1.StatusRequest())
    assert status.request_status.code == v1.SUCCESS and set(MODELS) <= set(status.server_status.model_status)
    one = s.Status(v1.StatusRequest(model_name="v1_batch"))
    assert list(one.server_status.model_status) == ["v1_batch"]
    assert s.Status(v1.StatusRequest(model_name="nope")).request_status.code == v1.NOT_FOUND


def grpc_request(model: str, header: str, *raws: bytes, version: int = -1) -> v1.InferRequest:
    return v1.InferRequest(model_name=model, model_version=version,
                           meta_data=text_format.Parse(header, v1.InferRequestHeader()), raw_input=list(raws))


def test_grpc_infer(gw) -> None:
    s = stub(gw)
    x = np.arange(8, dtype="<f4")
    header = ('batch_size: 2 input { name: "INPUT0" } output { name: "OUTPUT0" } '
              'output { name: "PROB" cls { count: 2 } }')
    answer = s.Infer(grpc_request("v1_batch", header, x.tobytes()))
    assert answer.request_status.code == v1.SUCCESS, answer.request_status.msg
    assert answer.meta_data.model_version == 2 and answer.meta_data.batch_size == 2
    assert list(answer.raw_output) == [(x * 2).tobytes()]
    assert [[(c.idx, c.label) for c in e.cls] for e in answer.meta_data.output[1].batch_classes] == \
        [[(3, "fish"), (2, "bird")], [(3, "fish"), (2, "bird")]]
    named = s.Infer(grpc_request("v1_batch", 'batch_size: 1 input { name: "INPUT0" } output { name: "OUTPUT0" }',
                                 x[:4].tobytes(), version=1))
    assert named.meta_data.model_version == 1 and list(named.raw_output) == [x[:4].tobytes()]
    flat = s.Infer(grpc_request("add_sub", 'batch_size: 1 input { name: "INPUT0" dims: 2 } '
                                'input { name: "INPUT1" dims: 2 } output { name: "OUTPUT1" }', f32(5, 5), f32(1, 2)))
    assert list(flat.raw_output) == [f32(4, 3)]
    missing = s.Infer(grpc_request("no_such_model", 'batch_size: 1 input { name: "INPUT0" }', f32(1, 2, 3, 4)))
    assert missing.request_status.code == v1.NOT_FOUND and "no_such_model" in missing.request_status.msg
    short = s.Infer(grpc_request("v1_batch", 'batch_size: 1 input { name: "INPUT0" }', f32(1, 2)))
    assert short.request_status.code == v1.INVALID_ARG and "8 bytes of data" in short.request_status.msg


def test_grpc_stream_infer_sequence_goes_on_after_an_error(gw) -> None:
    s = stub(gw)
    outs = 'output { name: "SUM" } output { name: "START_OUT" } output { name: "END_OUT" }'

    def seq(flags: int) -> str:
        return f'batch_size: 1 correlation_id: 77 flags: {flags} input {{ name: "INPUT0" }} ' + outs

    requests = [grpc_request("v1_sequence", seq(1), np.array([2], "<i4").tobytes()),
                grpc_request("no_such_model", 'batch_size: 1 input { name: "INPUT0" }', b""),
                grpc_request("v1_sequence", seq(2), np.array([40], "<i4").tobytes())]
    answers = list(s.StreamInfer(iter(requests)))
    assert [a.request_status.code for a in answers] == [v1.SUCCESS, v1.NOT_FOUND, v1.SUCCESS]
    assert [tuple(int(np.frombuffer(r, "<i4")[0]) for r in a.raw_output) for a in (answers[0], answers[2])] == \
        [(2, 1, 0), (42, 0, 1)]


# ------------------------------------------------------------------ readiness: strict or not
def test_readiness_strict_and_non_strict(triton_v1, tmp_path) -> None:
    """Strict (default): not ready while a routed model is ready nowhere; non_strict: ready
    while the gateway is responsive. Switched by a config reload (SIGHUP)."""
    backends = {"http": {"protocol": "http", "endpoints": [triton_v1.http_url]}}
    routes = [{"model": "not_in_the_repository", "backend": "http"}, {"model": "*", "backend": "http"}]
    config = gateway_config(backends, routes)
    with GatewayProcess(config, tmp_path) as g:
        s = stub(g)
        assert call(g, "GET", "/api/health/live").status == 200
        ready = call(g, "GET", "/api/health/ready")
        assert ready.status == 400 and ready.nv_status.code == v1.SUCCESS
        assert s.Health(v1.HealthRequest(mode="ready")).health is False
        g.config_path.write_text(yaml.safe_dump({**config, "v1": {"ready": "non_strict"}}))
        assert g.proc is not None
        g.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: call(g, "GET", "/api/health/ready").status == 200, timeout=30, what="non-strict ready")
        assert s.Health(v1.HealthRequest(mode="ready")).health is True
