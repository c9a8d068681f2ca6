"""Hard limits below the network: the JSON check, the wire walk and the parsed fast path agree."""
from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec import limits as limits_module
from gateway.codec.grpcscan import scan_checked
from gateway.codec.bounds import check_names
from gateway.codec.limits import JsonCheck, check_json, check_pb
from gateway.codec.wire import scan_infer_routing
from gateway.config.security import Limits
from gateway.errors import InvalidRequest, LimitExceeded, NegativeDimension

SMALL = Limits(max_tensors=3, max_dims=4, max_elements=1000, max_name_length=8, max_id_length=10)


def message(n_in=1, shape=(2,), name="IN", rid="", n_out=0, seq=None) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", model_version="1", id=rid)
    for k in range(n_in):
        t = req.inputs.add(name=f"{name}{k}" if name else "", datatype="FP32")
        t.shape.extend(shape)
    for k in range(n_out):
        req.outputs.add(name=f"O{k}")
    if seq is not None:
        if isinstance(seq, str):
            req.parameters["sequence_id"].string_param = seq
        else:
            req.parameters["sequence_id"].int64_param = seq
    return req


@pytest.mark.parametrize("req, limit", [
    (message(n_in=4), "max_tensors"),
    (message(n_out=4), "max_tensors"),
    (message(shape=(1,) * 5), "max_dims"),
    (message(shape=(1 << 40, 1 << 40)), "max_elements"),
    (message(shape=(1001,)), "max_elements"),
    (message(name="TOOLONGNAME"), "max_name_length"),
    (message(rid="r" * 11), "max_id_length"),
    (message(seq="s" * 11), "max_id_length"),
])
def test_each_limit_both_paths(req, limit):
    data = req.SerializeToString()
    with pytest.raises(LimitExceeded, match=f"limits.{limit}"):
        scan_checked(data, SMALL)
    if limit != "max_id_length" or req.id:  # check_pb does not read string sequence ids
        with pytest.raises(LimitExceeded, match=f"limits.{limit}"):
            check_pb(data, SMALL)


def test_within_limits_and_routing_fields():
    req = message(n_in=3, shape=(10, 10, 10), n_out=3, rid="r" * 10, seq=-5)
    data = req.SerializeToString()
    assert scan_checked(data, SMALL) == scan_infer_routing(data) == ("m", "1", "-5")
    check_pb(data, SMALL)
    assert scan_checked(message(seq=0).SerializeToString(), SMALL)[2] is None
    assert scan_checked(message(seq="abc").SerializeToString(), SMALL)[2] == "abc"


def test_large_messages_are_walked():
    req = message(n_in=1, shape=(1 << 40, 1 << 40))
    req.raw_input_contents.append(b"\0" * (128 * 1024))
    with pytest.raises(LimitExceeded, match="max_elements"):
        scan_checked(req.SerializeToString(), SMALL)


def test_malformed_falls_back_to_the_walk():
    with pytest.raises(InvalidRequest):
        scan_checked(b"\x0a\xff", SMALL)  # a length past the end: the walk's own error
    # Invalid UTF-8 in a tensor name or an id: refused, naming the cause.
    for bad in (b"\x0a\x01m" + b"\x2a\x04\x0a\x02\xff\xfe", b"\x0a\x01m" + b"\x1a\x02\xff\xfe"):
        with pytest.raises(InvalidRequest, match="not valid UTF-8"):
            scan_checked(bad, SMALL)
    with pytest.raises(InvalidRequest, match="model name or version is not valid UTF-8"):
        scan_checked(b"\x0a\x02\xff\xfe", SMALL)


fields = st.fixed_dictionaries({
    "n_in": st.integers(0, 5), "shape": st.lists(st.integers(-3, 1 << 33), max_size=6).map(tuple),
    "name": st.text("AB", max_size=12), "rid": st.text("x", max_size=14), "n_out": st.integers(0, 5),
    "seq": st.none() | st.integers(-(1 << 63), (1 << 63) - 1),
})


