"""Sanity tests straight against a real MLServer (no gateway in between).

They pin down how MLServer behaves, so that gateway tests against it can rely on it:
the models in tests/models/mlserver work over REST JSON (MLServer has no binary-data
extension, so binary_data=False on every input and output) and over gRPC, and the quirks
a gateway must cope with (error bodies, content types, BYTES in JSON, raw vs typed gRPC
contents) are asserted here.
"""
from __future__ import annotations

import http.client
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.support.procs import listening_ports

pytestmark = pytest.mark.mlserver

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}


@pytest.fixture(scope="module")
def http_client(mlserver):
    client = httpclient.InferenceServerClient(mlserver.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(mlserver):
    client = grpcclient.InferenceServerClient(mlserver.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_stub(mlserver):
    channel = grpc.insecure_channel(mlserver.grpc_url)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _sample(datatype: str, *, utf8_only: bool = False) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        weird = "é✓".encode() if utf8_only else b"\x00\xff\xfe"
        return np.array([[b"", b"a", "h\u00e9llo".encode()], [b"xyz", weird, b"0"]], dtype=np.object_)
    dtype = np.dtype(NUMPY[datatype])
    if dtype.kind == "f":
        info = np.finfo(dtype)
        return np.array([[info.min, info.max, 0.0], [info.tiny, -1.5, 3.25]], dtype=dtype)
    iinfo = np.iinfo(dtype)
    return np.array([[iinfo.min, iinfo.max, 0], [1, iinfo.max - 1, 7]], dtype=dtype)


def _http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=False)
    return inp


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _infer(transport, http_client, grpc_client, model, arrays, datatype, outputs=None):
    """Infer over one transport; returns (result, {output name: array})."""
    if transport == "http":
        inputs = [_http_input(n, a, datatype) for n, a in arrays.items()]
        req_outputs = [httpclient.InferRequestedOutput(o, binary_data=False) for o in outputs] if outputs else None
        result = http_client.infer(model, inputs, outputs=req_outputs)
        names = [o["name"] for o in result.get_response()["outputs"]]
    else:
        inputs = [_grpc_input(n, a, datatype) for n, a in arrays.items()]
        req_outputs = [grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None
        result = grpc_client.infer(model, inputs, outputs=req_outputs)
        names = [o.name for o in result.get_response().outputs]
    return result, {n: result.as_numpy(n) for n in names}


def _post(port: int, path: str, body: bytes | str, headers: dict | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        if isinstance(body, str):
            body = body.encode("utf-8")
        conn.request("POST", path, body=body, headers=headers if headers is not None else
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


ADD_SUB_BODY = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [2], "data": [3, 5]},
    ]
}


# --- process, ports, health -----------------------------------------------------------


def test_ports_are_discovered(mlserver):
    assert mlserver.http_port != mlserver.grpc_port
    assert {mlserver.http_port, mlserver.grpc_port} == listening_ports(mlserver.pid)
    assert mlserver.http_url == f"127.0.0.1:{mlserver.http_port}"
    assert mlserver.grpc_url == f"127.0.0.1:{mlserver.grpc_port}"
    assert mlserver.log_path.exists()
    assert "add_sub" in mlserver.models and "string_reverse" in mlserver.models


def test_health(http_client, grpc_client, mlserver):
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    # Health answers 200 with an empty body and no content type.
    status, _, body = _get(mlserver.http_port, "/v2/health/ready")
    assert (status, body) == (200, b"")


def test_model_ready(http_client, grpc_client):
    for model in ["add_sub", "string_reverse", *(f"identity_{dt}" for dt in DATATYPES)]:
        assert http_client.is_model_ready(model)
        assert http_client.is_model_ready(model, "1")
        assert grpc_client.is_model_ready(model, "1")
    assert not http_client.is_model_ready("add_sub", "2")  # 404 {"error": ...}
    assert not http_client.is_model_ready("no_such_model")


def test_grpc_model_ready_unknown_model_is_unknown_status(grpc_stub):
    # Quirk: ModelReady for an unknown model is not NOT_FOUND (as ModelInfer/ModelMetadata
    # are) but UNKNOWN, because the servicer's error handler is missing on that method.
    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelReady(pb.ModelReadyRequest(name="no_such_model"))
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert "not found" in err.value.details()


# --- metadata -----------------------------------------------------------------------------


def test_server_metadata(http_client, grpc_client):
    meta = http_client.get_server_metadata()
    assert meta == {"name": "mlserver", "version": "1.7.1", "extensions": []}
    gmeta = grpc_client.get_server_metadata()
    assert (gmeta.name, gmeta.version, list(gmeta.extensions)) == ("mlserver", "1.7.1", [])


def test_model_metadata(http_client, grpc_client):
    meta = http_client.get_model_metadata("add_sub", "1")
    assert meta["name"] == "add_sub"
    assert meta["platform"] == "mlserver-custom"
    # Quirk: "versions" is model-settings' dependency versions list, not the model's versions.
    assert meta["versions"] == []
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert http_client.get_model_metadata("add_sub") == meta

    gmeta = grpc_client.get_model_metadata("add_sub", "1")
    assert gmeta.name == "add_sub" and gmeta.platform == "mlserver-custom"
    assert [(t.name, t.datatype, list(t.shape)) for t in gmeta.inputs] == [
        ("INPUT0", "FP32", [-1]), ("INPUT1", "FP32", [-1])
    ]
    ident = http_client.get_model_metadata("identity_UINT16")
    assert ident["inputs"] == [{"name": "INPUT0", "datatype": "UINT16", "shape": [-1, -1]}]


# --- inference ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_add_sub(transport, http_client, grpc_client):
    a = np.array([1.5, 2.0, -3.0, 1e6], dtype=np.float32)
    b = np.array([0.5, 4.0, 3.0, 1.0], dtype=np.float32)
    result, out = _infer(transport, http_client, grpc_client, "add_sub", {"INPUT0": a, "INPUT1": b}, "FP32")
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert out["OUTPUT0"].dtype == np.float32 and out["OUTPUT0"].shape == (4,)
    response = result.get_response()
    if transport == "http":
        assert (response["model_name"], response["model_version"]) == ("add_sub", "1")
        # NumpyCodec tags outputs with its content type.
        assert response["outputs"][0]["parameters"] == {"content_type": "np"}
    else:
        assert (response.model_name, response.model_version) == ("add_sub", "1")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_add_sub_requested_output_subset(transport, http_client, grpc_client):
    a = np.array([1, 2], dtype=np.float32)
    _, out = _infer(transport, http_client, grpc_client, "add_sub", {"INPUT0": a, "INPUT1": a}, "FP32",
                    outputs=["OUTPUT1"])
    assert list(out) == ["OUTPUT1"]
    np.testing.assert_array_equal(out["OUTPUT1"], [0, 0])


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity(datatype, transport, http_client, grpc_client):
    # JSON can only carry BYTES that are valid UTF-8 (MLServer decodes them to strings).
    x = _sample(datatype, utf8_only=transport == "http")
    _, out = _infer(transport, http_client, grpc_client, f"identity_{datatype}", {"INPUT0": x}, datatype)
    y = out["OUTPUT0"]
    assert y.shape == x.shape
    if datatype == "BYTES" and transport == "http":
        # tritonclient's JSON path hands BYTES back as str: MLServer encodes them as UTF-8 strings.
        assert y.tolist() == [[v.decode("utf-8") for v in row] for row in x.tolist()]
    else:
        assert y.dtype == x.dtype
        assert y.tolist() == x.tolist()


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL", "BYTES"])
def test_identity_empty_tensor(datatype, transport, http_client, grpc_client):
    x = np.zeros((0, 3), dtype=NUMPY[datatype])
    _, out = _infer(transport, http_client, grpc_client, f"identity_{datatype}", {"INPUT0": x}, datatype)
    assert out["OUTPUT0"].shape == (0, 3)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_string_reverse(transport, http_client, grpc_client):
    x = np.array([b"abc", b"", b"hello world", b"x"], dtype=np.object_)
    _, out = _infer(transport, http_client, grpc_client, "string_reverse", {"INPUT0": x}, "BYTES")
    expected = [b"cba", b"", b"dlrow olleh", b"x"]
    got = [v.encode() if isinstance(v, str) else v for v in out["OUTPUT0"].tolist()]
    assert got == expected


def test_string_reverse_non_utf8_result_over_grpc(grpc_client):
    # Reversing the bytes of "hé" gives invalid UTF-8: fine over gRPC ...
    x = np.array(["hé".encode()], dtype=np.object_)
    result = grpc_client.infer("string_reverse", [_grpc_input("INPUT0", x, "BYTES")])
    assert result.as_numpy("OUTPUT0").tolist() == ["hé".encode()[::-1]]


def test_string_reverse_non_utf8_result_over_json_is_500(mlserver):
    # ... but MLServer cannot put it in JSON: a bare 500 "Internal Server Error" (text/plain;
    # with MLServer's debug setting on, the body is the Python traceback instead).
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["hé"]}]}
    status, ctype, payload = _post(mlserver.http_port, "/v2/models/string_reverse/infer", json.dumps(body))
    assert status == 500
    assert ctype.startswith("text/plain")
    assert payload == b"Internal Server Error"


