"""Repeated member names in inference JSON (codec/jsondup.py): refused wherever the gateway
reads or checks a request — the limits check (its typed path and its general one), the
codec — and never a request without one, colons in its strings or not."""
from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec.httpdecode import decode_request, decode_response
from gateway.codec.jsondup import check_unique, colons, members
from gateway.codec.limits import JsonCheck
from gateway.config.security import Limits
from gateway.errors import InvalidRequest, LimitExceeded


class Obj(list[tuple[str, Any]]):
    """A JSON object as written: its pairs in order, repeats kept."""


def render(value: Any, gap: str = "") -> str:
    if isinstance(value, Obj):
        return "{" + ",".join(f"{render(k)}{gap}:{gap}{render(v, gap)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v, gap) for v in value) + "]"
    return json.dumps(value)


def repeats(value: Any) -> bool:
    if isinstance(value, Obj):
        names = [k for k, _ in value]
        return len(set(names)) != len(names) or any(repeats(v) for _, v in value)
    if isinstance(value, list):
        return any(repeats(v) for v in value)
    return False


def request() -> Obj:
    """A request of the spec's form with every member the spec gives each object."""
    return Obj([
        ("id", "req:1"),  # (a colon in a string: the colons outnumber the members)
        ("parameters", Obj([("sequence_id", 7), ("priority", 1)])),
        ("inputs", [
            Obj([("name", "A"), ("shape", [1, 2]), ("datatype", "FP32"), ("parameters", Obj([("p", "x")])),
                 ("data", [1.5, 2.5])]),
            Obj([("name", "B"), ("shape", [2]), ("datatype", "BYTES"),
                 ("parameters", Obj([("binary_data_size", 10)]))]),
        ]),
        ("outputs", [Obj([("name", "O"), ("parameters", Obj([("binary_data", True)]))]), Obj([("name", "P")])]),
    ])


def objects(value: Any) -> list[Obj]:
    out = []
    if isinstance(value, Obj):
        out.append(value)
        for _, v in value:
            out += objects(v)
    elif isinstance(value, list):
        for v in value:
            out += objects(v)
    return out


def without_colon_in_id() -> Obj:
    doc = request()
    doc[0] = ("id", "req-1")
    return doc


CHECK = JsonCheck(Limits())


def test_a_spec_form_request_is_proven_by_the_typed_path():
    text = render(without_colon_in_id()).encode()
    assert CHECK._proven(text)  # every member counted: colons == members
    CHECK(render(request()).encode())  # a colon in the id: not proven by counting, passed by the strict read


def _each_repeat() -> list[tuple[str, int, int]]:
    return [(f"object {i} member {k} ({name})", i, k)
            for i, obj in enumerate(objects(request())) for k, (name, _) in enumerate(obj)]


@pytest.mark.parametrize(("label", "index", "member"), _each_repeat(), ids=[c[0] for c in _each_repeat()])
def test_each_member_of_each_object_repeated_is_refused(label, index, member):
    for base in (request(), without_colon_in_id()):
        obj = objects(base)[index]
        name, value = obj[member]
        obj.insert(0, (name, value))  # the same name first, as a hostile client would put it
        text = render(base).encode()
        assert not CHECK._proven(text)
        with pytest.raises(InvalidRequest, match=f"repeats the member name {name!r}"):
            CHECK(text)
        with pytest.raises(InvalidRequest, match=f"repeats the member name {name!r}"):
            decode_request(text, None, "m")


def test_written_differently_is_still_the_same_name():
    # "\u0069nputs" is "inputs" (RFC 8259 section 7): a repeat, though the bytes differ.
    text = b'{"inputs":[{"name":"A","shape":[1],"datatype":"FP32","data":[1]}],' \
           b'"\\u0069nputs":[{"name":"A","shape":[1],"datatype":"FP32","data":[2]}]}'
    with pytest.raises(InvalidRequest, match="'inputs'"):
        CHECK(text)


def test_the_codec_refuses_a_repeat_in_a_binary_extension_header_and_a_response():
    header = b'{"inputs":[{"name":"A","shape":[1],"datatype":"INT8","parameters":{"binary_data_size":1},' \
             b'"parameters":{"binary_data_size":1}}]}'
    with pytest.raises(InvalidRequest, match="'parameters'"):
        decode_request(header + b"\x05", len(header), "m")
    answer = b'{"model_name":"m","model_name":"n","outputs":[]}'
    with pytest.raises(InvalidRequest, match="inference response JSON repeats the member name 'model_name'"):
        decode_response(answer, None)


def test_colons_counts_every_form_of_text():
    text = b'{"a": "x:y"}' * 1000  # past the size where numpy counts
    assert colons(text) == colons(bytearray(text)) == colons(memoryview(text)) == 2000
    assert colons(b'{"a":1}') == colons(memoryview(b'{"a":1}')) == 1


# Arbitrary JSON: objects with names from a small set (so repeats happen), strings with colons,
# objects nested anywhere (where the spec has none too), names written escaped or not.
_names = st.sampled_from(["inputs", "outputs", "parameters", "name", "shape", "data", "id", "a:b", "x"])
_scalar = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", ":", "a:b", '"', "\\:"])


def _obj(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    return st.lists(st.tuples(_names, inner), max_size=5).map(Obj)


_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4) | _obj(inner), max_leaves=14)


@settings(max_examples=800, deadline=None)
@given(_obj(_value), st.sampled_from(["", " ", "\n\t"]), st.booleans())
def test_refused_exactly_when_some_object_repeats_a_name(doc, gap, escaped):
    text = render(doc, gap)
    if escaped:  # the same names, written with a \u escape
        text = text.replace('"inputs"', '"\\u0069nputs"').replace('"x"', '"\\u0078"')
    data = text.encode()
    parsed = orjson.loads(data)
    refused = False
    try:
        check_unique(data, members(parsed), "request")
    except InvalidRequest:
        refused = True
    assert refused == repeats(doc), text
    try:
        CHECK(data)
    except LimitExceeded:  # (a shape of many elements): only when nothing repeats — a repeat is named first
        assert not repeats(doc), text
    except InvalidRequest as err:
        if "negative dimension" in str(err):  # (an input's shape with a negative number: refused as well)
            assert '"shape"' in text, (text, err)
        else:
            assert repeats(doc) and "repeats the member name" in str(err), (text, err)
    else:
        assert not repeats(doc), text


def test_triton_extension_bodies_refuse_a_repeat_as_the_side_that_sent_it():
    from gateway.codec.tritoncontrol import control_from_json, log_to_pb, trace_to_pb
    from gateway.errors import BadUpstreamResponse

    trace = b'{"trace_level":["TIMESTAMPS"],"trace_level":["OFF"]}'
    with pytest.raises(InvalidRequest, match="trace settings JSON repeats the member name 'trace_level'"):
        trace_to_pb(trace, "m", answer=False)
    with pytest.raises(BadUpstreamResponse, match="'trace_level'"):  # a backend's answer: its fault
        trace_to_pb(trace, "m", answer=True)
    with pytest.raises(InvalidRequest, match="'log_info'"):
        log_to_pb(b'{"log_info":true,"log_info":false}', answer=False)
    with pytest.raises(InvalidRequest, match="'config'"):
        control_from_json(b'{"parameters":{"config":"{}","config":"{\\"max_batch_size\\":8}"}}', "m", False)
    trace_to_pb(b'{"trace_file":"/tmp/a:b","trace_level":["OFF"]}', "m", answer=False)  # a colon is no repeat
