"""The first-generation API's translation (gateway/codec/v1.py), without I/O: header text,
batch rules, byte sizes, sequence flags, the V2 request, the v1 answer, top-K classes,
status and the RequestStatus of every error kind."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway._pb import legacy_v1_pb2 as v1
from gateway._pb import model_config_pb2 as mc
from gateway._pb import triton_extensions_pb2 as tx
from gateway.codec.grpc import decode_request
from gateway.codec.v1answer import finish, request_status, server_status, status_text
from gateway.codec.v1model import ModelInfo, TensorInfo, model_info
from gateway.codec.v1request import build_request, parse_header_text, plan_inputs, split_body, v1_version
from gateway.errors import (
    BadUpstreamResponse,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    PayloadTooLarge,
    Unsupported,
    UpstreamError,
    UpstreamTimeout,
)

BATCHING = ModelInfo("m", "python", 8, {"IN": TensorInfo("IN", "FP32", (4,)), "S": TensorInfo("S", "BYTES", (-1,))},
                     {"OUT": TensorInfo("OUT", "FP32", (4,), "labels.txt"), "I64": TensorInfo("I64", "INT64", (2,)),
                      "B": TensorInfo("B", "BF16", (4,))})
FLAT = ModelInfo("f", "python", 0, {"IN": TensorInfo("IN", "FP32", (-1,))}, {"OUT": TensorInfo("OUT", "FP32", (-1,))})


def header(text: str) -> v1.InferRequestHeader:
    return parse_header_text(text)[0]


def answer(outputs: list[tuple[str, str, list[int], bytes]], version: str = "1") -> bytes:
    msg = pb.ModelInferResponse(model_name="m", model_version=version)
    for name, dt, shape, data in outputs:
        msg.outputs.add(name=name, datatype=dt, shape=shape)
        msg.raw_output_contents.append(data)
    return msg.SerializeToString()


def test_the_spec_example_header_parses() -> None:
    """The API text's own example: ``byte_size`` (one batch entry, the earliest header) and an
    output ``byte_size`` hint are read; the input's becomes batch_byte_size × batch."""
    text = ('batch_size: 1 input { name: "input" byte_size: 602112 } '
            'output { name: "output" byte_size: 4000 cls { count: 3 } }')
    h, legacy = parse_header_text(text)
    assert h.batch_size == 1 and h.input[0].name == "input" and h.output[0].cls.count == 3
    assert legacy == {0: 602112}
    info = ModelInfo("r", "", 1, {"input": TensorInfo("input", "FP32", (3, 224, 224))}, {})
    assert plan_inputs(h, info, legacy)[1][0].nbytes == 602112


def test_legacy_size_inside_a_string_is_left_alone() -> None:
    h, legacy = parse_header_text('batch_size: 1 input { name: "byte_size" byte_size: 16 }')
    assert h.input[0].name == "byte_size" and legacy == {0: 16}


@pytest.mark.parametrize("text", ["batch_size: x", "input { name: ", "nonsense: 1", "input { byte_size: }"])
def test_malformed_header_is_invalid(text: str) -> None:
    with pytest.raises(InvalidRequest, match="malformed NV-InferRequest header"):
        parse_header_text(text)


def test_batching_model_prepends_batch() -> None:
    batching, plans = plan_inputs(header('batch_size: 2 input { name: "IN" }'), BATCHING)
    assert batching and plans[0].shape == (2, 4) and plans[0].nbytes == 32


def test_non_batching_model_takes_dims_whole_and_batch_one() -> None:
    batching, plans = plan_inputs(header('batch_size: 1 input { name: "IN" dims: [3] }'), FLAT)
    assert not batching and plans[0].shape == (3,)
    with pytest.raises(InvalidRequest, match="does not support batching"):
        plan_inputs(header('batch_size: 2 input { name: "IN" dims: [3] }'), FLAT)


