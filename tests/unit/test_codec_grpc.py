"""ModelInfer messages (gateway.codec.grpc), against tritonclient.grpc.

tritonclient.grpc registers Triton's ``grpc_service.proto`` (package ``inference``)
in protobuf's default descriptor pool, and so does ``gateway._pb``: the two
cannot be imported into one process ("duplicate symbol
'inference.ServerLiveRequest'"). tritonclient.grpc therefore runs in a child
process; serialized messages cross the boundary, which is the point anyway.
"""
from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec import grpc
from gateway.codec.datatypes import DATATYPES, from_numpy, to_numpy
from gateway.codec.wire import encode_len_field
from gateway.errors import InvalidRequest, Unsupported
from gateway.model import InferRequest, InferResponse, RequestedOutput, Tensor

from .test_codec_http import raw_of, sample

ALL = sorted(DATATYPES)

_CHILD = r"""
import pickle, sys
import ml_dtypes, numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

def param(p):
    which = p.WhichOneof("parameter_choice")
    return (which, getattr(p, which))

def build(case):
    inputs = []
    for name, arr, datatype in case["inputs"]:
        if datatype == "BF16":
            arr = arr.view(ml_dtypes.bfloat16)
        i = grpcclient.InferInput(name, list(arr.shape), datatype)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    outputs = [grpcclient.InferRequestedOutput(n, class_count=c) for n, c in case["outputs"]]
    req = _get_inference_request(case["model"], inputs, case["version"], case["id"], outputs or None,
                                 case["sequence_id"], True, False, case["priority"], case["timeout"],
                                 case["parameters"])
    return req.SerializeToString()

def read_response(message, names):
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(message))
    out = {}
    for n in names:
        a = result.as_numpy(n)
        out[n] = a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a
    return out

def read_request(message):
    r = service_pb2.ModelInferRequest.FromString(message)
    return {
        "head": (r.model_name, r.model_version, r.id),
        "parameters": {k: param(v) for k, v in r.parameters.items()},
        "inputs": [(i.name, i.datatype, list(i.shape), {k: param(v) for k, v in i.parameters.items()})
                   for i in r.inputs],
        "outputs": [(o.name, {k: param(v) for k, v in o.parameters.items()}) for o in r.outputs],
        "raw": list(r.raw_input_contents),
    }

jobs = pickle.load(sys.stdin.buffer)
out = []
for kind, *args in jobs:
    out.append({"build": build, "read_response": read_response, "read_request": read_request}[kind](*args))
pickle.dump(out, sys.stdout.buffer)
"""


def tritonclient_grpc(*jobs: tuple[Any, ...]) -> list[Any]:
    """Run jobs with tritonclient.grpc in a child process (see the module docstring)."""
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps(list(jobs)), capture_output=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return pickle.loads(proc.stdout)


def bf16_safe(arr: np.ndarray, datatype: str) -> np.ndarray:
    return arr.view(np.uint16) if datatype == "BF16" else arr


# ------------------------------------------------------------------- golden
def case(datatype: str) -> dict[str, Any]:
    return {
        "model": "m", "version": "3", "id": "r1", "sequence_id": 9, "priority": 2, "timeout": 100,
        "parameters": {"s": "v", "i": -5, "f": 0.5, "b": True},
        "inputs": [("a", bf16_safe(sample(datatype, (2, 3)), datatype), datatype),
                   ("z", bf16_safe(sample(datatype, (0, 2)), datatype), datatype)],
        "outputs": [("o", 0), ("c", 3)],
    }


@pytest.fixture(scope="module")
def golden_requests() -> dict[str, bytes]:
    return dict(zip(ALL, tritonclient_grpc(*[("build", case(d)) for d in ALL])))


@pytest.mark.parametrize("datatype", ALL)
def test_tritonclient_request_decodes(golden_requests: dict[str, bytes], datatype: str) -> None:
    message = golden_requests[datatype]
    req = grpc.decode_request(message)
    assert (req.model_name, req.model_version, req.id) == ("m", "3", "r1")
    assert req.parameters == {"sequence_id": 9, "sequence_start": True, "sequence_end": False, "priority": 2,
                              "timeout": 100, "s": "v", "i": -5, "f": 0.5, "b": True}
    assert req.outputs == (RequestedOutput("o"), RequestedOutput("c", {"classification": 3}))
    for t, (name, arr, _) in zip(req.inputs, case(datatype)["inputs"]):
        assert (t.name, t.datatype, t.shape, t.parameters) == (name, datatype, arr.shape, {})
        assert bytes(t.data) == raw_of(arr)
        assert t.data.obj is message  # a slice of the received message: no copy


