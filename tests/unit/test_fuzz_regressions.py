"""Regressions for what coverage-guided fuzzing found (docs/fuzzing.md, "Found and fixed").

Each test is named after its bug; the input that found it is kept in fuzz/corpus/<target>/
as crash-<name> (replayed by tests/unit/test_fuzz_targets.py).
"""
from __future__ import annotations

import struct
import zlib

import orjson
import pytest

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec import content, convert
from gateway.codec import grpc as grpc_codec
from gateway.codec import httpdecode, httpencode
from gateway.codec.datatypes import to_numpy
from gateway.codec.wire import encode_len_field, scan_infer_routing
from gateway.config.loader import read_config
from gateway.errors import BadUpstreamResponse, ConfigError, InvalidRequest
from gateway.model import InferResponse, Tensor


# ------------------------------------------------------------------ config loader
@pytest.mark.parametrize("text", [
    "workers: 2024-13-01\n",  # YAML resolves it as a timestamp; datetime refuses month 13
    "workers: !!float not-a-number\n",
    "workers: !!int 0x\n",
    "!!float \n",  # IndexError
    "workers: !!bool maybe\n",  # KeyError
    "workers: !!timestamp x\n",  # AttributeError
    "routes: " + "[" * 1200 + "]" * 1200 + "\n",  # PyYAML's composer recurses per level
])
def test_yaml_constructor_errors_and_deep_nesting_are_config_errors(tmp_path, text):
    """read_config let PyYAML's own exceptions (ValueError, IndexError, KeyError, AttributeError,
    RecursionError) escape: `oip-gateway check` printed a traceback, and a SIGHUP / --watch
    reload failed without the one log line and metric."""
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_config(path)
    assert info.value.problems and "not valid YAML" in info.value.problems[0]
    assert info.value.digest is not None  # a watched file refused once is not re-read as new


@pytest.mark.parametrize("text", [
    "~: 1\nx: 2\nbackends: {}\n",  # unknown keys null and a string: sorted() compared them
    "3: x\ny: 1\nlisten: {http: 0.0.0.0:1}\n",  # an int and a string
    "backends: {b: {protocol: http, endpoints: [a:1], ~: 1, 2: 3}}\n",
    "routes: [{model: m, backend: b, ~: 1, z: 2}]\n",
])
def test_config_keys_of_other_types_than_string_are_unknown_keys(tmp_path, text):
    """YAML mapping keys of mixed types (null, int, str) made check_keys' sorted() raise
    TypeError instead of naming the unknown key."""
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_config(path)
    assert any("unknown key" in p for p in info.value.problems)


# ------------------------------------------------------------------ gRPC codec / wire
def _request(**fields) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", **fields)
    return msg


def test_uses_typed_contents_ignores_field_5_of_another_wire_type():
    """A varint field 5 is an unknown field to protobuf, not an input: no typed answer for it."""
    message = _request().SerializeToString() + b"\x28\x01"  # field 5, wire type 0
    assert pb.ModelInferRequest.FromString(message).inputs == []
    assert grpc_codec.uses_typed_contents(message) is False


def test_grpc_duplicate_input_is_refused_like_http():
    """The gRPC decoder took two inputs of one name, and gRPC → HTTP conversion then wrote a
    body the HTTP decoder (and Triton) refuse; now refused up front, in Triton's words."""
    msg = _request()
    for _ in range(2):
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        msg.raw_input_contents.append(struct.pack("<f", 1.0))
    with pytest.raises(InvalidRequest, match="^input 'INPUT0' already exists in request$"):
        grpc_codec.decode_request(msg.SerializeToString())


def _sequence_entry(param: bytes) -> bytes:
    key = b"\x0a\x0bsequence_id"
    entry = key + encode_len_field(2, len(param)) + param
    return encode_len_field(4, len(entry)) + entry


def test_sequence_id_varint_past_64_bits_is_truncated_like_protobuf():
    """A 10-byte varint's bits past 63 are dropped by protobuf (and Triton); the scanner kept
    them, so one sequence's affinity key depended on how its id was encoded."""
    overlong = b"\x28" + b"\xff" * 9 + b"\x7f"  # uint64_param with bits set past bit 63
    message = _request().SerializeToString() + _sequence_entry(overlong)
    parsed = pb.ModelInferRequest.FromString(message).parameters["sequence_id"].uint64_param
    assert scan_infer_routing(message) == ("m", "", str(parsed)) == ("m", "", str(2**64 - 1))


