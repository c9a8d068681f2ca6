"""codec/jsonfast.py and its C reader (gateway/codec/_jsondata.c) against the plain reading of
codec/httpdecode.py (orjson, then numpy): whatever the body, the fast reading either gives the
very same tensors — bytes, shapes, parameters — or leaves the body to the plain reading; and the
public decoders answer exactly what the plain reading answers, refusals word for word."""
from __future__ import annotations

import math
import struct

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.codec import httpdecode, jsonfast
from gateway.codec.jsonscan import JsonScanner
from gateway.errors import GatewayError

_jsondata = pytest.importorskip("gateway.codec._jsondata", reason="built without a C compiler")

NUMERIC = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP32", "FP64"]
OTHER = ["FP16", "BF16", "BYTES"]
CODES = {name: i for i, name in enumerate(NUMERIC)}


def plain(body: bytes, header_length: int | None = None, response: bool = False):
    view = memoryview(body)
    try:
        if response:
            return httpdecode._response(view, header_length, False)
        return httpdecode._request(view, header_length, "m", "1", False)
    except GatewayError as exc:
        return ("refused", type(exc).__name__, exc.message)


def fast(body: bytes, header_length: int | None = None, response: bool = False):
    view = memoryview(body)
    try:
        if response:
            return httpdecode._response(view, header_length, True)
        return httpdecode._request(view, header_length, "m", "1", True)
    except (GatewayError, jsonfast.Fallback):
        return None  # (decode_* read it the plain way)


def public(body: bytes, header_length: int | None = None, response: bool = False):
    try:
        if response:
            return httpdecode.decode_response(body, header_length)
        return httpdecode.decode_request(body, header_length, "m", "1")
    except GatewayError as exc:
        return ("refused", type(exc).__name__, exc.message)