# --- gRPC wire details --------------------------------------------------------------------


def test_grpc_raw_request_gets_raw_response(grpc_client):
    # tritonclient always sends raw_input_contents; MLServer then answers with
    # raw_output_contents (and an empty `contents` message on each output).
    a = np.array([1, 2], dtype=np.float32)
    result = grpc_client.infer("add_sub", [_grpc_input("INPUT0", a, "FP32"), _grpc_input("INPUT1", a, "FP32")])
    response = result.get_response()
    assert len(response.raw_output_contents) == 2
    assert np.frombuffer(response.raw_output_contents[0], dtype="<f4").tolist() == [2.0, 4.0]
    assert all(len(o.contents.fp32_contents) == 0 for o in response.outputs)


def test_grpc_typed_request_gets_typed_response(grpc_stub):
    request = pb.ModelInferRequest(model_name="add_sub", model_version="1", id="req-1")
    for name, values in (("INPUT0", [1.0, 2.0]), ("INPUT1", [3.0, 5.0])):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[2])
        tensor.contents.fp32_contents.extend(values)
    response = grpc_stub.ModelInfer(request)
    assert not response.raw_output_contents
    assert (response.model_name, response.model_version, response.id) == ("add_sub", "1", "req-1")
    assert [list(o.contents.fp32_contents) for o in response.outputs] == [[4.0, 7.0], [-2.0, -3.0]]

    request = pb.ModelInferRequest(model_name="identity_BYTES")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend(
        [b"x", b"\xff"])
    response = grpc_stub.ModelInfer(request)
    assert list(response.outputs[0].contents.bytes_contents) == [b"x", b"\xff"]

    request = pb.ModelInferRequest(model_name="identity_INT8")
    request.inputs.add(name="INPUT0", datatype="INT8", shape=[2]).contents.int_contents.extend([-5, 7])
    response = grpc_stub.ModelInfer(request)
    assert list(response.outputs[0].contents.int_contents) == [-5, 7]