@settings(max_examples=300, deadline=None)
@given(fields)
def test_parsed_path_agrees_with_the_walk(kw):
    data = message(**kw).SerializeToString()

    def outcome(fn):
        try:
            return "ok", fn()
        except (LimitExceeded, NegativeDimension):
            return "refused", None  # which refusal may differ: the walk checks as it goes

    def walk():
        routing = scan_infer_routing(data)
        check_pb(data, SMALL)
        return routing

    assert outcome(lambda: scan_checked(data, SMALL)) == outcome(walk)


def test_check_json():
    ok = {"id": "r", "inputs": [{"name": "IN", "shape": [2, 3], "datatype": "FP32", "data": [1] * 6}]}
    check_json(orjson.dumps(ok), SMALL)
    for doc, limit in [
        ({"inputs": [{"name": "I", "shape": [1]}] * 4}, "max_tensors"),
        ({"outputs": [{"name": "O"}] * 4}, "max_tensors"),
        ({"inputs": [{"name": "I", "shape": [1] * 5}]}, "max_dims"),
        ({"inputs": [{"name": "I", "shape": ["a"] * 5}]}, "max_dims"),
        ({"inputs": [{"name": "I", "shape": [1 << 62, 1 << 62]}]}, "max_elements"),
        ({"inputs": [{"name": "I" * 9, "shape": [1]}]}, "max_name_length"),
        ({"id": "i" * 11}, "max_id_length"),
        ({"parameters": {"sequence_id": "s" * 11}}, "max_id_length"),
    ]:
        with pytest.raises(LimitExceeded, match=f"limits.{limit}"):
            check_json(orjson.dumps(doc), SMALL)
    check_json(b"not json", SMALL)  # left to the path that reads it
    with pytest.raises(InvalidRequest, match="not valid UTF-8"):
        check_json(b'{"id": "\xff"}', SMALL)
    check_json(b"[1, 2]", SMALL)
    # Over 64 KiB the skeleton is checked (codec/jsonscan.py): padding takes no request past a limit.
    with pytest.raises(LimitExceeded, match="limits.max_dims"):
        check_json(orjson.dumps({"inputs": [{"name": "I", "shape": [1] * 5}], "pad": "x" * 70000}), SMALL)
    with pytest.raises(LimitExceeded, match="limits.max_tensors"):
        check_json(orjson.dumps({"inputs": [{"name": "I", "shape": [1], "datatype": "FP32", "data": [1.0] * 20000}]
                                 * 4}), SMALL)
    check_json(orjson.dumps({"inputs": [{"name": "I", "shape": [1000], "datatype": "FP32", "data": [1.5] * 1000}]
                             * 3, "id": " " * 10}) + b" " * 70000, SMALL)


# JSON values of every kind, the members the check reads among them, of the right type or not.
_scalar = st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.floats(allow_nan=False) | \
    st.text("aé\"\\", max_size=12)
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text("ab", max_size=3),
                                                                                           inner, max_size=3),
                      max_leaves=8)
_tensor = st.dictionaries(st.sampled_from(["name", "shape", "data", "datatype", "parameters"]),
                          _value | st.text("IN", max_size=10)
                          | st.lists(st.sampled_from([0, -1, 1, 2, 10, 100, 1000, 1001, 1 << 33]), max_size=6),
                          max_size=5)
_request = st.dictionaries(
    st.sampled_from(["id", "parameters", "inputs", "outputs", "other"]),
    _value | st.text("r", max_size=12) | st.lists(_tensor | _value, max_size=5)
    | st.dictionaries(st.sampled_from(["sequence_id", "x"]), _value | st.text("s", max_size=12), max_size=2),
    max_size=5)
# Requests of the spec's form (the typed decode takes them), with values on both sides of SMALL.
_name = st.text("I", max_size=10)
_dims = st.lists(st.sampled_from([0, -1, 1, 2, 10, 100, 1000, 1001, 1 << 33]), max_size=6)
_typed = st.fixed_dictionaries({}, optional={
    "id": st.text("r", max_size=12) | st.integers(0, 5),
    "parameters": st.fixed_dictionaries({}, optional={"sequence_id": st.text("s", max_size=12) | st.integers(0, 9)}),
    "inputs": st.lists(st.fixed_dictionaries({"name": _name, "shape": _dims}, optional={
        "datatype": st.just("FP32"), "data": st.lists(st.floats(allow_nan=False), max_size=4)}), max_size=5),
    "outputs": st.lists(st.fixed_dictionaries({"name": _name}), max_size=5),
})


