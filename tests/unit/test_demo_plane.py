"""DemoPlane end to end on wire bytes: HTTP bodies and gRPC messages built and read by tritonclient."""
from __future__ import annotations

import gzip
import zlib

import ml_dtypes  # tritonclient's BF16 numpy type (a tritonclient dependency)
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import deserialize_bytes_tensor

import gateway
from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.dataplane import DataPlane, HttpReply
from gateway.demo.plane import DemoPlane
from gateway.errors import InvalidRequest, ModelNotFound, PayloadTooLarge, Unsupported, UnsupportedEncoding

PLANE = DemoPlane()
RNG = np.random.default_rng(11)

# tritonclient's numpy dtype per datatype.
NP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "BF16": ml_dtypes.bfloat16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


def values(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    if datatype == "BYTES":
        arr = np.empty(n, dtype=object)
        arr[:] = [bytes(RNG.integers(0, 256, size=i % 4, dtype=np.uint8)) for i in range(n)]
        return arr.reshape(shape)
    if datatype == "BOOL":
        return RNG.integers(0, 2, size=shape).astype(bool)
    if datatype == "BF16":
        return RNG.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(NP[datatype])
    if dtype.kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def body_of(reply: HttpReply) -> bytes:
    return reply.body if isinstance(reply.body, bytes) else b"".join(bytes(c) for c in reply.body)


async def http_infer(model: str, inputs, outputs=None, *, version: str = "", request_id: str = "",
                     encoding: str | None = None, plane: DemoPlane = PLANE):
    """Send a tritonclient-built body through infer_http; return (reply, InferResult)."""
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id=request_id
    )
    headers = {}
    if json_size is not None:
        headers["inference-header-content-length"] = str(json_size)
    if encoding == "gzip":
        body, headers["content-encoding"] = gzip.compress(body), "gzip"
    elif encoding == "deflate":
        body, headers["content-encoding"] = zlib.compress(body), "deflate"
    reply = await plane.infer_http(model, version, body, headers)
    hl = reply.headers.get("inference-header-content-length")
    result = httpclient.InferResult.from_response_body(body_of(reply), False, int(hl) if hl else None)
    return reply, result


def http_input(name: str, arr: np.ndarray, datatype: str, binary: bool = True) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


# --- health and metadata -----------------------------------------------------------


def test_is_a_data_plane():
    plane: DataPlane = PLANE  # the Protocol's static check; runtime below
    assert plane.server_live() and plane.server_ready()


def test_server_metadata():
    assert PLANE.server_metadata() == {
        "name": "oip-gateway-demo",
        "version": gateway.__version__,
        "extensions": ["binary_tensor_data"],
    }


async def test_model_ready_and_metadata():
    assert await PLANE.model_ready("add_sub", "")
    assert await PLANE.model_ready("identity_BF16", "1")
    assert not await PLANE.model_ready("add_sub", "2")
    assert not await PLANE.model_ready("nope", "")
    md = await PLANE.model_metadata("string_reverse", "")
    assert md["name"] == "string_reverse" and md["versions"] == ["1"] and md["platform"] == "python"
    with pytest.raises(ModelNotFound):
        await PLANE.model_metadata("add_sub", "2")


# --- HTTP ----------------------------------------------------------------------------


async def test_http_json_round_trip():
    body = orjson.dumps({
        "id": "42",
        "inputs": [
            {"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "INPUT1", "shape": [3], "datatype": "FP32", "data": [0.5, 0.5, 0.5]},
        ],
    })
    reply = await PLANE.infer_http("add_sub", "", body, {"content-type": "application/json"})
    assert reply.status == 200
    assert dict(reply.headers) == {"content-type": "application/json"}
    doc = orjson.loads(body_of(reply))
    assert doc == {
        "id": "42",
        "model_name": "add_sub",
        "model_version": "1",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [3], "data": [1.5, 2.5, 3.5]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [3], "data": [0.5, 1.5, 2.5]},
        ],
    }