def test_responses_read_by_tritonclient() -> None:
    arrays = {d: bf16_safe(sample(d, (3, 2), seed=i), d) for i, d in enumerate(ALL)}
    arrays |= {f"{d}-empty": bf16_safe(sample(d, (0, 3)), d) for d in ALL}
    tensors = tuple(from_numpy(n, a, n.split("-")[0]) for n, a in arrays.items())
    message = grpc.encode_response(InferResponse("m", "1", "x", {"p": 1}, tensors))
    (got,) = tritonclient_grpc(("read_response", message, list(arrays)))
    for name, arr in arrays.items():
        assert got[name].shape == arr.shape, name
        if arr.dtype == object:
            assert list(got[name].reshape(-1)) == list(arr.reshape(-1))
        else:
            assert got[name].dtype == arr.dtype and got[name].tobytes() == arr.tobytes(), name


def test_encoded_request_read_by_triton_proto() -> None:
    tensors = (from_numpy("a", sample("FP32"), parameters={"binary_data_size": 24, "k": 2**63}),
               from_numpy("s", sample("BYTES")))
    req = InferRequest("m", "2", "id", {"binary_data_output": True, "priority": 1, "t": "x", "d": 1.5, "b": False},
                       tensors, (RequestedOutput("o", {"binary_data": True, "classification": 2}),))
    (got,) = tritonclient_grpc(("read_request", grpc.encode_request(req)))
    assert got["head"] == ("m", "2", "id")
    assert got["parameters"] == {"priority": ("int64_param", 1), "t": ("string_param", "x"),
                                 "d": ("double_param", 1.5), "b": ("bool_param", False)}
    assert got["inputs"] == [("a", "FP32", [2, 3], {"k": ("uint64_param", 2**63)}), ("s", "BYTES", [2, 3], {})]
    assert got["outputs"] == [("o", {"classification": ("int64_param", 2)})]
    assert got["raw"] == [bytes(t.data) for t in tensors]


# --------------------------------------------------------------- round trips
def test_request_round_trip_and_single_copy() -> None:
    tensors = tuple(from_numpy(d, bf16_safe(sample(d), d), d) for d in ALL)
    req = InferRequest("m", "1", "i", {"x": -(2**63), "y": 2**64 - 1}, tensors, (RequestedOutput("o", {"a": "b"}),))
    message = grpc.encode_request(req)
    assert isinstance(message, bytes)
    back = grpc.decode_request(message)
    assert back == InferRequest(back.model_name, "1", "i", {"x": -(2**63), "y": 2**64 - 1}, back.inputs,
                                back.outputs) and back.model_name == "m"
    assert back.inputs == tensors and back.outputs == req.outputs
    assert all(t.data.obj is message for t in back.inputs)
    # memoryview input works too, and slices point into its buffer
    assert grpc.decode_request(memoryview(message)).inputs[0].data.obj is message


def test_response_round_trip() -> None:
    resp = InferResponse("m", "7", "q", {"flag": True}, (from_numpy("o", sample("INT16")),))
    message = grpc.encode_response(resp)
    assert grpc.decode_response(message) == resp
    assert grpc.decode_response(message).outputs[0].data.obj is message


@pytest.mark.parametrize("n", [4, 40_000], ids=["small", "large"])  # large: only the header goes to protobuf
def test_raw_contents_may_come_first(n: int) -> None:
    # Protobuf field order is free: raw contents before the tensor list still decode,
    # and unknown varint / fixed64 fields survive the header's re-encoding.
    data = np.arange(n, dtype="<i4").tobytes()
    head = pb.ModelInferRequest(model_name="m", id="q", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="a", datatype="INT32", shape=[n])]).SerializeToString()
    unknown = b"\xf8\x06\x96\x01" + b"\xf9\x06" + bytes(8)  # field 111 varint 150, field 111 fixed64
    message = encode_len_field(7, len(data)) + data + unknown + head
    req = grpc.decode_request(message)
    assert bytes(req.inputs[0].data) == data and req.inputs[0].data.obj is message
    assert (req.model_name, req.id, req.inputs[0].shape) == ("m", "q", (n,))


def test_large_round_trip_is_zero_copy() -> None:
    big = np.random.default_rng(1).standard_normal((256, 1024)).astype("<f4")  # 1 MiB
    req = InferRequest("m", "1", "id", {"p": 1}, (from_numpy("a", big), from_numpy("s", sample("BYTES"))),
                       (RequestedOutput("o", {"x": True}),))
    message = grpc.encode_request(req)
    back = grpc.decode_request(message)
    assert back == req and all(t.data.obj is message for t in back.inputs)
    resp = InferResponse("m", "1", "id", {}, req.inputs)
    assert grpc.decode_response(grpc.encode_response(resp)) == resp


