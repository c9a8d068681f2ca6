"""Float values in JSON never change (codec/jsonnum.py): NaN and ±Inf written and read as
Triton writes them, FP16/BF16 as numbers rounded once to nearest-even, integers beyond
2**53 exact. Property tests over the codec's JSON writers and readers."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec import httpdecode, httpencode
from gateway.codec.datatypes import to_numpy
from gateway.codec.jsonnum import float64_to_bf16, float64_to_fp16, float_json
from gateway.errors import InvalidRequest
from gateway.model import InferRequest, InferResponse, Tensor

SPECIAL = np.array([1.0, np.inf, -np.inf, np.nan, -0.0], dtype=np.float32)


def fp32_tensor(values: np.ndarray, name: str = "OUTPUT0") -> Tensor:
    return Tensor(name, "FP32", (len(values),), memoryview(values.astype("<f4").tobytes()))


def test_nonfinite_written_as_triton_writes_them():
    chunks, hl = httpencode.encode_response(InferResponse("m", outputs=(fp32_tensor(SPECIAL),)))
    text = b"".join(bytes(c) for c in chunks)
    assert hl is None and b'"data":[1.0,Infinity,-Infinity,NaN,-0.0]' in text  # not null


def test_nonfinite_read_back_from_a_triton_answer():
    body = b'{"model_name":"m","outputs":[{"name":"o","datatype":"FP32","shape":[5],' \
           b'"data":[1.0,Infinity,-Infinity,NaN,-0.0]}]}'
    got = to_numpy(httpdecode.decode_response(body, None).outputs[0])
    assert got.tobytes()[:8] == SPECIAL.tobytes()[:8] and np.isnan(got[3]) and np.signbit(got[4])
    assert np.isinf(got[1]) and got[2] < 0


def test_json_only_backend_receives_tokens_python_json_reads():
    """A gRPC client's +Inf to MLServer over JSON: MLServer's json.loads must read +Inf, not NaN."""
    req = InferRequest("m", inputs=(Tensor("x", "FP64", (3,), memoryview(np.array([np.inf, -np.inf, 2.5]).tobytes())),))
    chunks, hl = httpencode.encode_request(req, binary=False)
    assert hl is None
    data = json.loads(chunks[0])["inputs"][0]["data"]  # what MLServer's Python JSON reads
    assert data[0] == float("inf") and data[1] == float("-inf") and data[2] == 2.5


def test_malformed_json_still_refused():
    for bad in (b'{"outputs": [NaN', b'{"a": Infinit}', b"{"):
        with pytest.raises(InvalidRequest):
            httpdecode.decode_response(bad, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32), max_size=20))
def test_fp32_json_round_trip_keeps_every_value(values):
    arr = np.array(values, dtype=np.float32)
    chunks, _ = httpencode.encode_response(InferResponse("m", outputs=(fp32_tensor(arr),)))
    back = to_numpy(httpdecode.decode_response(b"".join(bytes(c) for c in chunks), None).outputs[0])
    nan = np.isnan(arr)
    assert np.array_equal(np.isnan(back), nan)
    assert back[~nan].tobytes() == arr[~nan].tobytes()  # bit for bit, -0.0 and subnormals included


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=8),
       st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8))
def test_64_bit_integers_exact_in_json(signed, unsigned):
    outs = (Tensor("i", "INT64", (len(signed),), memoryview(np.array(signed, "<i8").tobytes())),
            Tensor("u", "UINT64", (len(unsigned),), memoryview(np.array(unsigned, "<u8").tobytes())))
    chunks, _ = httpencode.encode_response(InferResponse("m", outputs=outs))
    back = httpdecode.decode_response(b"".join(bytes(c) for c in chunks), None).outputs
    assert to_numpy(back[0]).tolist() == signed and to_numpy(back[1]).tolist() == unsigned


def test_fp16_rounds_to_nearest_even_and_refuses_overflow():
    halfway = 1 + 2.0**-11  # between 1.0 and the next FP16 (1 + 2**-10): ties to even → 1.0
    assert float64_to_fp16("t", np.array([halfway]))[0] == 1.0
    assert float64_to_fp16("t", np.array([1 + 3 * 2.0**-11]))[0] == 1 + 2 * 2.0**-10  # tie, to even
    assert float64_to_fp16("t", np.array([65504.0]))[0] == 65504.0
    with pytest.raises(InvalidRequest, match="'t'.*FP16"):
        float64_to_fp16("t", np.array([70000.0]))
    assert np.isinf(float64_to_fp16("t", np.array([np.inf]))[0])  # an infinity stays one


def test_bf16_rounds_once_from_float64():
    # 1 + 2**-8 is halfway between 1.0 and 1 + 2**-7; 2**-30 more is above halfway, so BF16 is
    # 1 + 2**-7. Through float32 the 2**-30 is lost first and the tie goes to 1.0: double rounding.
    x = np.array([1 + 2.0**-8 + 2.0**-30])
    bits = float64_to_bf16("t", x)
    assert (bits.astype("<u4") << 16).view("<f4")[0] == 1 + 2.0**-7
    with pytest.raises(InvalidRequest, match="BF16"):
        float64_to_bf16("t", np.array([1e39]))


@settings(max_examples=500, deadline=None)
@given(st.floats(width=32, allow_nan=False))
def test_bf16_matches_a_reference_for_float32_values(x):
    """For values a float32 holds there is no double rounding: ml_dtypes agrees bit for bit."""
    try:
        ours = float64_to_bf16("t", np.array([x], np.float64))[0]
    except InvalidRequest:
        assert abs(x) > float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
        return
    ref = np.array([x], np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0]
    assert ours == ref


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 0xFFFF), max_size=16))
def test_fp16_and_bf16_json_round_trip(bits):
    for datatype in ("FP16", "BF16"):
        raw = np.array(bits, "<u2")
        as_float = raw.view("<f2").astype(np.float64) if datatype == "FP16" else \
            (raw.astype("<u4") << 16).view("<f4").astype(np.float64)
        raw = raw[~np.isnan(as_float)]  # NaN payloads have no JSON form; NaN itself is covered above
        t = Tensor("o", datatype, (len(raw),), memoryview(raw.tobytes()))
        chunks, _ = httpencode.encode_response(InferResponse("m", outputs=(t,)))
        back = httpdecode.decode_response(b"".join(bytes(c) for c in chunks), None).outputs[0]
        assert bytes(back.data) == raw.tobytes(), datatype


def test_float_json_fast_path_untouched_when_finite():
    arr = np.array([1.5, -0.0])
    assert float_json(arr) is arr
    assert orjson.dumps(float_json(np.array([np.nan]))) == b"[NaN]"