async def test_http_binary_round_trip_add_sub():
    a, b = values("FP32", (64,)), values("FP32", (64,))
    reply, result = await http_infer(
        "add_sub", [http_input("INPUT0", a, "FP32"), http_input("INPUT1", b, "FP32")],
        [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")],
        request_id="r1",
    )
    assert reply.headers["content-type"] == "application/octet-stream"
    assert int(reply.headers["inference-header-content-length"]) > 0
    resp = result.get_response()
    assert (resp["id"], resp["model_name"], resp["model_version"]) == ("r1", "add_sub", "1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_http_output_subset_and_mixed_binary():
    a, b = np.array([1, 2], np.float32), np.array([3, 5], np.float32)
    inputs = [http_input("INPUT0", a, "FP32"), http_input("INPUT1", b, "FP32")]
    reply, result = await http_infer("add_sub", inputs, [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)])
    assert reply.headers == {"content-type": "application/json"}
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT1").tolist() == [-2, -3]
    _, result = await http_infer("add_sub", inputs, [
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
    ])
    outs = result.get_response()["outputs"]
    assert [o["name"] for o in outs] == ["OUTPUT0", "OUTPUT1"]  # the model's order, as Triton
    assert "data" in outs[0] and outs[1]["parameters"]["binary_data_size"] == 8
    assert result.as_numpy("OUTPUT0").tolist() == [4, 7]


@pytest.mark.parametrize("shape", [(2, 3), (0, 4), (3, 0)])
@pytest.mark.parametrize("datatype", list(NP))
async def test_http_identity_every_datatype(datatype, shape):
    arr = values(datatype, shape)
    _, result = await http_infer(
        f"identity_{datatype}", [http_input("INPUT0", arr, datatype)],
        [httpclient.InferRequestedOutput("OUTPUT0")],
    )
    out = result.as_numpy("OUTPUT0")
    assert out.shape == shape
    np.testing.assert_array_equal(out, arr)


async def test_http_string_reverse_json():
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "BYTES",
                                     "data": ["abc", "", "hello"]}]})
    reply = await PLANE.infer_http("string_reverse", "1", body, {})
    doc = orjson.loads(body_of(reply))
    (out,) = doc["outputs"]
    assert out == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [3], "data": ["cba", "", "olleh"]}


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_http_compressed_request(encoding):
    a = values("INT32", (4, 5))
    _, result = await http_infer("identity_INT32", [http_input("INPUT0", a, "INT32")], encoding=encoding)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)


async def test_http_raw_deflate_is_accepted():
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT8", "data": [1, 2]}]})
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    deflated = raw.compress(body) + raw.flush()
    reply = await PLANE.infer_http("identity_INT8", "", deflated, {"content-encoding": "deflate"})
    assert orjson.loads(body_of(reply))["outputs"][0]["data"] == [1, 2]


async def test_http_compression_errors():
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT8", "data": [1, 2]}]})
    with pytest.raises(UnsupportedEncoding, match="br"):
        await PLANE.infer_http("identity_INT8", "", body, {"content-encoding": "br"})
    with pytest.raises(InvalidRequest, match="gzip"):
        await PLANE.infer_http("identity_INT8", "", gzip.compress(body)[:-6], {"content-encoding": "gzip"})
    with pytest.raises(InvalidRequest, match="gzip"):
        await PLANE.infer_http("identity_INT8", "", b"not gzip", {"content-encoding": "gzip"})
    with pytest.raises(InvalidRequest):
        await PLANE.infer_http("identity_INT8", "", gzip.compress(body) + b"xx", {"content-encoding": "gzip"})
    small = DemoPlane(max_message_bytes=1000)
    with pytest.raises(PayloadTooLarge):
        await small.infer_http("identity_INT8", "", gzip.compress(b" " * 100_000), {"content-encoding": "gzip"})


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("abc", InvalidRequest, "Unable to parse Inference-Header-Content-Length"),
        ("-3", InvalidRequest, "Unable to parse"),
        ("100000", InvalidRequest, "inference header size should be in range"),
        ("0", Unsupported, "raw binary input"),
    ],
)
async def test_http_bad_header_length(value, error, message):
    body = b'{"inputs": []}'
    with pytest.raises(error, match=message):
        await PLANE.infer_http("add_sub", "", body, {"inference-header-content-length": value})


async def test_http_model_is_checked_before_the_body():
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'nope' is not found"):
        await PLANE.infer_http("nope", "", b"garbage", {})
    with pytest.raises(ModelNotFound, match="version 2 is not found"):
        await PLANE.infer_http("add_sub", "2", b"garbage", {})


@pytest.mark.parametrize(
    ("model", "doc"),
    [
        ("add_sub", b"{not json"),
        ("add_sub", orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]})),
        ("add_sub", orjson.dumps({"inputs": [
            {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
            {"name": "INPUT1", "shape": [1], "datatype": "FP32", "data": [1]}],
            "outputs": [{"name": "OUTPUT7"}]})),
        ("identity_INT8", orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT8",
                                                    "data": [1, 2]}]})),
    ],
)
async def test_http_client_errors_are_gateway_errors(model, doc):
    with pytest.raises(InvalidRequest):
        await PLANE.infer_http(model, "", doc, {})


# --- gRPC ----------------------------------------------------------------------------
# Built with gateway._pb, not tritonclient.grpc: both register "inference.*" in
# protobuf's default descriptor pool, so one process cannot import both.

NP_WIRE = {dt: np.dtype(t).newbyteorder("<") for dt, t in NP.items() if dt not in ("BYTES", "BF16")}
NP_WIRE["BF16"] = np.dtype("<u2")  # bit patterns; the identity model never looks at them


