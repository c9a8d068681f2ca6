"""JSON and the HTTP binary-data extension (gateway.codec.http), against tritonclient.http."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import serialize_byte_tensor

from gateway.codec import httpdecode, httpencode, jsondata
from gateway.codec.datatypes import DATATYPES, from_numpy, to_numpy
from gateway.errors import InvalidRequest, Unsupported
from gateway.model import InferRequest, InferResponse, RequestedOutput, Tensor

ALL = sorted(DATATYPES)
# (datatype, binary): every datatype in both forms (FP16/BF16 as JSON numbers) — but BF16 in
# JSON, which tritonclient itself refuses to write or read ("must be sent as binary data").
FORMS = [pytest.param(d, b, id=f"{d}-{'binary' if b else 'json'}") for d in ALL for b in (True, False)
         if b or d != "BF16"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3), *, json: bool = False, seed: int = 0) -> np.ndarray:
    """A tritonclient-ready array with edge values (non-finite and non-UTF-8 only when binary)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if datatype == "BOOL":
        arr = rng.integers(0, 2, n).astype(bool)
    elif datatype == "BYTES":
        pool = ["", "a", "é✓", "x" * 40] if json else [b"", b"a", "é✓".encode(), b"\xff\xfe\x00", b"x" * 40]
        arr = np.array([pool[i % len(pool)] for i in range(n)], dtype=object)
        if json:
            arr = np.array([s.encode() for s in arr], dtype=object)
    elif datatype in ("FP16", "BF16", "FP32", "FP64"):
        npdt = {"FP16": np.float16, "BF16": ml_dtypes.bfloat16, "FP32": np.float32, "FP64": np.float64}[datatype]
        vals = rng.standard_normal(n) * 1e3
        special = [0.1, -0.0, 1e-40, 3.4e38] if json else [np.nan, -np.inf, -0.0, 0.1]
        vals[: min(n, len(special))] = special[: min(n, len(special))]
        arr = vals.astype(npdt)
    else:
        info = np.iinfo(DATATYPES[datatype].dtype)
        arr = rng.integers(info.min, info.max, n, dtype=DATATYPES[datatype].dtype, endpoint=True)
        arr[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    return arr.reshape(shape)


def raw_of(arr: np.ndarray) -> bytes:
    if arr.dtype == object:
        return serialize_byte_tensor(arr).item() if arr.size else b""
    return arr.tobytes()


def triton_request(inputs: list[Any], outputs: list[Any] | None = None, **kw: Any) -> tuple[bytes, int | None]:
    args: dict[str, Any] = {"request_id": "", "sequence_id": 0, "sequence_start": False, "sequence_end": False,
                            "priority": 0, "timeout": None, "custom_parameters": None}
    args.update(kw)
    return _get_inference_request(inputs=inputs, outputs=outputs, **args)


def infer_input(name: str, arr: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


def body_of(doc: dict[str, Any], tail: bytes = b"") -> tuple[bytes, int | None]:
    head = orjson.dumps(doc)
    return head + tail, (len(head) if tail else None)


def joined(chunks: list[bytes | memoryview]) -> bytes:
    return b"".join(chunks)


# ------------------------------------------------------------ golden requests
@pytest.mark.parametrize(("datatype", "binary"), FORMS)
def test_tritonclient_request_decodes(datatype: str, binary: bool) -> None:
    arrays = {"a": sample(datatype, (2, 3), json=not binary), "z": sample(datatype, (0, 4), json=not binary)}
    inputs = [infer_input(n, a, datatype, binary) for n, a in arrays.items()]
    outputs = [httpclient.InferRequestedOutput("out", binary_data=False)]
    body, hl = triton_request(inputs, outputs, request_id="r1", sequence_id=7, priority=2, timeout=100,
                              custom_parameters={"k": "v"})
    req = httpdecode.decode_request(body, hl, "m", "1")
    assert (req.model_name, req.model_version, req.id) == ("m", "1", "r1")
    assert req.parameters == {"sequence_id": 7, "sequence_start": False, "sequence_end": False,
                              "priority": 2, "timeout": 100, "k": "v"}
    assert req.outputs == (RequestedOutput("out", {"binary_data": False}),)
    for t, (name, arr) in zip(req.inputs, arrays.items()):
        assert (t.name, t.datatype, t.shape, t.parameters) == (name, datatype, arr.shape, {})
        assert bytes(t.data) == raw_of(arr)


def test_tritonclient_no_outputs_asks_binary() -> None:
    body, hl = triton_request([infer_input("a", sample("INT8"), "INT8", True)])
    req = httpdecode.decode_request(body, hl, "m")
    assert req.parameters == {"binary_data_output": True}
    assert httpdecode.binary_policy(req) == (True, {})


def test_binary_policy_overrides() -> None:
    outputs = [httpclient.InferRequestedOutput("a", binary_data=True),
               httpclient.InferRequestedOutput("b", binary_data=False), httpclient.InferRequestedOutput("c")]
    body, hl = triton_request([infer_input("x", sample("FP32"), "FP32", True)], outputs)
    req = httpdecode.decode_request(body, hl, "m")
    assert httpdecode.binary_policy(req) == (False, {"a": True, "b": False, "c": True})


def test_binary_inputs_are_slices_of_the_body() -> None:
    body, hl = triton_request([infer_input("a", sample("FP64"), "FP64", True),
                               infer_input("b", sample("BYTES"), "BYTES", True)])
    req = httpdecode.decode_request(body, hl, "m")
    assert all(t.data.obj is body for t in req.inputs)


# ----------------------------------------------------------- golden responses
def response_of(arrays: dict[str, tuple[np.ndarray, str]], **kw: Any) -> InferResponse:
    tensors = []
    for name, (arr, datatype) in arrays.items():
        if datatype == "BF16":
            arr = arr.view(np.uint16)
        tensors.append(from_numpy(name, arr, datatype))
    return InferResponse("m", "1", kw.get("id", ""), kw.get("parameters", {}), tuple(tensors))


def tritonclient_reads(chunks: list[bytes | memoryview], hl: int | None) -> httpclient.InferResult:
    return httpclient.InferResult.from_response_body(joined(chunks), header_length=hl)


@pytest.mark.parametrize(("datatype", "binary"), FORMS)
def test_response_read_by_tritonclient(datatype: str, binary: bool) -> None:
    arrays = {"a": (sample(datatype, (2, 3), json=not binary), datatype),
              "z": (sample(datatype, (3, 0), json=not binary), datatype)}
    chunks, hl = httpencode.encode_response(response_of(arrays), default_binary=binary)
    assert (hl is not None) == binary
    result = tritonclient_reads(chunks, hl)
    for name, (arr, _) in arrays.items():
        got = result.as_numpy(name)
        assert got.shape == arr.shape
        if datatype == "BYTES" and not binary:  # tritonclient keeps JSON strings as str
            assert [s.encode() for s in got.reshape(-1)] == list(arr.reshape(-1))
        elif datatype == "BYTES":
            assert list(got.reshape(-1)) == list(arr.reshape(-1))
        else:
            assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes()  # bit for bit, NaN included


def test_response_field_order_is_tritons() -> None:
    resp = InferResponse("m", "3", "1", {}, (from_numpy("o", np.array([1, 2], np.int32)),))
    chunks, hl = httpencode.encode_response(resp, default_binary=True)
    head = (b'{"id":"1","model_name":"m","model_version":"3","outputs":[{"name":"o","datatype":"INT32",'
            b'"shape":[2],"parameters":{"binary_data_size":8}}]}')
    assert (chunks[0], hl, joined(chunks[1:])) == (head, len(head), np.array([1, 2], "<i4").tobytes())
    resp = InferResponse("m", "3", "", {"p": True}, (from_numpy("f", np.array([0.1], np.float32)),))
    chunks, hl = httpencode.encode_response(resp)
    assert hl is None
    assert chunks == [(b'{"model_name":"m","model_version":"3","parameters":{"p":true},"outputs":[{"name":"f",'
                       b'"datatype":"FP32","shape":[1],"data":[0.10000000149011612]}]}')]


def test_empty_binary_outputs_are_plain_json() -> None:
    # Triton sends Inference-Header-Content-Length only when binary bytes follow.
    resp = response_of({"e": (np.zeros((0, 3), np.float32), "FP32"), "s": (np.empty(0, object), "BYTES")})
    chunks, hl = httpencode.encode_response(resp, default_binary=True)
    assert hl is None and len(chunks) == 1
    doc = orjson.loads(chunks[0])
    assert [o["parameters"] for o in doc["outputs"]] == [{"binary_data_size": 0}] * 2
    assert "data" not in doc["outputs"][0]
    result = tritonclient_reads(chunks, hl)
    assert result.as_numpy("e").shape == (0, 3)
    assert httpdecode.decode_response(chunks[0], None).outputs == resp.outputs


def test_mixed_binary_and_json_outputs() -> None:
    arrays = {"a": (sample("INT64"), "INT64"), "b": (sample("FP32", json=True), "FP32"),
              "c": (sample("UINT16"), "UINT16")}
    resp = response_of(arrays, id="x")
    chunks, hl = httpencode.encode_response(resp, default_binary=True, overrides={"b": False})
    doc = orjson.loads(chunks[0])
    assert ["data" in o for o in doc["outputs"]] == [False, True, False]
    result = tritonclient_reads(chunks, hl)
    for name, (arr, _) in arrays.items():
        assert result.as_numpy(name).tobytes() == arr.tobytes()
    back = httpdecode.decode_response(joined(chunks), hl)
    assert [bytes(t.data) for t in back.outputs] == [bytes(t.data) for t in resp.outputs]
    assert (back.id, back.model_name, back.model_version) == ("x", "m", "1")
    assert all(t.parameters == {} for t in back.outputs)


def test_decode_response_as_ovms_sends_it() -> None:
    # OVMS: Content-Type application/json, yet Inference-Header-Content-Length and a binary tail.
    head = {"model_name": "m", "model_version": 2, "outputs": [
        {"name": "o", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "j", "datatype": "INT32", "shape": [1, 2], "data": [[5, 6]]}]}
    body, hl = body_of(head, np.array([1.5, 2.5], "<f4").tobytes())
    resp = httpdecode.decode_response(body, hl)
    assert resp.model_version == "2"
    assert to_numpy(resp.outputs[0]).tolist() == [1.5, 2.5]
    assert to_numpy(resp.outputs[1]).tolist() == [[5, 6]]


@pytest.mark.parametrize(("datatype", "data"), [("BYTES", b"\x02\x00\x00\x00\xff\xfe")])
def test_response_json_impossible(datatype: str, data: bytes) -> None:
    resp = InferResponse("m", outputs=(Tensor("out7", datatype, (1,), memoryview(data)),))
    with pytest.raises(InvalidRequest, match="'out7'"):
        httpencode.encode_response(resp)
    chunks, _ = httpencode.encode_response(resp, default_binary=True)
    assert joined(chunks[1:]) == data


# -------------------------------------------------------------- encode_request
def test_encode_request_binary() -> None:
    a, s = sample("FP32"), sample("BYTES")
    req = InferRequest("m", "1", "id", {"k": 1}, (from_numpy("a", a), from_numpy("s", s, parameters={"p": "q"})),
                       (RequestedOutput("o1"), RequestedOutput("o2", {"binary_data": False, "classification": 2})))
    chunks, hl = httpencode.encode_request(req)
    assert hl == len(chunks[0]) and chunks[1].obj is req.inputs[0].data.obj
    doc = orjson.loads(chunks[0])
    assert doc["inputs"][1]["parameters"] == {"p": "q", "binary_data_size": len(raw_of(s))}
    assert doc["outputs"] == [{"name": "o1", "parameters": {"binary_data": True}},
                              {"name": "o2", "parameters": {"binary_data": False, "classification": 2}}]
    assert doc["parameters"] == {"k": 1}
    back = httpdecode.decode_request(joined(chunks), hl, "m", "1")
    assert back.inputs == req.inputs and back.id == "id"


def test_encode_request_without_outputs_and_as_json() -> None:
    req = InferRequest("m", inputs=(from_numpy("a", sample("INT16")), from_numpy("b", sample("BOOL"))))
    chunks, hl = httpencode.encode_request(req)
    assert orjson.loads(chunks[0])["parameters"] == {"binary_data_output": True}
    chunks, hl = httpencode.encode_request(req, binary=False)
    assert hl is None and len(chunks) == 1
    doc = orjson.loads(chunks[0])
    assert "parameters" not in doc and doc["inputs"][1]["data"] == sample("BOOL").reshape(-1).tolist()
    assert httpdecode.decode_request(chunks[0], None, "m").inputs == req.inputs
    # FP16 as JSON numbers (MLServer reads them), exactly: widened, read back, rounded to itself.
    half = InferRequest("m", inputs=(from_numpy("h", sample("FP16")),))
    chunks, _ = httpencode.encode_request(half, binary=False)
    assert httpdecode.decode_request(chunks[0], None, "m").inputs == half.inputs


# ------------------------------------------------------ OVMS binary leniency
def test_ovms_single_bytes_input_takes_the_binary_section() -> None:
    raw = serialize_byte_tensor(np.array([b"jpeg-bytes"], dtype=object)).item()
    body, hl = body_of({"inputs": [{"name": "img", "shape": [1], "datatype": "BYTES"}]}, raw)
    assert bytes(httpdecode.decode_request(body, hl, "m").inputs[0].data) == raw


def test_ovms_fixed_input_sized_from_shape() -> None:
    doc = {"inputs": [{"name": "f", "shape": [2], "datatype": "FP32"},
                      {"name": "s", "shape": [1], "datatype": "BYTES"},
                      {"name": "i", "shape": [1], "datatype": "INT8", "parameters": {"binary_data_size": 1}}]}
    raw_s = b"\x01\x00\x00\x00z"
    body, hl = body_of(doc, np.array([1, 2], "<f4").tobytes() + raw_s + b"\x07")
    req = httpdecode.decode_request(body, hl, "m")
    assert [bytes(t.data) for t in req.inputs] == [np.array([1, 2], "<f4").tobytes(), raw_s, b"\x07"]


# --------------------------------------------------------------- malformed
def inp(name: str = "in0", datatype: str = "INT32", shape: Any = (2,), **kw: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape) if isinstance(shape, tuple) else shape, **kw}


BAD_REQUESTS: list[tuple[str, dict[str, Any], bytes]] = [
    ("lower-case datatype", {"inputs": [inp(datatype="int32", data=[1, 2])]}, b""),
    ("unknown datatype", {"inputs": [inp(datatype="FLOAT32", data=[1, 2])]}, b""),
    ("negative dim", {"inputs": [inp(shape=(-1, 2), data=[1, 2])]}, b""),
    ("float dim", {"inputs": [inp(shape=[2.0], data=[1, 2])]}, b""),
    ("shape not a list", {"inputs": [inp(shape=2, data=[1, 2])]}, b""),
    ("too few elements", {"inputs": [inp(shape=(3,), data=[1, 2])]}, b""),
    ("too many elements", {"inputs": [inp(shape=(1,), data=[1, 2])]}, b""),
    ("nesting mismatch", {"inputs": [inp(shape=(4,), data=[[1, 2], [3, 4]])]}, b""),
    ("nesting transposed", {"inputs": [inp(shape=(2, 2), data=[[1], [2], [3], [4]])]}, b""),
    ("ragged", {"inputs": [inp(shape=(2, 2), data=[[1, 2, 3], [4]])]}, b""),
    ("data not an array", {"inputs": [inp(shape=(1,), data=5)]}, b""),
    ("FP16 beyond its range", {"inputs": [inp(datatype="FP16", data=[1.0, 70000.0])]}, b""),
    ("BF16 beyond its range", {"inputs": [inp(datatype="BF16", data=[1.0, 1e39])]}, b""),
    ("float for INT32", {"inputs": [inp(data=[1.5, 2])]}, b""),
    ("bool for INT32", {"inputs": [inp(data=[True, False])]}, b""),
    ("int for BOOL", {"inputs": [inp(datatype="BOOL", data=[1, 0])]}, b""),
    # numpy reads a bool beside numbers as 1 / 0: never a silent 1.0 (Triton refuses a bool for a number)
    ("bool among ints for INT32", {"inputs": [inp(data=[1, True])]}, b""),
    ("bool among floats for FP32", {"inputs": [inp(datatype="FP32", data=[1.5, True])]}, b""),
    ("bool among ints for FP32", {"inputs": [inp(datatype="FP32", data=[False, 2])]}, b""),
    ("bool beside null for FP32", {"inputs": [inp(datatype="FP32", shape=(3,), data=[None, True, 1.5])]}, b""),
    ("bool among floats for FP16", {"inputs": [inp(datatype="FP16", data=[1.0, True])]}, b""),
    ("bool among floats, nested", {"inputs": [inp(datatype="FP64", shape=(2, 2), data=[[1.5, 2], [True, 3]])]},
     b""),
    ("bool among big ints", {"inputs": [inp(datatype="UINT64", data=[2**63, True])]}, b""),
    ("string for FP32", {"inputs": [inp(datatype="FP32", data=["1", "2"])]}, b""),
    ("UINT8 overflow", {"inputs": [inp(datatype="UINT8", data=[1, 256])]}, b""),
    ("INT8 underflow", {"inputs": [inp(datatype="INT8", data=[-129, 0])]}, b""),
    ("UINT64 negative", {"inputs": [inp(datatype="UINT64", data=[-1, 0])]}, b""),
    ("UINT64 negative, mixed", {"inputs": [inp(datatype="UINT64", data=[-1, 2**64 - 1])]}, b""),
    ("INT64 overflow, mixed", {"inputs": [inp(datatype="INT64", data=[-1, 2**63])]}, b""),
    ("float among big ints", {"inputs": [inp(datatype="UINT64", data=[1.0, 2**63])]}, b""),
    ("number for BYTES", {"inputs": [inp(datatype="BYTES", data=["a", 1])]}, b""),
    ("data and binary", {"inputs": [inp(data=[1, 2], parameters={"binary_data_size": 8})]}, bytes(8)),
    ("no data at all", {"inputs": [inp()]}, b""),
    ("binary overruns body", {"inputs": [inp(parameters={"binary_data_size": 8})]}, bytes(4)),
    ("binary size vs shape", {"inputs": [inp(parameters={"binary_data_size": 4})]}, bytes(4)),
    ("bytes left over", {"inputs": [inp(parameters={"binary_data_size": 8})]}, bytes(12)),
    ("negative binary size", {"inputs": [inp(parameters={"binary_data_size": -8})]}, bytes(8)),
    ("string binary size", {"inputs": [inp(parameters={"binary_data_size": "8"})]}, bytes(8)),
    ("bad BYTES binary", {"inputs": [inp(datatype="BYTES", shape=(1,), parameters={"binary_data_size": 6})]},
     b"\x05\x00\x00\x00ab"),
    ("two open BYTES", {"inputs": [inp(datatype="BYTES", shape=(1,)), inp("in1", "BYTES", (1,))]},
     b"\x00\x00\x00\x00" * 2),
    ("duplicate input", {"inputs": [inp(data=[1, 2]), inp(data=[3, 4])]}, b""),
    ("list parameter", {"inputs": [inp(data=[1, 2], parameters={"x": [1]})]}, b""),
    ("parameters not an object", {"inputs": [inp(data=[1, 2], parameters=[1])]}, b""),
]


@pytest.mark.parametrize(("doc", "tail"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_malformed_request_names_the_tensor(doc: dict[str, Any], tail: bytes) -> None:
    body, hl = body_of(doc, tail)
    with pytest.raises(InvalidRequest, match="'in0'"):
        httpdecode.decode_request(body, hl, "m")


@pytest.mark.parametrize(
    ("body", "hl", "match"),
    [
        (b'{"inputs": []}', 15, "Inference-Header-Content-Length"),
        (b'{"inputs": []}', -1, "Inference-Header-Content-Length"),
        (b'{"inputs": [}', None, "malformed JSON"),
        (b'[1, 2]', None, "object"),
        (b'{"id": 5, "inputs": []}', None, "'id'"),
        (b'{"inputs": {}}', None, "'inputs'"),
        (b'{"inputs": [{"shape": [1], "datatype": "INT8", "data": [1]}]}', None, "input 0"),
        (b'{"inputs": [], "parameters": {"binary_data_output": 1}}', None, "binary_data_output"),
        (b'{"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": "yes"}}]}', None, "'o'"),
        (b'{"inputs": []}  trailing', 14, "unclaimed"),
    ],
)
def test_malformed_request_envelope(body: bytes, hl: int | None, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        httpdecode.decode_request(body, hl, "m")


def test_shared_memory_is_unsupported() -> None:
    doc = {"inputs": [inp(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})]}
    with pytest.raises(Unsupported, match="'in0'"):
        httpdecode.decode_request(orjson.dumps(doc), None, "m")
    doc = {"inputs": [], "outputs": [{"name": "o", "parameters": {"shared_memory_region": "r"}}]}
    with pytest.raises(Unsupported, match="'o'"):
        httpdecode.decode_request(orjson.dumps(doc), None, "m")


def test_malformed_response_names_the_tensor() -> None:
    head = {"model_name": "m", "outputs": [{"name": "o", "datatype": "FP32", "shape": [2],
                                            "parameters": {"binary_data_size": 8}}]}
    body, hl = body_of(head, bytes(4))
    with pytest.raises(InvalidRequest, match="'o'"):
        httpdecode.decode_response(body, hl)
    with pytest.raises(InvalidRequest, match="'o'"):
        httpdecode.decode_response(orjson.dumps({"outputs": [{"name": "o", "datatype": "FP32", "shape": [2]}]}), None)


def test_json_null_reads_as_nan() -> None:
    # orjson (and so our encoder) writes NaN/Inf as null; reading it back gives NaN.
    req = httpdecode.decode_request(orjson.dumps({"inputs": [inp(datatype="FP32", data=[None, 1.0])]}), None, "m")
    got = to_numpy(req.inputs[0])
    assert np.isnan(got[0]) and got[1] == 1.0


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("BOOL", [[True, False], [False, True]], np.array([[1, 0], [0, 1]], "|b1")),
        ("UINT64", [[0, 2**64 - 1], [2**63, 1]], np.array([[0, 2**64 - 1], [2**63, 1]], "<u8")),
        ("FP32", [[1, 2.5], [-0.0, 1e39]], np.array([[1, 2.5], [-0.0, np.inf]], "<f4")),
        ("BYTES", [["a", ""], ["é", "zz"]], np.array([[b"a", b""], ["é".encode(), b"zz"]], object)),
    ],
)
def test_nested_json_data(datatype: str, data: list[Any], expected: np.ndarray) -> None:
    for given in (data, [x for row in data for x in row]):  # nested as the shape, or flat
        req = httpdecode.decode_request(orjson.dumps({"inputs": [inp("n", datatype, (2, 2), data=given)]}), None, "m")
        assert bytes(req.inputs[0].data) == raw_of(expected)


def test_true_elsewhere_in_the_text_leaves_numbers_alone() -> None:
    # The check for bools in numeric data runs when the text has a true/false token at all: here a
    # parameter, a BYTES element and an id have one, and the numbers go through unchanged.
    doc = {"id": "true",
           "inputs": [inp(datatype="FP32", data=[1.5, 2]), inp("s", "BYTES", (2,), data=["true", "false"])],
           "outputs": [{"name": "o", "parameters": {"binary_data": True}}]}
    body, hl = body_of(doc)
    req = httpdecode.decode_request(body, hl, "m")
    assert bytes(req.inputs[0].data) == np.array([1.5, 2], "<f4").tobytes()


def test_bool_in_a_backend_answer_is_refused() -> None:
    body = orjson.dumps({"model_name": "m", "outputs": [
        {"name": "out", "datatype": "FP32", "shape": [2], "data": [0.5, True]}]})
    with pytest.raises(InvalidRequest, match="'out'.*true or false"):
        httpdecode.decode_response(body, None)


@pytest.mark.parametrize("pad", [0, 8000])  # short text searched as bytes, long text vectorised
@pytest.mark.parametrize(("text", "found"), [
    (b'"x":true', True), (b'"x":false', True), (b'"name":"truer"', True), (b'"e":1e-05,"t":"ue"', False),
    (b'"data":[1.0,2.5e3]', False), (b'e', False), (b'true', True),
])
def test_bool_tokens(text: bytes, found: bool, pad: int) -> None:
    assert jsondata._bool_tokens(memoryview(b" " * pad + text)) is found
    assert jsondata._bool_tokens(memoryview(text + b" " * pad)) is found


# -- what KServe's server writes (issue 36) ----------------------------------------------
@pytest.mark.parametrize("field", ["model_version", "id"])
def test_null_is_absent_in_an_answer(field):
    """KServe's REST answers carry "model_version": null for a model without versions."""
    body = orjson.dumps({"model_name": "m", field: None, "outputs": [
        {"name": "OUT", "datatype": "INT32", "shape": [2], "data": [1, 2], "parameters": None}]})
    resp = httpdecode.decode_response(body, None)
    assert getattr(resp, field) == "" and resp.outputs[0].data.tobytes() == np.array([1, 2], "<i4").tobytes()


@pytest.mark.parametrize("datatype, shape", [("FP32", [0, 3]), ("INT64", [2, 0]), ("BYTES", [0, 3]),
                                             ("BOOL", [2, 0])])
@pytest.mark.parametrize("binary", [True, False])
def test_an_empty_tensor_goes_as_an_empty_data_array(datatype, shape, binary):
    """The one form every server reads: KServe takes binary_data_size 0 without a binary section
    as plain JSON and wants data; Triton takes every form."""
    dtype = {"FP32": "<f4", "INT64": "<i8", "BYTES": object, "BOOL": "?"}[datatype]
    req = InferRequest(model_name="m", inputs=(from_numpy("IN", np.zeros(shape, dtype=dtype), datatype),))
    chunks, header_length = httpencode.encode_request(req, binary=binary)
    doc = orjson.loads(chunks[0])
    assert doc["inputs"][0]["data"] == [] and "binary_data_size" not in doc["inputs"][0].get("parameters", {})
    assert header_length is None and len(chunks) == 1
    back = httpdecode.decode_request(b"".join(bytes(c) for c in chunks), header_length, "m")
    assert back.inputs[0].shape == tuple(shape) and back.inputs[0].data.nbytes == 0
