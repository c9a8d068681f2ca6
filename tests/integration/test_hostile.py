"""Hostile HTTP bodies stopped at the gateway, in front of real Triton: deeply nested JSON —
100,000 brackets crash Triton 2.51's HTTP front end when sent to it directly, so it is never
sent to it here — is refused on the pass-through path, small or streamed, on the inference
JSON part, model control and generate; a bad Inference-Header-Content-Length is a 400; the
backend is alive afterwards and the gateway keeps serving."""
from __future__ import annotations

import http.client

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tests.conftest import start_gateway
from tests.support.clients import In, infer


@pytest.fixture(scope="module")
def gw(triton, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("hostile"), triton.http_url, triton.grpc_url, "http")
    yield g
    g.stop()


def post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, orjson.loads(r.read() or b"{}")
    finally:
        conn.close()


def deep(n: int, pad: int = 0) -> bytes:
    return (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": '
            + b"[" * n + b"1" + b"]" * n + b"}]" + (b', "id": "' + b"x" * pad + b'"' if pad else b"") + b"}")


@pytest.mark.parametrize("pad", [0, 2 << 20], ids=["small", "streamed"])
def test_deep_json_never_reaches_triton(triton, gw, pad):
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", deep(100_000, pad))
    assert status == 400 and "max_json_depth" in answer["error"]
    assert httpclient.InferenceServerClient(triton.http_url).is_server_live()
    a = np.arange(4, dtype=np.float32)
    r = infer("http", gw.http_url, "add_sub", [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)


def test_deep_json_in_the_binary_extension_header(triton, gw):
    header = deep(5_000)
    body = header + b"\0" * 16
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body,
                          {"inference-header-content-length": str(len(header))})
    assert status == 400 and "max_json_depth" in answer["error"]


@pytest.mark.parametrize("path", ["/v2/repository/models/add_sub/load", "/v2/models/add_sub/generate",
                                  "/v2/trace/setting", "/v2/logging"])
def test_deep_json_on_the_other_endpoints(triton, gw, path):
    status, answer = post(gw.http_url, path, b'{"parameters": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert status == 400 and "max_json_depth" in answer["error"]
    assert httpclient.InferenceServerClient(triton.http_url).is_server_live()


@pytest.mark.parametrize("value", ["abc", "-5", "99999999"])
def test_bad_inference_header_content_length(gw, value):
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]})
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"inference-header-content-length": value})
    assert status == 400 and "Inference-Header-Content-Length" in answer["error"]


def test_a_legitimately_nested_request_passes(gw):
    a = np.arange(24, dtype=np.float32).reshape(2, 12)
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 12], "data": a.tolist()}],
                         "id": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})
    status, answer = post(gw.http_url, "/v2/models/identity_FP32/infer", body)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == a.reshape(-1).tolist()


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br", "x" * 100])
def test_unknown_content_encoding_is_415(triton, gw, encoding):
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]})
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"content-encoding": encoding})
    assert status == 415 and "compression" in answer["error"]


@pytest.mark.parametrize("pad", [0, 3 << 20], ids=["small", "streamed"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_deep_json_in_a_compressed_body(triton, gw, coding, pad):
    """Checked inflated — what the backend would parse — not as the compressed bytes."""
    import gzip
    import os
    import zlib
    raw = deep(100_000)
    if pad:  # an incompressible id, so that the compressed body itself streams (over 1 MiB)
        raw = raw[:-1] + b', "id": "' + os.urandom(pad // 2).hex().encode() + b'"}'
    body = gzip.compress(raw) if coding == "gzip" else zlib.compress(raw)
    assert not pad or len(body) > 1 << 20
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"content-encoding": coding})
    assert status == 400 and "max_json_depth" in answer["error"]
    assert httpclient.InferenceServerClient(triton.http_url).is_server_live()


def _raw(url: str, head: bytes) -> bytes:
    import socket
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


@pytest.mark.parametrize("headers", [
    b"".join(b"x-h%d: v\r\n" % i for i in range(20_000)),  # 20,000 headers
    b"x-big: " + b"a" * (2 << 20) + b"\r\n",  # a 2 MB header line
], ids=["many", "huge"])
def test_oversized_request_heads_are_431(triton, gw, headers):
    answer = _raw(gw.http_url, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    status_line = answer.split(b"\r\n", 1)[0]
    # 431 from the gateway's limit — or, for a head past the HTTP parser's own bounds, a 4xx
    # from the server before the application sees it; never a 2xx or 5xx.
    assert status_line.startswith(b"HTTP/1.1 4"), status_line
    a = np.arange(4, dtype=np.float32)
    r = infer("http", gw.http_url, "add_sub", [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)


def test_many_headers_get_the_gateways_431(gw):
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(150)) + b"\r\n"
    answer = _raw(gw.http_url, head)
    assert answer.startswith(b"HTTP/1.1 431")
    assert b"max_header_count" in answer


@pytest.mark.parametrize("path", [
    "/v2/models/..%2F..%2Fetc%2Fpasswd/infer", "/v2/models/a%00b/infer", "/v2/models/a%0D%0AX-Injected:%201/infer",
    "/v2/models/%2E%2E/infer", "/v2/models/add_sub/versions/1%0D%0AX: y/infer",
])
def test_hostile_model_names_over_http(triton, gw, path):
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]})
    host, port = gw.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path.replace(" ", "%20"), body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        answer = r.read()
        assert 400 <= r.status < 500, (r.status, answer)
        assert b"x-injected" not in b"".join(k.lower().encode() for k, _ in r.getheaders())
    finally:
        conn.close()
    assert httpclient.InferenceServerClient(triton.http_url).is_server_live()