def grpc_values(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype == "BF16":
        return RNG.integers(0, 2**16, size=shape, dtype=np.uint16)
    return values(datatype, shape)


def to_raw(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(e).to_bytes(4, "little") + e for e in arr.reshape(-1).tolist())
    return np.ascontiguousarray(arr, dtype=NP_WIRE[datatype]).tobytes()


def from_raw(raw: bytes, datatype: str, shape) -> np.ndarray:
    shape = tuple(shape)
    if datatype == "BYTES":
        return deserialize_bytes_tensor(raw).reshape(shape)
    return np.frombuffer(raw, dtype=NP_WIRE[datatype]).reshape(shape)


async def grpc_infer(model: str, inputs: list[tuple[str, np.ndarray, str]], outputs: list[str] | None = None,
                     *, version: str = "", request_id: str = "") -> tuple[pb.ModelInferResponse, dict]:
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, arr, datatype in inputs:
        req.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        req.raw_input_contents.append(to_raw(arr, datatype))
    for name in outputs or ():
        req.outputs.add(name=name)
    raw = await PLANE.infer_grpc(req.SerializeToString(), model, version, None)
    assert isinstance(raw, bytes)
    resp = pb.ModelInferResponse.FromString(raw)
    assert len(resp.raw_output_contents) == len(resp.outputs)
    arrays = {o.name: from_raw(c, o.datatype, o.shape) for o, c in zip(resp.outputs, resp.raw_output_contents)}
    return resp, arrays


async def test_grpc_add_sub():
    a, b = values("FP32", (10,)), values("FP32", (10,))
    resp, out = await grpc_infer("add_sub", [("INPUT0", a, "FP32"), ("INPUT1", b, "FP32")], request_id="g1")
    assert (resp.id, resp.model_name, resp.model_version) == ("g1", "add_sub", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("OUTPUT0", "FP32", [10]), ("OUTPUT1", "FP32", [10])
    ]
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


async def test_grpc_typed_contents():
    req = pb.ModelInferRequest(model_name="add_sub")
    for name, vals in (("INPUT0", [1.0, 2.0]), ("INPUT1", [0.5, 4.0])):
        t = req.inputs.add(name=name, datatype="FP32", shape=[2])
        t.contents.fp32_contents.extend(vals)
    resp = pb.ModelInferResponse.FromString(await PLANE.infer_grpc(req.SerializeToString(), "add_sub", "", None))
    assert from_raw(resp.raw_output_contents[0], "FP32", [2]).tolist() == [1.5, 6.0]
    assert from_raw(resp.raw_output_contents[1], "FP32", [2]).tolist() == [0.5, -2.0]


async def test_grpc_output_subset():
    a = np.array([1, 2], np.float32)
    resp, out = await grpc_infer("add_sub", [("INPUT0", a, "FP32"), ("INPUT1", a, "FP32")], ["OUTPUT1"])
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    assert out["OUTPUT1"].tolist() == [0, 0]


@pytest.mark.parametrize("shape", [(2, 3), (0, 2), (3, 0)])
@pytest.mark.parametrize("datatype", list(NP))
async def test_grpc_identity_every_datatype(datatype, shape):
    arr = grpc_values(datatype, shape)
    resp, out = await grpc_infer(f"identity_{datatype}", [("INPUT0", arr, datatype)], version="1")
    assert resp.outputs[0].datatype == datatype
    assert out["OUTPUT0"].shape == shape
    np.testing.assert_array_equal(out["OUTPUT0"], arr)


async def test_grpc_string_reverse():
    arr = np.array([b"abc", b"", b"\x00\x01\x02"], dtype=object)
    _, out = await grpc_infer("string_reverse", [("INPUT0", arr, "BYTES")])
    assert out["OUTPUT0"].tolist() == [b"cba", b"", b"\x02\x01\x00"]


async def test_grpc_errors():
    with pytest.raises(ModelNotFound):
        await PLANE.infer_grpc(b"", "nope", "", None)
    with pytest.raises(ModelNotFound):
        await PLANE.infer_grpc(b"", "add_sub", "5", None)
    with pytest.raises(InvalidRequest):
        await PLANE.infer_grpc(b"\xff\xff\xff", "add_sub", "", None)
    req = pb.ModelInferRequest(model_name="add_sub")
    with pytest.raises(InvalidRequest, match="expected 2 inputs but got 0"):
        await PLANE.infer_grpc(req.SerializeToString(), "add_sub", "", None)
    a = np.zeros(3, np.float32)
    with pytest.raises(InvalidRequest, match=r"INPUT0 shape \[3\] != INPUT1 shape \[2\]"):
        await grpc_infer("add_sub", [("INPUT0", a, "FP32"), ("INPUT1", a[:2], "FP32")])