def test_sequence_id_last_oneof_field_wins():
    """InferParameter is a oneof: a bool_param after uint64_param replaces it (no sequence)."""
    message = _request().SerializeToString() + _sequence_entry(b"\x28\x07" + b"\x08\x01")
    assert pb.ModelInferRequest.FromString(message).parameters["sequence_id"].WhichOneof(
        "parameter_choice") == "bool_param"
    assert scan_infer_routing(message)[2] is None


def test_sequence_id_last_map_entry_wins_even_when_zero():
    """Of two sequence_id entries protobuf keeps the last; the scanner kept the last non-zero one."""
    message = _request().SerializeToString() + _sequence_entry(b"\x10\x07") + _sequence_entry(b"\x10\x00")
    assert pb.ModelInferRequest.FromString(message).parameters["sequence_id"].int64_param == 0
    assert scan_infer_routing(message)[2] is None


def test_sequence_id_value_given_twice_in_an_entry_is_merged():
    """A map entry's value field given twice is merged by protobuf (the later one set nothing)."""
    key = b"\x0a\x0bsequence_id"
    entry = key + b"\x12\x02\x10\x07" + b"\x12\x00"
    message = _request().SerializeToString() + encode_len_field(4, len(entry)) + entry
    assert pb.ModelInferRequest.FromString(message).parameters["sequence_id"].int64_param == 7
    assert scan_infer_routing(message)[2] == "7"


def test_empty_tensor_whose_other_dims_overflow_numpy_encodes():
    """[2**62, 4, 0] holds no element and decodes, but numpy cannot shape it: encoding the
    answer (typed gRPC, JSON) raised InvalidRequest for a valid backend response."""
    out = Tensor("OUTPUT0", "INT8", (2**62, 4, 0), memoryview(b""))
    resp = InferResponse("m", outputs=(out,))
    assert to_numpy(out, flat=True).size == 0
    typed = grpc_codec.decode_response(grpc_codec.encode_response(resp, typed=True))
    assert typed.outputs[0].shape == (2**62, 4, 0)
    chunks, _ = httpencode.encode_response(resp)
    assert orjson.loads(b"".join(chunks))["outputs"][0]["data"] == []


def test_grpc_to_http_refuses_non_boolean_binary_data_parameters():
    """A gRPC client's binary_data / binary_data_output of another type than bool went into the
    HTTP body, which Triton refuses: refused by name at the gateway (never dropped or changed)."""
    def request(output_param: bool, request_param: bool) -> bytes:
        msg = _request()
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        msg.raw_input_contents.append(struct.pack("<f", 1.0))
        out = msg.outputs.add(name="OUTPUT0")
        if output_param:
            out.parameters["binary_data"].uint64_param = 1
        if request_param:
            msg.parameters["binary_data_output"].string_param = "yes"
        return msg.SerializeToString()

    for binary in (True, False):
        with pytest.raises(InvalidRequest, match="output 'OUTPUT0' parameter 'binary_data' must be a boolean"):
            convert.grpc_request_to_http(request(True, False), binary=binary)
        with pytest.raises(InvalidRequest, match="request parameter 'binary_data_output' must be a boolean"):
            convert.grpc_request_to_http(request(False, True), binary=binary)
        chunks, headers, _ = convert.grpc_request_to_http(request(False, False), binary=binary)
        hl = headers.get("inference-header-content-length")
        req = httpdecode.decode_request(b"".join(chunks), None if hl is None else int(hl), "m")
        assert req.outputs[0].parameters == ({"binary_data": True} if binary else {})


# ------------------------------------------------------------------ HTTP JSON
@pytest.mark.parametrize("where", ["name", "data"])
def test_nan_body_with_lone_surrogate_escape_is_invalid_request(where):
    """A body with NaN is read by the standard library (orjson refuses NaN), which also takes
    a lone surrogate escape orjson refuses: "\\ud800" then reached protobuf / str.encode as a
    UnicodeEncodeError (a 500), on the request and on the backend-answer path."""
    name, data = ("x\\ud800", '"a"') if where == "name" else ("x", '"\\ud800"')
    body = ('{"inputs": [{"name": "' + name + '", "shape": [1], "datatype": "BYTES", "data": [' + data + ']},'
            ' {"name": "f", "shape": [1], "datatype": "FP32", "data": [NaN]}]}').encode()
    with pytest.raises(InvalidRequest, match="malformed JSON"):
        convert.http_request_to_grpc(body, {}, "m", "1", 1 << 20)
    answer = body.replace(b'"inputs"', b'"model_name": "m", "outputs"')
    with pytest.raises(BadUpstreamResponse, match="malformed JSON"):
        convert.http_answer_to_grpc(answer, {}, 1 << 20, "b")