def test_grpc_fp16_needs_raw_contents(grpc_stub):
    # There is no typed field for FP16; MLServer maps it to bytes_contents and then fails to
    # decode the elements. Only raw_input_contents works for FP16 (as tritonclient sends).
    request = pb.ModelInferRequest(model_name="identity_FP16")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1]).contents.bytes_contents.append(
        np.float16(1.5).tobytes())
    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_errors(grpc_stub):
    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelInfer(pb.ModelInferRequest(model_name="no_such_model"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "Model no_such_model with version  not found"

    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelInfer(pb.ModelInferRequest(model_name="add_sub", model_version="7"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelMetadata(pb.ModelMetadataRequest(name="no_such_model"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP64", shape=[1]).contents.fp64_contents.append(1.0)
    with pytest.raises(grpc.RpcError) as err:
        grpc_stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # InferenceError (HTTP 400)


def test_grpc_nan_output_is_internal_error(grpc_client):
    # Quirk: NumpyCodec turns NaN into None (JSON null), which then cannot be packed into
    # raw_output_contents: any NaN in a numeric output fails the whole request.
    x = np.array([[np.nan, 1.0]], dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer("identity_FP32", [_grpc_input("INPUT0", x, "FP32")])
    assert "INTERNAL" in str(err.value.status())
    x = np.array([[np.inf, -np.inf]], dtype=np.float32)
    result = grpc_client.infer("identity_FP32", [_grpc_input("INPUT0", x, "FP32")])
    assert result.as_numpy("OUTPUT0").tolist() == x.tolist()


# --- REST/JSON quirks ---------------------------------------------------------------------


def test_http_response_shape_and_id(mlserver):
    status, ctype, payload = _post(mlserver.http_port, "/v2/models/add_sub/versions/1/infer",
                                   json.dumps({"id": "my-id", **ADD_SUB_BODY}))
    assert (status, ctype) == (200, "application/json")
    body = json.loads(payload)
    assert body["id"] == "my-id"
    assert body["model_version"] == "1"
    assert body["parameters"] == {}
    assert body["outputs"][0] == {"name": "OUTPUT0", "shape": [2], "datatype": "FP32",
                                  "parameters": {"content_type": "np"}, "data": [4.0, 7.0]}
    # Without an id, MLServer makes up a UUID.
    status, _, payload = _post(mlserver.http_port, "/v2/models/add_sub/infer", json.dumps(ADD_SUB_BODY))
    assert status == 200 and len(json.loads(payload)["id"]) == 36


def test_http_bytes_in_json_are_strings(mlserver):
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "data": ["ab", "héllo"]}]}
    status, _, payload = _post(mlserver.http_port, "/v2/models/identity_BYTES/infer", json.dumps(body))
    assert status == 200
    out = json.loads(payload)["outputs"][0]
    assert out == {"name": "OUTPUT0", "shape": [1, 2], "datatype": "BYTES", "data": ["ab", "héllo"]}


def test_http_content_type(mlserver):
    body = json.dumps(ADD_SUB_BODY)
    path = "/v2/models/add_sub/infer"
    assert _post(mlserver.http_port, path, body, {"Content-Type": "application/json"})[0] == 200
    assert _post(mlserver.http_port, path, body, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    assert _post(mlserver.http_port, path, body, {})[0] == 200  # no Content-Type: parsed as JSON
    # Any other content type (curl -d sends x-www-form-urlencoded) is not parsed: FastAPI's 422.
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream"):
        status, rctype, payload = _post(mlserver.http_port, path, body, {"Content-Type": ctype})
        assert (status, rctype) == (422, "application/json")
        assert json.loads(payload)["detail"][0]["type"] == "model_attributes_type"


def test_http_unknown_model_or_version(mlserver):
    status, ctype, payload = _post(mlserver.http_port, "/v2/models/no_such_model/infer", json.dumps(ADD_SUB_BODY))
    assert (status, ctype, json.loads(payload)) == (404, "application/json", {"error": "Model no_such_model not found"})
    status, _, payload = _post(mlserver.http_port, "/v2/models/add_sub/versions/7/infer", json.dumps(ADD_SUB_BODY))
    assert (status, json.loads(payload)) == (404, {"error": "Model add_sub with version 7 not found"})
    status, _, payload = _get(mlserver.http_port, "/v2/models/no_such_model")
    assert (status, json.loads(payload)) == (404, {"error": "Model no_such_model not found"})
    status, _, payload = _get(mlserver.http_port, "/v2/models/no_such_model/ready")
    assert status == 404
    # Unknown routes and methods are FastAPI's own {"detail": ...}.
    assert _get(mlserver.http_port, "/v2/nope") == (404, "application/json", b'{"detail":"Not Found"}')
    assert _get(mlserver.http_port, "/v2/models/add_sub/infer")[0] == 405


def test_http_malformed_json(mlserver):
    path = "/v2/models/add_sub/infer"
    for bad in ('{"inputs": [', "", '{"inputs": []} trailing', '{"inputs": [{"data": [NaN]}]}'):
        status, ctype, payload = _post(mlserver.http_port, path, bad)
        assert (status, ctype) == (422, "application/json"), bad
        detail = json.loads(payload)["detail"]
        assert isinstance(detail, list) and detail[0]["type"] in ("json_invalid", "missing"), bad
    # Schema violations are 422 too, with pydantic's error list.
    bad = {"inputs": [{"name": "INPUT0", "datatype": "XX", "shape": [1], "data": [1]}]}
    status, _, payload = _post(mlserver.http_port, path, json.dumps(bad))
    assert status == 422 and json.loads(payload)["detail"][0]["type"] == "enum"


def test_http_model_errors_are_400_with_error_body(mlserver):
    path = "/v2/models/add_sub/infer"
    bad = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]},
                      {"name": "INPUT1", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}
    status, ctype, payload = _post(mlserver.http_port, path, json.dumps(bad))
    assert (status, ctype) == (400, "application/json")
    assert json.loads(payload) == {"error": "INPUT0 shape [2] != INPUT1 shape [3]"}
    bad = {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [1], "data": [1]}]}
    status, _, payload = _post(mlserver.http_port, path, json.dumps(bad))
    assert status == 400 and "expected FP32" in json.loads(payload)["error"]


def test_http_binary_extension_is_not_supported(mlserver, http_client):
    # A binary-data request (Inference-Header-Content-Length) is just invalid JSON to MLServer.
    a = np.array([1, 2], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(a, binary_data=True)
    with pytest.raises(InferenceServerException) as err:
        http_client.infer("add_sub", [inp, _http_input("INPUT1", a, "FP32")])
    assert err.value.status() == "422" or "422" in str(err.value)
    # Asking for binary outputs is ignored: the data comes back as JSON.
    result = http_client.infer(
        "add_sub", [_http_input("INPUT0", a, "FP32"), _http_input("INPUT1", a, "FP32")],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
    )
    assert result.get_response()["outputs"][0]["data"] == [2.0, 4.0]