def same(a, b) -> bool:
    """Two decode results alike: refusals by words; requests and responses field by field, the
    tensors' data by their bytes."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return a == b
    if a.model_name != b.model_name or a.model_version != b.model_version or a.id != b.id:
        return False
    if a.parameters != b.parameters:
        return False
    ta = a.inputs if hasattr(a, "inputs") else a.outputs
    tb = b.inputs if hasattr(b, "inputs") else b.outputs
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if (x.name, x.datatype, tuple(x.shape), x.parameters) != (y.name, y.datatype, tuple(y.shape), y.parameters):
            return False
        if bytes(x.data) != bytes(y.data):
            return False
    if hasattr(a, "outputs") and hasattr(a, "inputs") and a.outputs != b.outputs:
        return False
    return True


def check(body: bytes, header_length: int | None = None, response: bool = False) -> bool:
    """The property; returns whether the fast reading decided the body."""
    want = plain(body, header_length, response)
    got = fast(body, header_length, response)
    if got is not None:
        assert not isinstance(want, tuple), (body[:300], want)
        assert same(got, want), body[:300]
    assert same(public(body, header_length, response), want), body[:300]
    return got is not None


# -- tokens --------------------------------------------------------------------------------------
def _float_text(x: float) -> str:
    return repr(x) if math.isfinite(x) else "1e999"


decimal = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.integers(1, 10**25).map(str)),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=30).map(lambda d: "." + d)),
    st.one_of(st.just(""), st.builds(lambda e, s, n: f"{e}{s}{n}", st.sampled_from("eE"),
                                     st.sampled_from(["", "+", "-"]), st.integers(0, 400))),
)
integer = st.one_of(st.integers(-300, 300), st.integers(-(2**63), 2**64), st.integers(-(2**70), 2**70),
                    st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 2**24 + 1, 2**31, 2**32, 2**63 - 1,
                                     2**63, 2**64 - 1, 10**18 - 1, 10**18, -(10**18)])).map(str)
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(_float_text),
                   st.floats(width=32, allow_nan=False, allow_infinity=False).map(
                       lambda f: repr(struct.unpack("<f", struct.pack("<f", f))[0])),
                   st.sampled_from(["-0", "-0.0", "0.0", "0e0", "1e308", "1.7976931348623157e308", "1e309",
                                    "4.9e-324", "2.2250738585072014e-308", "1e-400", "3.4028235e38",
                                    "3.4028236e38", "1.401298464324817e-45", "0.1", "9007199254740993.0",
                                    "123456789012345678901234567890", "0.30000000000000004"]))
odd = st.sampled_from(["true", "false", "null", "NaN", "Infinity", "-Infinity", '"1"', "01", "1.", ".5", "+1",
                       "1e", "-", "--1", "1x", "[]", "{}", '{"a": 1}', "tru", "truex", "1 2"])
token = st.one_of(integer, decimal, floats, odd)
space = st.sampled_from(["", "", "", " ", "\n", "\t ", "\r\n  "])


@st.composite
def tensor(draw, datatypes=NUMERIC + OTHER):
    datatype = draw(st.sampled_from(datatypes))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    count = math.prod(shape)
    if datatype == "BOOL":
        pool = st.one_of(st.sampled_from(["true", "false"]), token) if draw(st.booleans()) else \
            st.sampled_from(["true", "false"])
    elif datatype == "BYTES":
        pool = st.one_of(st.text(max_size=5).map(lambda s: orjson.dumps(s).decode()), token)
    elif draw(st.booleans()):
        pool = st.one_of(integer, decimal, floats)  # all numbers: the fast reading's own ground
    else:
        pool = token
    values = draw(st.lists(pool, min_size=count, max_size=count))
    if draw(st.integers(0, 9)) == 0:  # the wrong number of elements
        values = values[:-1] if draw(st.booleans()) else values + values[:1]
    nested = draw(st.booleans())
    sp = draw(space)

    def text(vals: list[str], dims: list[int]) -> str:
        if len(dims) <= 1 or not nested:
            return "[" + sp + ("," + sp).join(vals) + sp + "]"
        step = max(1, len(vals) // dims[0])
        return "[" + ",".join(text(vals[i:i + step], dims[1:]) for i in range(0, len(vals), step)) + "]"

    return {"name": draw(st.sampled_from(["a", "b", "c"])), "datatype": datatype, "shape": shape,
            "data_text": text(values, shape)}


def body_of(tensors: list[dict], key: str = "inputs", extra: str = "") -> bytes:
    parts = []
    for t in tensors:
        parts.append('{"name": %s, "datatype": "%s", "shape": %s, "data": %s}'
                     % (orjson.dumps(t["name"]).decode(), t["datatype"], t["shape"], t["data_text"]))
    return ('{"id": "r1"%s, "%s": [%s]}' % (extra, key, ", ".join(parts))).encode()


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tensor(), min_size=1, max_size=3))
def test_a_request_reads_as_the_plain_reading_reads_it(tensors):
    check(body_of(tensors))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tensor(), min_size=1, max_size=2))
def test_a_response_reads_as_the_plain_reading_reads_it(tensors):
    body = body_of(tensors, "outputs", ', "model_name": "m", "model_version": "1"')
    check(body, response=True)


@settings(max_examples=300)
@given(st.lists(st.sampled_from([x for x in ["0.5", "-1.25", "3", "-0", "1e-3", "2.5E+2", "0.1", "7"]]),
                min_size=1, max_size=40), st.sampled_from(["FP32", "FP64"]))
def test_plain_numbers_are_read_by_the_fast_reading(values, datatype):
    """The fast reading does decide the common case (not merely fall back every time)."""
    body = body_of([{"name": "x", "datatype": datatype, "shape": [len(values)],
                     "data_text": "[" + ",".join(values) + "]"}])
    assert check(body)


@settings(max_examples=300)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_reads_back_bit_for_bit(x):
    for datatype, fmt in (("FP64", "<d"), ("FP32", "<f")):
        got = _jsondata.numbers(repr(x).encode(), 0, len(repr(x)), CODES[datatype], 1)
        with np.errstate(over="ignore"):
            want = np.asarray([orjson.loads(repr(x))], dtype=np.float64).astype(fmt).tobytes()
        if got is not None:
            assert bytes(got[0]) == want, (x, datatype)


def test_integer_ranges_and_edges():
    cases = [("INT8", "[-128,127]", b"\x80\x7f"), ("UINT8", "[0,255]", b"\x00\xff"),
             ("INT16", "[-32768]", struct.pack("<h", -32768)), ("UINT64", "[999999999999999999]",
                                                                struct.pack("<Q", 999999999999999999)),
             ("INT64", "[-999999999999999999]", struct.pack("<q", -999999999999999999)),
             ("BOOL", "[true, false]", b"\x01\x00"), ("FP32", "[-0]", struct.pack("<f", 0.0)),
             ("FP32", "[-0.0]", struct.pack("<f", -0.0)), ("FP64", "[1e22, 1e-22]", struct.pack("<2d", 1e22, 1e-22))]
    for datatype, text, want in cases:
        raw = text[1:-1].encode()
        count = text.count(",") + 1
        got = _jsondata.numbers(raw, 0, len(raw), CODES[datatype], count)
        assert got is not None and bytes(got[0]) == want, (datatype, text)
    for datatype, text in [("INT8", "128"), ("UINT8", "-1"), ("INT32", "1.0"), ("INT32", "1e2"), ("BOOL", "1"),
                           ("FP32", "true"), ("FP32", "null"), ("FP32", "NaN"), ("FP32", "1e400"),
                           ("FP32", "9007199254740993"), ("INT64", "1000000000000000000"), ("FP32", "01"),
                           ("FP32", "1."), ("FP32", ".5"), ("FP32", "+1"), ("FP32", "1e"), ("FP32", "-"),
                           ("FP32", "1,"), ("FP32", ",1"), ("FP32", "1 2"), ("FP32", "[1],[2,3]"),
                           ("FP32", "[1],2"), ("FP32", "1,[2]"), ("FP32", "[]"), ("FP32", "[[1]]]"), ("FP32", "]")]:
        raw = text.encode()
        assert _jsondata.numbers(raw, 0, len(raw), CODES[datatype], max(1, text.count(",") + 1)) is None, text


def test_nesting_dims_and_count():
    raw = b" [ [1, 2, 3] , [4,5,6] ] "
    got = _jsondata.numbers(raw, 0, len(raw), CODES["INT32"], 6)
    assert got is not None and got[1] == (1, 2, 3) and bytes(got[0]) == struct.pack("<6i", 1, 2, 3, 4, 5, 6)
    assert _jsondata.numbers(raw, 0, len(raw), CODES["INT32"], 5) is None  # more elements than the shape
    assert _jsondata.numbers(raw, 0, len(raw), CODES["INT32"], 7) is None  # fewer
    deep = b"[" * 40 + b"1" + b"]" * 40
    assert _jsondata.numbers(deep, 0, len(deep), CODES["INT32"], 1) is None
    ok = b"[" * 20 + b"1" + b"]" * 20
    assert _jsondata.numbers(ok, 0, len(ok), CODES["INT32"], 1)[1] == (1,) * 21
    view = memoryview(b"xx[1,2]yy")
    assert _jsondata.numbers(view, 3, 6, CODES["UINT8"], 2)[0] == bytearray(b"\x01\x02")
    with pytest.raises(ValueError):
        _jsondata.numbers(b"1", 0, 5, CODES["INT8"], 1)
    with pytest.raises(ValueError):
        _jsondata.numbers(b"1", 0, 1, 99, 1)


def test_escaped_member_names_and_data_elsewhere_fall_back_to_the_same_answer():
    bodies = [
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "d\\u0061ta": [1, 2]}]}',
        b'{"inputs": [{"name": "x\\u0041", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}',
        b'{"parameters": {"data": [1]}, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "data": [2]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": [{"name": "o",'
        b' "data": [5]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, NaN]}]}',
        b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2], "data": ["a:b", "c"]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP16", "shape": [2], "data": [0.1, 70000]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [{"a": 1, "a": 2}, 1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}',
        b'[{"inputs": []}]',
    ]
    for body in bodies:
        check(body)


def test_a_header_before_binary_data_reads_the_same():
    raw = struct.pack("<2f", 1.5, 2.5)
    header = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},' \
             b' {"name": "y", "datatype": "INT32", "shape": [2], "data": [3, 4]}]}'
    assert check(header + raw, len(header))


@settings(max_examples=300)
@given(st.lists(tensor(NUMERIC + ["BYTES"]), min_size=1, max_size=3), st.data())
def test_the_scanners_spans_do_not_depend_on_the_chunks(tensors, data):
    text = body_of(tensors)
    whole = JsonScanner(-1, True)
    whole.feed(text)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = JsonScanner(-1, True)
    last = 0
    for cut in cuts + [len(text)]:
        pieces.feed(memoryview(text)[last:cut])
        last = cut
    assert pieces.spans == whole.spans
    assert pieces.skeleton() == whole.skeleton()
    spans = whole.spans
    assume(len(spans) == 3 * len(tensors))
    for t, start, depth, end in zip(tensors, spans[::3], spans[1::3], spans[2::3]):
        assert b"[" + text[start:end] + b"]" == t["data_text"].encode()
        assert depth == 3  # (the body, "inputs", the tensor's object)