_SMALL_CHECK = JsonCheck(SMALL)


def test_the_typed_decode_takes_requests_of_the_spec_form():
    doc = {"id": "r", "parameters": {"sequence_id": 3},
           "inputs": [{"name": "I", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}], "outputs": [{"name": "O"}]}
    request = JsonCheck(SMALL)._decode(json.dumps(doc).encode())
    assert request.id == "r" and request.inputs[0].shape == [2] and request.outputs[0].name == "O"


@settings(max_examples=600, deadline=None)
@given(_typed | _request, st.booleans(), st.booleans())
def test_typed_json_check_agrees_with_the_general_one(doc, ascii_only, duplicate):
    """The typed decode (ASCII text, members of the spec's types) decides exactly as the
    general path: the same limit refused, or none."""
    data = json.dumps(doc, ensure_ascii=ascii_only).encode()
    if duplicate and len(data) > 2:
        # "inputs" given twice, the first over max_dims: both paths refuse the repeated name.
        data = b'{"inputs":[{"shape":[1,1,1,1,1,1]}],' + data[1:]

    def outcome(fn):
        try:
            fn(data)
        except (LimitExceeded, InvalidRequest) as err:
            return type(err), str(err)
        return None

    assert outcome(_SMALL_CHECK) == outcome(lambda part: limits_module._check_any(part, SMALL))


def test_typed_json_check_skips_to_the_general_path():
    # Non-ASCII text: validated as UTF-8 by the general path (the typed decoder skips data unread).
    with pytest.raises(InvalidRequest, match="not valid UTF-8"):
        check_json(b'{"inputs": [{"name": "I", "data": ["\xff"]}]}', SMALL)
    # A member of another type than the spec's: the general path skips what it cannot read.
    with pytest.raises(LimitExceeded, match="max_dims"):
        check_json(b'{"inputs": [1, {"name": "I", "shape": [1, 1, 1, 1, 1]}]}', SMALL)
    # A dimension past 64 bits: over the typed decoder's bound, and a number orjson cannot read:
    # malformed to the general path, left to the backend (as before the typed path existed).
    check_json(b'{"inputs": [{"name": "I", "shape": [123456789012345678901234567890]}]}', SMALL)
    # Past a limit: the general path names it.
    with pytest.raises(LimitExceeded, match="max_elements"):
        check_json(b'{"inputs": [{"name": "I", "shape": [1001]}]}', SMALL)
    with pytest.raises(LimitExceeded, match="max_elements"):
        check_json(b'{"inputs": [{"name": "I", "shape": [40, 30]}]}', SMALL)
    # A 0 does not exempt the other dimensions (limits._NONZERO), wherever it stands.
    for shape in (b"[100, 100, 0]", b"[0, 100, 100]", b"[0, 9223372036854775807]"):
        with pytest.raises(LimitExceeded, match=r"dimensions other than 0\) of more than 1000 elements"):
            check_json(b'{"inputs": [{"name": "I", "shape": ' + shape + b'}]}', SMALL)
    check_json(b'{"inputs": [{"name": "I", "shape": [0, 10, 100]}]}', SMALL)
    # A negative dimension is not a size, wherever it stands (even past a 0).
    for shape in (b"[0, -1, 10000]", b"[-1]", b"[2, 3, -4]"):
        with pytest.raises(NegativeDimension, match="has a negative dimension"):
            check_json(b'{"inputs": [{"name": "I", "shape": ' + shape + b'}]}', SMALL)
    # A bytearray and a memoryview are checked as bytes are.
    for part in (bytearray(b'{"id": "i' + b"i" * 10 + b'"}'), memoryview(b'{"id": "i' + b"i" * 10 + b'"}')):
        with pytest.raises(LimitExceeded, match="max_id_length"):
            check_json(part, SMALL)


def test_names():
    check_names("m" * 8, "1", SMALL)
    with pytest.raises(LimitExceeded, match="model name"):
        check_names("m" * 9, "", SMALL)
    with pytest.raises(LimitExceeded, match="model version"):
        check_names("m", "9" * 9, SMALL)