@pytest.mark.parametrize("text, match", [
    ('input { name: "IN" }', "batch_size must be >= 1"),
    ('batch_size: 9 input { name: "IN" }', "exceeds the maximum batch size 8"),
    ('batch_size: 1 input { name: "NOPE" }', "unexpected inference input 'NOPE'"),
    ('batch_size: 1 input { name: "IN" dims: [5] }', "do not match the model's"),
    ('batch_size: 1 input { name: "IN" batch_byte_size: 12 }', "batch_byte_size 12 but shape"),
    ('batch_size: 1 input { name: "S" dims: [2] }', "batch_byte_size is required"),
    ('batch_size: 1 input { name: "IN" } input { name: "IN" }', "listed twice"),
])
def test_request_header_refusals(text: str, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        plan_inputs(header(text), BATCHING)


def test_wildcard_dims_need_dims() -> None:
    with pytest.raises(InvalidRequest, match="dims are required"):
        plan_inputs(header('batch_size: 1 input { name: "IN" }'), FLAT)


def test_shared_memory_is_refused_by_name() -> None:
    with pytest.raises(Unsupported, match="input 'IN'"):
        plan_inputs(header('batch_size: 1 input { name: "IN" shared_memory { name: "r" byte_size: 16 } }'), BATCHING)


def test_body_split_in_header_order_and_checked() -> None:
    _, plans = plan_inputs(header('batch_size: 1 input { name: "IN" } input { name: "S" dims: [1] '
                                  'batch_byte_size: 7 }'), BATCHING)
    body = np.arange(4, dtype="<f4").tobytes() + b"\x03\x00\x00\x00abc"
    a, b = split_body(body, plans)
    assert bytes(a) == body[:16] and bytes(b) == body[16:]
    with pytest.raises(InvalidRequest, match="shorter than the inputs the header declares: 22 bytes, expected 23"):
        split_body(body[:-1], plans)
    with pytest.raises(InvalidRequest, match="longer"):
        split_body(body + b"x", plans)


def test_v2_request_carries_sequence_priority_timeout_and_id() -> None:
    h = header('batch_size: 2 id: 77 correlation_id: 12345678901234567890 flags: 3 priority: 2 '
               'timeout_microseconds: 5000 input { name: "IN" } output { name: "OUT" cls { count: 2 } } '
               'output { name: "I64" }')
    batching, plans = plan_inputs(h, BATCHING)
    data = np.arange(8, dtype="<f4").tobytes()
    message, plan, affinity = build_request("m", "3", h, BATCHING, batching, plans, [memoryview(data)])
    req = decode_request(message)
    assert req.model_name == "m" and req.model_version == "3" and req.id == "77"
    assert req.parameters == {"sequence_id": 12345678901234567890, "sequence_start": True, "sequence_end": True,
                              "priority": 2, "timeout": 5000}
    assert [(t.name, t.datatype, t.shape, bytes(t.data)) for t in req.inputs] == [("IN", "FP32", (2, 4), data)]
    assert [o.name for o in req.outputs] == ["OUT", "I64"]
    assert affinity == "12345678901234567890"
    assert plan.outputs == (("OUT", 2), ("I64", 0)) and plan.batch_size == 2 and plan.request_id == 77


@pytest.mark.parametrize("text, error, match", [
    ('batch_size: 1 flags: 4 input { name: "IN" }', InvalidRequest, "flags 4"),
    ('batch_size: 1 input { name: "IN" } output { name: "X" }', InvalidRequest, "unexpected inference output 'X'"),
    ('batch_size: 1 input { name: "IN" } output { name: "OUT" } output { name: "OUT" }', InvalidRequest, "twice"),
    ('batch_size: 1 input { name: "IN" } output { name: "OUT" cls { } }', InvalidRequest, "cls.count"),
    ('batch_size: 1 input { name: "IN" } output { name: "OUT" shared_memory { name: "r" } }', Unsupported,
     "output 'OUT'"),
])
def test_build_request_refusals(text: str, error: type, match: str) -> None:
    h = header(text)
    batching, plans = plan_inputs(h, BATCHING)
    with pytest.raises(error, match=match):
        build_request("m", "", h, BATCHING, batching, plans, [memoryview(bytes(16))])


def test_raw_outputs_in_header_order_dims_without_batch() -> None:
    h = header('batch_size: 2 id: 5 input { name: "IN" } output { name: "I64" } output { name: "OUT" }')
    batching, plans = plan_inputs(h, BATCHING)
    _, plan, _ = build_request("m", "", h, BATCHING, batching, plans, [memoryview(bytes(32))])
    out = np.arange(8, dtype="<f4").tobytes()
    i64 = np.array([1, 2, 3, 4], dtype="<i8").tobytes()
    resp, raws = finish(answer([("OUT", "FP32", [2, 4], out), ("I64", "INT64", [2, 2], i64)], "2"), plan, BATCHING)
    assert resp.model_name == "m" and resp.model_version == 2 and resp.batch_size == 2 and resp.id == 5
    assert [(o.name, o.data_type, list(o.raw.dims), o.raw.batch_byte_size) for o in resp.output] == \
        [("I64", v1.TYPE_INT64, [2], 32), ("OUT", v1.TYPE_FP32, [4], 32)]
    assert [bytes(r) for r in raws] == [i64, out]


def test_top_k_classes_per_batch_entry_with_labels() -> None:
    h = header('batch_size: 2 input { name: "IN" } output { name: "OUT" cls { count: 3 } }')
    batching, plans = plan_inputs(h, BATCHING)
    _, plan, _ = build_request("m", "", h, BATCHING, batching, plans, [memoryview(bytes(32))])
    values = np.array([[0.1, 0.7, 0.1, 0.1], [0.4, 0.2, 0.4, 1e-8]], dtype="<f4")
    resp, raws = finish(answer([("OUT", "FP32", [2, 4], values.tobytes())]), plan, BATCHING,
                        {"OUT": ["cat", "dog", "bird"]})
    assert raws == []
    got = [[(c.idx, c.value, c.label) for c in entry.cls] for entry in resp.output[0].batch_classes]
    f = np.float32
    assert got == [[(1, f(0.7), "dog"), (0, f(0.1), "cat"), (2, f(0.1), "bird")],
                   [(0, f(0.4), "cat"), (2, f(0.4), "bird"), (1, f(0.2), "dog")]]
    # Values are exact: a binary header carries the float32 bits unchanged.
    again = v1.InferResponseHeader.FromString(resp.SerializeToString())
    assert again.output[0].batch_classes[1].cls[2].value == f(0.2)
    # Text format prints the shortest repr that reads back to the same float.
    assert text_format.Parse(status_text(resp), v1.InferResponseHeader()) == resp


def test_classification_never_changes_a_value() -> None:
    h = header('batch_size: 1 input { name: "IN" } output { name: "I64" cls { count: 1 } }')
    batching, plans = plan_inputs(h, BATCHING)
    _, plan, _ = build_request("m", "", h, BATCHING, batching, plans, [memoryview(bytes(16))])
    exact = np.array([[3, 2**24]], dtype="<i8").tobytes()
    resp, _ = finish(answer([("I64", "INT64", [1, 2], exact)]), plan, BATCHING)
    assert resp.output[0].batch_classes[0].cls[0].value == 2**24
    with pytest.raises(Unsupported, match="'I64'.*32-bit float"):
        finish(answer([("I64", "INT64", [1, 2], np.array([[3, 2**24 + 1]], dtype="<i8").tobytes())]), plan, BATCHING)


def test_bf16_output_and_bad_answers_are_named() -> None:
    h = header('batch_size: 1 input { name: "IN" } output { name: "B" }')
    batching, plans = plan_inputs(h, BATCHING)
    _, plan, _ = build_request("m", "", h, BATCHING, batching, plans, [memoryview(bytes(16))])
    with pytest.raises(Unsupported, match="output 'B' is BF16"):
        finish(answer([("B", "BF16", [1, 4], bytes(8))]), plan, BATCHING)
    with pytest.raises(BadUpstreamResponse, match="no output 'B'"):
        finish(answer([]), plan, BATCHING)
    with pytest.raises(BadUpstreamResponse, match="not a number"):
        finish(answer([("B", "FP32", [1, 4], bytes(16))], "latest"), plan, BATCHING)


def test_versions() -> None:
    assert v1_version(-1) == "" and v1_version(0) == "" and v1_version(3) == "3"
    with pytest.raises(InvalidRequest):
        v1_version(-2)


def test_model_info_from_triton_config_and_from_metadata() -> None:
    config = mc.ModelConfig(name="m", backend="python", max_batch_size=4)
    config.input.add(name="IN", data_type=mc.TYPE_STRING, dims=[-1])
    config.output.add(name="OUT", data_type=mc.TYPE_FP16, dims=[3], label_filename="l.txt")
    info = model_info(tx.ModelConfigResponse(config=config).SerializeToString(), None, "m")
    assert info.max_batch_size == 4 and info.platform == "python" and info.from_config
    assert info.inputs["IN"] == TensorInfo("IN", "BYTES", (-1,))
    assert info.outputs["OUT"] == TensorInfo("OUT", "FP16", (3,), "l.txt")
    meta = {"name": "m", "platform": "x", "inputs": [{"name": "IN", "datatype": "INT8", "shape": [2, -1]}],
            "outputs": []}
    info = model_info(None, meta, "m")
    assert info.max_batch_size == 0 and not info.from_config and info.inputs["IN"].dims == (2, -1)


def test_server_status() -> None:
    status = server_status("gw", "1.0", 123, True, [(BATCHING, [("1", "READY", ""), ("2", "LOADING", "slow"),
                                                                ("x", "READY", "")])])
    assert status.id == "gw" and status.version == "1.0" and status.uptime_ns == 123
    assert status.ready_state == v1.SERVER_READY
    ms = status.model_status["m"]
    assert ms.config.max_batch_size == 8 and [i.name for i in ms.config.input] == ["IN", "S"]
    assert ms.config.output[0].label_filename == "labels.txt"
    assert ms.config.output[2].data_type == v1.TYPE_INVALID  # BF16 has no v1 type: said so in the reason
    assert set(ms.version_status) == {1, 2}
    assert ms.version_status[1].ready_state == v1.MODEL_READY
    assert ms.version_status[2].ready_state == v1.MODEL_LOADING
    assert "slow" in ms.version_status[2].ready_state_reason.message
    assert "'B'" in ms.version_status[1].ready_state_reason.message
    assert v1.ServerStatus.FromString(status.SerializeToString()) == status


@pytest.mark.parametrize("err, code", [
    (InvalidRequest("x"), v1.INVALID_ARG), (PayloadTooLarge("x"), v1.INVALID_ARG),
    (ModelNotFound("x"), v1.NOT_FOUND), (Unsupported("x"), v1.UNSUPPORTED),
    (ModelNotReady("x"), v1.UNAVAILABLE), (Overloaded("x"), v1.UNAVAILABLE), (UpstreamTimeout("x"), v1.UNAVAILABLE),
    (BadUpstreamResponse("x"), v1.INTERNAL), (GatewayError("x"), v1.INTERNAL),
    (UpstreamError("x", grpc_code="NOT_FOUND"), v1.NOT_FOUND),
    (UpstreamError("x", http_status=400), v1.INVALID_ARG),
    (UpstreamError("x", grpc_code="UNIMPLEMENTED"), v1.UNSUPPORTED),
])
def test_every_error_maps_to_a_request_status(err: GatewayError, code: int) -> None:
    status = request_status(err, 9, "gw")
    assert (status.code, status.msg, status.request_id, status.server_id) == (code, "x", 9, "gw")


def test_nv_status_is_one_ascii_line() -> None:
    status = request_status(InvalidRequest("bad \"é\"\nthing"), 1, "gw")
    line = status_text(status, one_line=True)
    assert "\n" not in line and line.isascii()
    assert text_format.Parse(line, v1.RequestStatus()) == status
    assert status_text(request_status(None, 2, "gw"), one_line=True) == 'code: SUCCESS server_id: "gw" request_id: 2'


def test_config_section() -> None:
    from gateway.config.loader import parse_config
    from gateway.config.v1 import V1Api
    from gateway.errors import ConfigError

    base = {"backends": {"b": {"protocol": "http", "endpoints": ["127.0.0.1:1"]}},
            "routes": [{"model": "*", "backend": "b"}]}
    assert parse_config(base).v1 == V1Api()
    cfg = parse_config({**base, "v1": {"ready": "non_strict", "model_repositories": ["/models"]}})
    assert cfg.v1 == V1Api("non_strict", ("/models",))
    for bad, key in (({"ready": "lax"}, "v1.ready"), ({"model_repositories": "/m"}, "v1.model_repositories"),
                     ({"strict": True}, "v1.strict"), ([], "v1")):
        with pytest.raises(ConfigError) as info:
            parse_config({**base, "v1": bad})
        assert any(p.startswith(key) for p in info.value.problems), info.value.problems