@pytest.mark.parametrize("name", ["a\r\nX-Injected: 1", "../../etc", "a/b", "a\x00b", "%2F", "\x7f"])
def test_hostile_model_names_and_ids_over_grpc(triton, gw, name):
    import grpc

    from gateway._pb import grpc_predict_v2_pb2 as pb
    msg = pb.ModelInferRequest(model_name=name, id="id\r\nX-Injected: 1")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(gw.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(msg.SerializeToString(), timeout=30)
    assert info.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                                 grpc.StatusCode.UNAVAILABLE)
    assert not any(k.lower() == "x-injected" for k, _ in (info.value.trailing_metadata() or ()))


def test_an_id_with_crlf_comes_back_as_data_not_as_a_header(gw):
    body = orjson.dumps({"id": "a\r\nX-Injected: 1", "inputs": [
        {"name": f"INPUT{i}", "datatype": "FP32", "shape": [1], "data": [1]} for i in (0, 1)]})
    host, port = gw.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v2/models/add_sub/infer", body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        answer = orjson.loads(r.read())
        assert r.status == 200 and answer["id"] == "a\r\nX-Injected: 1"
        assert "x-injected" not in {k.lower() for k, _ in r.getheaders()}
    finally:
        conn.close()


def _add_sub_count(triton) -> int:
    stats = httpclient.InferenceServerClient(triton.http_url).get_inference_statistics("add_sub")
    return sum(s["inference_count"] for s in stats["model_stats"])


@pytest.mark.parametrize("framing", ["te-and-cl", "two-cl", "te-obfuscated"])
def test_request_smuggling_never_reaches_the_backend_as_two(triton, gw, framing):
    """A request framed to be read two ways (Transfer-Encoding with Content-Length, two
    Content-Lengths): the gateway refuses it or reads it one way, and sends the backend one
    request of its own framing — never the smuggled second one."""
    inner = orjson.dumps({"inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [1], "data": [1]}
                                     for i in (0, 1)]})
    smuggled = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(inner) + inner)
    chunked = b"%x\r\n" % len(inner) + inner + b"\r\n0\r\n\r\n"
    if framing == "te-and-cl":
        head = b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(chunked)
        body = chunked + smuggled
    elif framing == "two-cl":
        head = b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(inner), len(inner) + len(smuggled))
        body = inner + smuggled
    else:
        head = b"Transfer-Encoding: xchunked\r\nContent-Length: %d\r\n" % len(inner)
        body = inner + smuggled
    before = _add_sub_count(triton)
    answer = _raw(gw.http_url, b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\n" + head + b"\r\n" + body)
    statuses = [line for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    assert len(statuses) <= 1, statuses  # never a second answer on the connection
    assert _add_sub_count(triton) - before <= 1  # the backend saw at most the one request


def _identity_serves(triton) -> bool:
    """Triton's identity_FP32 (a Python-backend model) answers a real inference: its stub lives."""
    with httpclient.InferenceServerClient(triton.http_url) as c:
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[1.5, -2.0]], dtype=np.float32))
        return c.infer("identity_FP32", [inp]).as_numpy("OUTPUT0").tolist() == [[1.5, -2.0]]


def _empty_tensor_request(shape: list[int], form: str) -> tuple[bytes, dict]:
    tensor: dict = {"name": "INPUT0", "datatype": "FP32", "shape": shape}
    if form == "binary":
        tensor["parameters"] = {"binary_data_size": 0}
        head = orjson.dumps({"inputs": [tensor]})
        return head, {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    tensor["data"] = []
    return orjson.dumps({"inputs": [tensor]}), {}


def _refusal(gw, shape: list[int], form: str) -> tuple[str, str]:
    """What the gateway answers an identity_FP32 request with an empty tensor of ``shape``:
    (HTTP status or gRPC code, message)."""
    if form == "grpc":
        import grpc

        from gateway._pb import grpc_predict_v2_pb2 as pb
        msg = pb.ModelInferRequest(model_name="identity_FP32")
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
        with grpc.insecure_channel(gw.grpc_url) as ch:
            try:
                ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(msg.SerializeToString(), timeout=30)
            except grpc.RpcError as err:
                return err.code().name, err.details()
        return "OK", ""
    body, headers = _empty_tensor_request(shape, form)
    status, answer = post(gw.http_url, "/v2/models/identity_FP32/infer", body, headers)
    return str(status), answer.get("error", "")


@pytest.mark.parametrize("form", ["json", "binary", "grpc"])
@pytest.mark.parametrize("shape", [[0, (1 << 63) - 1], [1 << 40, 0], [0, 1 << 31, 1 << 31]])
def test_an_empty_tensor_with_a_huge_dimension_never_reaches_triton(triton, gw, shape, form):
    """[0, 2**63-1] FP32 holds no elements, passes Triton 2.51's own checks and kills its Python
    backend's stub (numpy: "array is too big") — the model then fails for every client. The
    gateway holds the dimensions other than 0 to limits.max_elements."""
    assert _identity_serves(triton)
    code, message = _refusal(gw, shape, form)
    assert code in ("400", "INVALID_ARGUMENT") and "limits.max_elements" in message, (code, message)
    assert _identity_serves(triton)


@pytest.mark.parametrize("form", ["json", "binary", "grpc"])
@pytest.mark.parametrize("shape", [[-1, (1 << 63) - 1], [0, -1, 1 << 62], [3, -4]])
def test_a_negative_dimension_is_the_gateways_400(triton, gw, shape, form):
    """Not a size: refused before routing, on every path (Triton 2.51's HTTP side answers a
    500 for it, which pass-through would otherwise relay)."""
    code, message = _refusal(gw, shape, form)
    assert code in ("400", "INVALID_ARGUMENT") and "negative dimension" in message, (code, message)
    assert _identity_serves(triton)