# ---------------------------------------------------------- typed contents
TYPED = [
    ("BOOL", "bool_contents", [True, False, True]),
    ("INT8", "int_contents", [-128, 0, 127]),
    ("INT16", "int_contents", [-32768, 1, 32767]),
    ("INT32", "int_contents", [-(2**31), 1, 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 1, 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 1, 255]),
    ("UINT16", "uint_contents", [0, 1, 65535]),
    ("UINT32", "uint_contents", [0, 1, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 1, 2**64 - 1]),
    ("FP32", "fp32_contents", [0.5, -0.0, 3.25]),
    ("FP64", "fp64_contents", [0.1, -0.0, 1e300]),
    ("BYTES", "bytes_contents", [b"", b"ab", b"\xff"]),
]


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED, ids=[t[0] for t in TYPED])
def test_typed_contents_become_raw(datatype: str, field: str, values: list[Any]) -> None:
    contents = pb.InferTensorContents(**{field: values})
    for cls, tensor_cls, decode in (
        (pb.ModelInferRequest, pb.ModelInferRequest.InferInputTensor, grpc.decode_request),
        (pb.ModelInferResponse, pb.ModelInferResponse.InferOutputTensor, grpc.decode_response),
    ):
        pt = tensor_cls(name="t", datatype=datatype, shape=[1, 3], contents=contents)
        msg = cls(model_name="m", **{"inputs" if cls is pb.ModelInferRequest else "outputs": [pt]})
        decoded = decode(msg.SerializeToString())
        (t,) = decoded.inputs if cls is pb.ModelInferRequest else decoded.outputs
        expected = from_numpy("t", np.array(values, dtype=object if datatype == "BYTES" else
                                            DATATYPES[datatype].dtype).reshape(1, 3), datatype)
        assert bytes(t.data) == bytes(expected.data) and t.shape == (1, 3)


# ---------------------------------------------------------------- malformed
def request(*inputs: Any, raw: list[bytes] | None = None) -> bytes:
    msg = pb.ModelInferRequest(model_name="m", inputs=list(inputs))
    return msg.SerializeToString() + b"".join(encode_len_field(7, len(r)) + r for r in raw or [])


def tin(name: str = "in0", datatype: str = "INT32", shape: tuple[int, ...] = (2,), **kw: Any) -> Any:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape), **kw)


GOOD = request(tin("a", "FP32", (2,)), tin("in0", "INT64", (4,)), raw=[bytes(8), bytes(32)])

BAD: list[tuple[str, bytes]] = [
    ("lower-case datatype", request(tin(datatype="int32"), raw=[bytes(8)])),
    ("unknown datatype", request(tin(datatype="STRING"), raw=[bytes(8)])),
    ("negative dim", request(tin(shape=(-1, 2)), raw=[bytes(8)])),
    ("raw size vs shape", request(tin(shape=(3,)), raw=[bytes(8)])),
    ("bad BYTES raw", request(tin(datatype="BYTES", shape=(1,)), raw=[b"\x09\x00\x00\x00ab"])),
    ("raw and typed", request(tin(contents=pb.InferTensorContents(int_contents=[1, 2])), raw=[bytes(8)])),
    ("typed count", request(tin(contents=pb.InferTensorContents(int_contents=[1])))),
    ("typed wrong field", request(tin(contents=pb.InferTensorContents(fp32_contents=[1, 2])))),
    ("typed FP16", request(tin(datatype="FP16", contents=pb.InferTensorContents(fp32_contents=[1, 2])))),
    ("typed INT8 range", request(tin(datatype="INT8", contents=pb.InferTensorContents(int_contents=[1, 300])))),
    ("empty parameter", request(tin(parameters={"p": pb.InferParameter()}), raw=[bytes(8)])),
    ("truncated in raw", GOOD[:-5]),
]


