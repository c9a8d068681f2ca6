"""Property tests: tensors of every datatype and shape cross every wire form bit for bit.

Raw bytes are compared, so NaN payloads and -0.0 count. JSON carries every
datatype (FP16/BF16 as numbers; NaN, Infinity and -Infinity as Triton writes them)
but not NaN payloads or non-UTF-8 BYTES, so the JSON properties draw any value
with NaNs canonical; the binary and gRPC ones draw any bytes.
"""
from __future__ import annotations

import math

import numpy as np
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codec import grpc, httpdecode, httpencode
from gateway.codec.datatypes import DATATYPES, serialize_bytes_elements, validate_tensor
from gateway.model import InferRequest, InferResponse, RequestedOutput, Tensor

ALL = sorted(DATATYPES)
JSON_OK = ALL
# The one NaN a JSON "NaN" token reads back as, per float type (quiet, positive, no payload).
CANONICAL_NAN = {"FP16": 0x7E00, "BF16": 0x7FC0, "FP32": 0x7FC00000, "FP64": 0x7FF8000000000000}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
utf8 = st.text(st.characters(exclude_categories=("Cs",)), max_size=6).map(str.encode)


@st.composite
def tensor(draw: st.DrawFn, name: str, json: bool) -> Tensor:
    datatype = draw(st.sampled_from(JSON_OK if json else ALL))
    shape = draw(shapes)
    n = math.prod(shape)
    info = DATATYPES[datatype]
    each = {"min_size": n, "max_size": n}
    if datatype == "BYTES":
        data = serialize_bytes_elements(draw(st.lists(utf8 if json else st.binary(max_size=6), **each)))
    elif json and datatype == "BOOL":
        data = bytes(draw(st.lists(st.booleans(), **each)))
    elif json and datatype in CANONICAL_NAN:
        # Any bit pattern (subnormals, -0.0, ±Inf, the extremes), NaNs made canonical.
        assert info.itemsize is not None
        bits = np.frombuffer(draw(st.binary(min_size=n * info.itemsize, max_size=n * info.itemsize)),
                             f"<u{info.itemsize}").copy()
        as_float = bits.view({"FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}.get(datatype, "<f4")) \
            if datatype != "BF16" else (bits.astype("<u4") << 16).view("<f4")
        bits[np.isnan(as_float)] = CANONICAL_NAN[datatype]
        data = bits.tobytes()
    else:  # any bit pattern: NaN payloads, signalling NaNs, subnormals, BOOL bytes other than 0/1
        assert info.itemsize is not None
        data = draw(st.binary(min_size=n * info.itemsize, max_size=n * info.itemsize))
    params = draw(st.dictionaries(st.sampled_from("pq"), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=3),
                                  max_size=2))
    return Tensor(name, datatype, shape, memoryview(data), params)


@st.composite
def tensor_list(draw: st.DrawFn, json: bool) -> tuple[Tensor, ...]:
    names = draw(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=4, unique=True))
    return tuple(draw(tensor(n, json)) for n in names)


def same(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> None:
    assert [(t.name, t.datatype, t.shape, t.parameters, bytes(t.data)) for t in a] == [
        (t.name, t.datatype, t.shape, t.parameters, bytes(t.data)) for t in b
    ]


@SETTINGS
@given(tensor_list(json=False), st.booleans())
def test_request_binary_http_and_raw_grpc(inputs: tuple[Tensor, ...], with_outputs: bool) -> None:
    for t in inputs:
        validate_tensor(t)
    outputs = (RequestedOutput("o", {"classification": 1}),) if with_outputs else ()
    req = InferRequest("m", "1", "id", {"k": "v"}, inputs, outputs)
    chunks, hl = httpencode.encode_request(req)
    via_http = httpdecode.decode_request(b"".join(chunks), hl, "m", "1")
    same(via_http.inputs, inputs)
    via_grpc = grpc.decode_request(grpc.encode_request(via_http))
    same(via_grpc.inputs, inputs)
    assert (via_grpc.model_name, via_grpc.model_version, via_grpc.id, via_grpc.parameters) == ("m", "1", "id",
                                                                                             {"k": "v"})
    assert [o.name for o in via_grpc.outputs] == [o.name for o in outputs]


@SETTINGS
@given(tensor_list(json=False))
def test_response_binary_http_and_raw_grpc(outputs: tuple[Tensor, ...]) -> None:
    resp = InferResponse("m", "2", "", {}, outputs)
    back = grpc.decode_response(grpc.encode_response(resp))
    same(back.outputs, outputs)
    chunks, hl = httpencode.encode_response(back, default_binary=True)
    body = b"".join(chunks)
    same(httpdecode.decode_response(body, hl).outputs, outputs)
    result = httpclient.InferResult.from_response_body(body, header_length=hl)
    for t in outputs:
        got = result.as_numpy(t.name)
        assert got.shape == t.shape
        if t.datatype == "BYTES":
            assert serialize_bytes_elements(got.reshape(-1).tolist()) == bytes(t.data)
        else:
            assert got.tobytes() == bytes(t.data)


@SETTINGS
@given(tensor_list(json=True))
def test_json_request_and_response(tensors: tuple[Tensor, ...]) -> None:
    req = InferRequest("m", inputs=tensors)
    chunks, hl = httpencode.encode_request(req, binary=False)
    assert hl is None
    via_json = httpdecode.decode_request(chunks[0], None, "m")
    same(via_json.inputs, tensors)
    resp = grpc.decode_response(grpc.encode_response(InferResponse("m", "1", "", {}, via_json.inputs)))
    chunks, hl = httpencode.encode_response(resp)
    assert hl is None and len(chunks) == 1
    same(httpdecode.decode_response(chunks[0], None).outputs, tensors)
    result = httpclient.InferResult.from_response_body(chunks[0], header_length=None)
    for t in tensors:  # tritonclient reads the same values from our JSON
        got = result.as_numpy(t.name)
        assert got.shape == t.shape
        if t.datatype == "BYTES":
            assert serialize_bytes_elements([s.encode() for s in got.reshape(-1).tolist()]) == bytes(t.data)
        else:
            assert got.tobytes() == bytes(t.data)
