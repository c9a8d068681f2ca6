"""Triton's generate extension, converted (gateway.codec.generate): the rules of Triton 2.51's
HandleGenerate (src/http_server.cc) as tables and properties; the live comparison with
Triton is tests/integration/test_generate.py."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec import generate as gen
from gateway.codec.datatypes import DATATYPES, from_numpy, serialize_bytes_elements, to_numpy
from gateway.codec.grpc import decode_request, encode_response, encode_stream_response
from gateway.errors import BadUpstreamResponse, InvalidRequest, Unsupported
from gateway.model import InferResponse, Tensor

TEXT = {"text_input": gen.InputSpec("text_input", "BYTES", (-1,)),
        "max_tokens": gen.InputSpec("max_tokens", "INT32", (1,))}


def convert(body: object, inputs: dict[str, gen.InputSpec] = TEXT, model: str = "m",
            version: str = "") -> pb.ModelInferRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return pb.ModelInferRequest.FromString(gen.generate_to_grpc(gen.parse_generate(raw), inputs, model, version))


def params(msg: pb.ModelInferRequest) -> dict[str, object]:
    return {k: getattr(p, p.WhichOneof("parameter_choice")) for k, p in msg.parameters.items()}


def inputs(msg: pb.ModelInferRequest) -> dict[str, tuple[str, list[int], list[object]]]:
    req = decode_request(msg.SerializeToString())
    out = {}
    for t in req.inputs:
        arr = to_numpy(t)
        values = [v.decode() for v in arr.reshape(-1)] if t.datatype == "BYTES" else arr.reshape(-1).tolist()
        out[t.name] = (t.datatype, list(t.shape), values)
    return out


# ------------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("dims, count, shape", [
    ((1, 1), 1, (1, 1)),
    ((1, -1), 2, (1, 2)),
    ((-1,), 5, (5,)),
    ((-1,), 1, (1,)),
    ((-1,), 0, (0,)),
    ((-1, -1), 6, (1, 6)),
    ((2, -1), 6, (2, 3)),
    ((-1, 2), 6, (3, 2)),
    ((), 1, ()),
])
def test_shape_from_metadata(dims, count, shape):
    assert gen.tensor_shape("x", dims, count) == shape


@pytest.mark.parametrize("dims, count", [((1,), 2), ((3,), 0), ((), 2), ((2, -1), 3), ((0,), 0), ((4,), 2)])
def test_shape_that_cannot_be_made(dims, count):
    with pytest.raises(InvalidRequest, match="The schema can not convert input 'x' to tensor with proper shape"):
        gen.tensor_shape("x", dims, count)


@given(st.lists(st.one_of(st.just(-1), st.integers(1, 4)), max_size=4), st.integers(0, 64))
def test_shape_rule(dims, count):
    """Triton's rule, stated as what must hold: fixed dimensions kept, the innermost -1 takes
    the rest, other -1 are 1 — and it fails exactly when no such shape holds ``count``."""
    fixed = math.prod(d for d in dims if d != -1)
    free = [i for i, d in enumerate(dims) if d == -1]
    possible = count % fixed == 0 and (bool(free) or count == fixed)
    if not possible:
        with pytest.raises(InvalidRequest):
            gen.tensor_shape("x", tuple(dims), count)
        return
    shape = gen.tensor_shape("x", tuple(dims), count)
    assert math.prod(shape) == count
    assert all(s == d for s, d in zip(shape, dims) if d != -1)
    assert all(shape[i] == 1 for i in free[:-1])


# ------------------------------------------------------------------------------ request
def test_keys_become_inputs_or_parameters():
    msg = convert({"id": "42", "text_input": "hello world", "temperature": 0.5, "stream": False, "n": 3,
                   "parameters": {"max_tokens": 2, "top_k": 7, "s": "x"}})
    assert msg.model_name == "m" and msg.id == "42"
    assert inputs(msg) == {"text_input": ("BYTES", [1], ["hello world"]), "max_tokens": ("INT32", [1], [2])}
    # "id" is a parameter too, as in Triton; "parameters" keys are flat request parameters.
    assert params(msg) == {"id": "42", "temperature": 0.5, "stream": False, "n": 3, "top_k": 7, "s": "x"}
    assert isinstance(params(msg)["n"], int) and isinstance(params(msg)["temperature"], float)


def test_array_value_is_a_flat_tensor():
    msg = convert({"text_input": ["a", "bc", ""]})
    assert inputs(msg) == {"text_input": ("BYTES", [3], ["a", "bc", ""])}


def test_version_and_request_without_id():
    msg = convert({"text_input": "x"}, version="3")
    assert msg.model_version == "3" and msg.id == "" and "id" not in msg.parameters


@pytest.mark.parametrize("body, error, message", [
    ({"text_input": "a", "parameters": [1]}, InvalidRequest, "Expected JSON object for keyword: 'parameters'"),
    ({"text_input": "a", "bad": [1, 2]}, InvalidRequest,
     "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"text_input": "a", "bad": None}, InvalidRequest, "parameter 'bad' has invalid type"),
    ({"text_input": "a", "bad": {"x": 1}}, InvalidRequest, "parameter 'bad' has invalid type"),
    ({"text_input": "a", "parameters": {"bad": None}}, InvalidRequest,
     "Converting keyword: 'parameters': parameter 'bad' has invalid type"),
    ({"id": 7, "text_input": "a"}, InvalidRequest, "Unable to parse 'id'"),
    ({"text_input": 5}, InvalidRequest, "input 'text_input' is BYTES"),
    ({"text_input": [["a"], ["b"]]}, InvalidRequest, "nested arrays"),
    ({"text_input": {"a": 1}}, InvalidRequest, "nested arrays and objects"),
    ({"text_input": "a", "max_tokens": 1.0}, InvalidRequest, "input 'max_tokens' is INT32"),
    ({"text_input": "a", "max_tokens": True}, InvalidRequest, "input 'max_tokens' is INT32"),
    ({"text_input": "a", "max_tokens": 2**31}, InvalidRequest, "2147483648 is out of range for INT32"),
    ({"text_input": "a", "max_tokens": [1, 2]}, InvalidRequest, "can not convert input 'max_tokens'"),
    ({"text_input": "a", "big": 2**63}, InvalidRequest, "does not fit a 64-bit integer"),
    ({"text_input": "a", "timeout": 5}, Unsupported, "generate key 'timeout' cannot be sent to a gRPC backend"),
    ({"text_input": "a", "parameters": {"sequence_id": 5}}, Unsupported,
     "Converting keyword: 'parameters': generate key 'sequence_id'"),
    ({"text_input": "a", "triton_enable_empty_final_response": True}, Unsupported, "reserved for Triton"),
])
def test_refusals_name_the_key(body, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        convert(body)


@pytest.mark.parametrize("raw, message", [
    (b"{bad", "failed to parse the request JSON buffer"),
    (b"", "failed to parse the request JSON buffer"),
    (b"[1]", "must be a JSON object"),
    (b'{"text_input": "\xff"}', "not UTF-8"),
    (b'{"text_input": "a", "text_input": "b"}', "input 'text_input' already exists in request"),
    (b'{"text_input": "a", "t": 1, "parameters": {"t": 2}}', "generate key 't' is given twice"),
    (b'{"text_input": "\\ud800"}', "lone surrogate"),
    (b'{"text_input": "a", "s": "\\ud800"}', "lone surrogate"),
    (b'{"text_input": "a", "x": 1e999}', "beyond the range of a double"),
])
def test_malformed_bodies(raw, message):
    with pytest.raises(InvalidRequest, match=message):
        convert(raw)


def test_input_named_parameters_clashes_with_the_reserved_key():
    specs = {"parameters": gen.InputSpec("parameters", "INT32", (1,))}
    with pytest.raises(InvalidRequest, match="Keyword 'parameters' for nested schema also given as input tensor name"):
        convert({"parameters": {"a": 1}}, specs)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_inputs_are_refused_as_triton_does(datatype):
    specs = {"x": gen.InputSpec("x", datatype, (-1,))}
    with pytest.raises(InvalidRequest, match=f"receiving {datatype} data via JSON is not supported"):
        convert({"x": [1.0]}, specs)


def test_nonfinite_tokens_reach_float_inputs():
    specs = {"x": gen.InputSpec("x", "FP32", (-1,))}
    (_, shape, values), = inputs(convert(b'{"x": [NaN, Infinity, -Infinity, 1.5]}', specs)).values()
    assert shape == [4] and math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1.5]


_NUMERIC = [d for d in DATATYPES if d not in ("FP16", "BF16", "BYTES")]


@st.composite
def tensor_values(draw):
    datatype = draw(st.sampled_from([*_NUMERIC, "BYTES"]))
    info = DATATYPES[datatype]
    if datatype == "BYTES":
        element = st.text()
    elif datatype == "BOOL":
        element = st.booleans()
    elif info.dtype.kind in "iu":
        bounds = np.iinfo(info.dtype)
        element = st.integers(int(bounds.min), int(bounds.max))
    else:
        element = st.floats(allow_nan=False, width=32 if datatype == "FP32" else 64)
    scalar = draw(st.booleans())
    return datatype, (draw(element) if scalar else draw(st.lists(element, max_size=8)))


@given(tensor_values())
def test_values_travel_unchanged(case):
    """Every JSON value a datatype takes reaches the backend as exactly that value."""
    datatype, value = case
    specs = {"x": gen.InputSpec("x", datatype, (-1,))}
    (dt, shape, values), = inputs(convert({"x": value}, specs)).values()
    expected = value if isinstance(value, list) else [value]
    assert (dt, shape, values) == (datatype, [len(expected)], expected)


_KEYS = st.text(min_size=1).filter(lambda k: k not in gen.GRPC_RESERVED_PARAMS and not k.startswith("triton_")
                                   and k not in ("text_input", "max_tokens", "parameters", "id"))
_SCALARS = st.one_of(st.text(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                     st.floats(allow_nan=False, allow_infinity=False))


@given(st.dictionaries(_KEYS, _SCALARS, max_size=6), st.booleans())
def test_parameters_travel_unchanged(extra, nested):
    body = {"text_input": "t", "parameters": extra} if nested else {"text_input": "t", **extra}
    got = params(convert(body))
    assert got == extra
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in extra.items()}


# ----------------------------------------------------------------------------- response
def answer(*outputs: Tensor, id: str = "", parameters: dict | None = None) -> bytes:
    return encode_response(InferResponse("m", "1", id, parameters or {}, tuple(outputs)))


def text(name: str, *words: bytes) -> Tensor:
    return Tensor(name, "BYTES", (len(words),), memoryview(serialize_bytes_elements(words)))


def test_answer_is_flat_and_in_key_order():
    got = gen.answer_json(answer(text("text_output", b"hi"), from_numpy("index", np.array([3], np.int32)),
                                 from_numpy("vec", np.array([1.5, 2.5], np.float32)),
                                 from_numpy("empty", np.zeros((0,), np.int64)), id="42",
                                 parameters={"n": 7, "triton_final_response": False, "ok": True, "f": 0.25}), "b")
    assert got == (b'{"empty":[],"f":0.25,"id":"42","index":3,"model_name":"m","model_version":"1","n":7,'
                   b'"ok":true,"text_output":"hi","vec":[1.5,2.5]}')


def test_one_element_is_bare_whatever_the_shape():
    one = Tensor("o", "FP64", (1, 1), memoryview(np.array([[2.0]], "<f8").tobytes()))
    assert json.loads(gen.answer_json(answer(one), "b"))["o"] == 2.0


def test_first_of_reserved_parameters_outputs_wins():
    got = json.loads(gen.answer_json(answer(text("model_name", b"x"), text("p", b"tensor"), parameters={"p": "param"}),
                                     "b"))
    assert got["model_name"] == "m" and got["p"] == "param"


def test_outputs_that_json_cannot_carry():
    with pytest.raises(Unsupported, match="sending FP16 data via JSON is not supported"):
        gen.answer_json(answer(from_numpy("h", np.array([1, 2], np.float16))), "b")
    with pytest.raises(Unsupported, match="output 'o' holds bytes that are not UTF-8"):
        gen.answer_json(answer(text("o", b"\xff\xfe")), "b")
    with pytest.raises(BadUpstreamResponse, match="backend 'b' sent an unreadable response"):
        gen.answer_json(b"\x0a\xff", "b")


def test_nonfinite_floats_are_written_as_triton_writes_them():
    got = gen.answer_json(answer(from_numpy("a", np.array([np.nan, np.inf], np.float32)),
                                 from_numpy("s", np.array([-np.inf], np.float64))), "b")
    assert b'"a":[NaN,Infinity]' in got and b'"s":-Infinity' in got


@given(st.sampled_from(_NUMERIC), st.data())
def test_output_values_unchanged(datatype, data):
    info = DATATYPES[datatype]
    n = data.draw(st.integers(0, 6))
    raw = data.draw(st.binary(min_size=n * info.itemsize, max_size=n * info.itemsize))  # type: ignore[operator]
    arr = np.frombuffer(raw, info.dtype)
    if info.dtype.kind == "f":
        arr = arr[np.isfinite(arr)]
    if datatype == "BOOL":
        arr = arr.view(np.uint8) != 0
    t = Tensor("o", datatype, (len(arr),), memoryview(arr.astype(info.dtype).tobytes()))
    got = json.loads(gen.answer_json(answer(t), "b"))["o"]
    expected = arr.astype(np.float64).tolist() if info.dtype.kind == "f" else arr.tolist()
    assert got == (expected[0] if len(expected) == 1 else expected)


# ------------------------------------------------------------------------ stream answers
def test_stream_answers():
    ok = answer(text("text_output", b"a"))
    got = gen.split_stream_answer(encode_stream_response(answer=ok))
    assert got.error is None and bytes(got.answer) == ok
    model_error = gen.split_stream_answer(encode_stream_response(answer=answer(), error="word 0 failed"))
    assert (model_error.error, model_error.began) == ("word 0 failed", True)
    refused = gen.split_stream_answer(encode_stream_response(answer=b"", error="expected 2 inputs"))
    assert (refused.error, refused.began) == ("expected 2 inputs", False)
    with pytest.raises(BadUpstreamResponse):
        gen.split_stream_answer(b"\x0a\xff")


def test_events_and_errors_are_written_as_triton_writes_them():
    assert gen.sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert gen.error_json('no "model"') == b'{"error":"no \\"model\\""}'


def test_inputs_from_metadata():
    meta = {"name": "m", "inputs": [{"name": "t", "datatype": "BYTES", "shape": [-1, 1]}], "outputs": []}
    assert gen.inputs_from_metadata(meta, "b") == {"t": gen.InputSpec("t", "BYTES", (-1, 1))}
    with pytest.raises(BadUpstreamResponse, match="backend 'b'"):
        gen.inputs_from_metadata({"inputs": [{"name": "t"}]}, "b")
    with pytest.raises(BadUpstreamResponse, match="without an 'inputs' array"):
        gen.inputs_from_metadata({}, "b")


def test_the_codec_does_no_io():
    """gateway.codec.generate is pure codec (DESIGN.md "Layout"): it pulls in no transport."""
    import subprocess
    import sys

    code = ("import sys, gateway.codec.generate\n"
            "print(','.join(m for m in ('grpc', 'starlette', 'uvicorn', 'asyncio', 'aiohttp') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == ""