def test_nan_body_with_surrogate_pair_escape_still_decodes():
    body = b'{"inputs": [{"name": "\\ud83d\\ude00", "shape": [1], "datatype": "FP32", "data": [NaN]}]}'
    assert httpdecode.decode_request(body, None, "m").inputs[0].name == "\U0001F600"


@pytest.mark.parametrize("value", ["\u00b2", "1\u00b2", " \u00b3 "])
def test_header_length_with_non_ascii_digit_is_refused_not_500(value):
    """Header values arrive decoded as latin-1: byte 0xB2 is '²', for which str.isdigit() is True
    and int() raises ValueError — an Inference-Header-Content-Length of it was a 500 (and a
    logged traceback) instead of a 400, and the pass-through affinity raised on it too."""
    from gateway.frontend.inferchecks import header_length, json_part

    body = b'{"inputs": []}'
    with pytest.raises(InvalidRequest, match="Inference-Header-Content-Length"):
        header_length(value, len(body))
    assert json_part(body, value) == body
    assert content.sequence_of_json(b'{"parameters": {"sequence_id": 1}}', value) == "1"
    assert content.sequence_of_compressed(zlib.compress(b'{"parameters": {"sequence_id": 1}}'), value, 1024) == "1"


def test_unicode_digits_are_not_counts():
    """'²'.isdigit() is True but int('²') raises: every count read from the network takes
    ASCII digits only (here: the v1 path version)."""
    from gateway.errors import InvalidRequest
    from gateway.frontend.v1_bridge import path_version

    assert path_version("3") == "3"
    for text in ("²", "-²", "1²"):
        with pytest.raises(InvalidRequest):
            path_version(text)


@pytest.mark.parametrize("value, token", [(float("inf"), b"Infinity"), (float("-inf"), b"-Infinity")])
def test_non_finite_parameters_keep_their_value_when_written_as_json(value, token):
    """A request parameter of +-Infinity (a JSON body with the token, or a gRPC client's
    double_param) was written by the HTTP encoder as null (orjson's rendering), which the
    reader then refused: a value changed on the way. Found by the structured HTTP body
    target: {"parameters": {"sequence_id": Infinity}}."""
    req = httpdecode.decode_request(b'{"inputs": [], "parameters": {"sequence_id": ' + token + b'}}', None, "m", "1")
    assert req.parameters["sequence_id"] == value
    for binary in (True, False):
        chunks, hl = httpencode.encode_request(req, binary=binary)
        text = b"".join(chunks)
        assert b'"sequence_id":' + token in text
        assert httpdecode.decode_request(text, hl, "m", "1").parameters["sequence_id"] == value
    # gRPC -> HTTP: a double_param of the same value.
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["p"].double_param = value
    chunks, _headers, _typed = convert.grpc_request_to_http(msg.SerializeToString(), binary=False)
    assert b'"p":' + token in b"".join(chunks)
    # NaN too (a gRPC double_param may be NaN).
    msg.parameters["p"].double_param = float("nan")
    chunks, _headers, _typed = convert.grpc_request_to_http(msg.SerializeToString(), binary=False)
    assert b'"p":NaN' in b"".join(chunks)


# ------------------------------------------------------------------ JSON data read in place
def test_a_data_array_nobody_reads_is_still_held_to_json():
    """The fast reading (codec/jsonfast.py) parses the skeleton and reads each tensor's data in
    place: a "data" array the decoder never reads (here "inputs" in a response) was not checked
    at all, so a byte that is not UTF-8 in it passed where the plain reading refuses the body."""
    body = (b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES", "data": ["hello",\xa0"w"]}],'
            b' "parameters": {"sequence_id": 42}}')
    with pytest.raises(InvalidRequest, match="malformed JSON inference response"):
        httpdecode.decode_response(body, None)