@pytest.mark.parametrize("message", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_request_names_the_tensor(message: bytes) -> None:
    with pytest.raises(InvalidRequest, match="'in0'"):
        grpc.decode_request(message)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (GOOD[:5], "malformed"),  # truncated inside the header
        (request(tin(), tin("in1"), raw=[bytes(8)]),
         "unable to find data for input tensor 'in1' for model 'm' in request."),
        (b"\x38\x01", "wire type 0"),  # field 7 as a varint
        (b"\x0a\x02\xff\xfe", "malformed ModelInferRequest"),  # model_name not UTF-8
        (b"\x00", "field number 0"),
    ],
)
def test_malformed_request_envelope(message: bytes, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        grpc.decode_request(message)


def test_extra_raw_contents_are_ignored_as_triton_ignores_them() -> None:
    req = grpc.decode_request(request(tin(), raw=[bytes(range(8)), bytes(8)]))
    assert [bytes(t.data) for t in req.inputs] == [bytes(range(8))]


@pytest.mark.parametrize(
    ("message", "match"),
    [
        # Triton's own wording (infer_handler.cc), also for an empty contents message.
        (request(tin(contents=pb.InferTensorContents(int_contents=[1, 2])), raw=[bytes(8)]),
         "contents field must not be specified when using raw_input_contents for 'in0' for model 'm'$"),
        (request(tin(contents=pb.InferTensorContents()), raw=[bytes(8)]),
         "contents field must not be specified when using raw_input_contents"),
        (request(tin(contents=pb.InferTensorContents(fp32_contents=[1, 2]))),
         "unexpected explicit tensor data for input tensor 'in0' for model 'm' of type 'FP32', "
         "expected datatype 'INT32'"),
        (request(tin(contents=pb.InferTensorContents(int_contents=[1, 2], fp32_contents=[1, 2]))),
         "unexpected explicit tensor data for input tensor 'in0' for model 'm', binary data was already supplied."),
    ],
)
def test_tritons_refusals_word_for_word(message: bytes, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        grpc.decode_request(message)


def test_malformed_response() -> None:
    message = grpc.encode_response(InferResponse("m", outputs=(from_numpy("out0", sample("FP64")),)))
    with pytest.raises(InvalidRequest, match="'out0'"):
        grpc.decode_response(message[:-1])


# -------------------------------------------------------------- parameters
def test_parameter_mapping() -> None:
    params = {"b": True, "i": -1, "big": 2**63, "max": 2**63 - 1, "f": 2.5, "s": "x"}
    message = grpc.encode_request(InferRequest("m", parameters=params))
    msg = pb.ModelInferRequest.FromString(message)
    assert {k: v.WhichOneof("parameter_choice") for k, v in msg.parameters.items()} == {
        "b": "bool_param", "i": "int64_param", "big": "uint64_param", "max": "int64_param",
        "f": "double_param", "s": "string_param"}
    assert grpc.decode_request(message).parameters == params
    for bad in (2**64, -(2**63) - 1, None, [1]):
        with pytest.raises(InvalidRequest, match="'p'"):
            grpc.encode_request(InferRequest("m", parameters={"p": bad}))  # type: ignore[dict-item]


def test_http_only_parameters_are_dropped() -> None:
    t = Tensor("a", "INT8", (1,), memoryview(b"\x01"), {"binary_data_size": 1, "keep": 1})
    req = InferRequest("m", parameters={"binary_data_output": True}, inputs=(t,),
                       outputs=(RequestedOutput("o", {"binary_data": False}),))
    back = grpc.decode_request(grpc.encode_request(req))
    assert back.parameters == {} and back.inputs[0].parameters == {"keep": 1}
    assert back.outputs == (RequestedOutput("o"),)
    assert to_numpy(back.inputs[0]).tolist() == [1]


def test_shared_memory_is_unsupported() -> None:
    shm = {"shared_memory_region": pb.InferParameter(string_param="r")}
    with pytest.raises(Unsupported, match="'in0'"):
        grpc.decode_request(request(tin(parameters=shm)))
    msg = pb.ModelInferRequest(model_name="m", outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(
        name="o", parameters=shm)])
    with pytest.raises(Unsupported, match="'o'"):
        grpc.decode_request(msg.SerializeToString())


@pytest.mark.parametrize("datatype", ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                                      "UINT64", "FP32", "FP64", "BYTES"])
def test_typed_answer_reads_back_to_the_same_tensors(datatype):
    resp = InferResponse("m", "1", "x", {}, (from_numpy("out0", sample(datatype), datatype=datatype),))
    message = grpc.encode_response(resp, typed=True)
    assert not pb.ModelInferResponse.FromString(message).raw_output_contents
    assert grpc.decode_response(message) == resp


def test_typed_answer_falls_back_to_raw_for_fp16():
    resp = InferResponse("m", outputs=(from_numpy("a", sample("INT32")), from_numpy("h", sample("FP16"))))
    message = grpc.encode_response(resp, typed=True)
    assert len(pb.ModelInferResponse.FromString(message).raw_output_contents) == 2  # all raw, or none
    assert grpc.decode_response(message) == resp


def test_uses_typed_contents():
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    raw = pb.ModelInferRequest(model_name="m")
    raw.inputs.add(name="a", datatype="INT32", shape=[1])
    raw.raw_input_contents.append(b"\0\0\0\0")
    assert grpc.uses_typed_contents(typed.SerializeToString())
    assert not grpc.uses_typed_contents(raw.SerializeToString())
    assert not grpc.uses_typed_contents(pb.ModelInferRequest(model_name="m").SerializeToString())
