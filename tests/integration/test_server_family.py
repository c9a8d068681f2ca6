"""A gRPC client through an HTTP backend gets its answer in the form the backend's servers give over
gRPC (docs/config.md ``server_family``): Triton's gRPC side answers raw_output_contents to
typed requests too (tritonclient reads nothing else), and marks each ModelStreamInfer answer
``triton_final_response``; MLServer and KServe answer a typed request typed. The family is read
from each endpoint's server metadata name; the backend setting overrides it."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.conftest import start_gateway

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"

# (model, datatype, typed field, values, numpy dtype of its raw bytes)
CASES = [
    ("identity_FP32", "FP32", "fp32_contents", [1.5, -2.0, 0.0], "<f4"),
    ("identity_FP64", "FP64", "fp64_contents", [1e300, -0.5], "<f8"),
    ("identity_INT8", "INT8", "int_contents", [-128, 127], "<i1"),
    ("identity_INT64", "INT64", "int64_contents", [-(2**63), 2**63 - 1], "<i8"),
    ("identity_UINT16", "UINT16", "uint_contents", [0, 65535], "<u2"),
    ("identity_BOOL", "BOOL", "bool_contents", [True, False, True], "?"),
]


@pytest.fixture(scope="module", params=["auto", "mlserver"])
def gw(request, triton, tmp_path_factory):
    family = {} if request.param == "auto" else {"server_family": request.param}
    g = start_gateway(tmp_path_factory.mktemp(f"family-{request.param}"), triton.http_url, triton.grpc_url, "http",
                      models=[c[0] for c in CASES] + ["identity_BYTES"], backend_extra=family)
    g.family = request.param
    yield g
    g.stop()


def _typed(model: str, datatype: str, field: str, values: list) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id="typed-1")
    tensor = req.inputs.add(name="INPUT0", datatype=datatype, shape=[1, len(values)])
    getattr(tensor.contents, field).extend(values)
    return req


def _call(url: str, req: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(url) as ch:
        return pb.ModelInferResponse.FromString(ch.unary_unary(INFER)(req.SerializeToString(), timeout=30))


@pytest.mark.parametrize("model, datatype, field, values, dtype", CASES)
def test_typed_request_answered_as_the_family_answers(gw, triton, model, datatype, field, values, dtype):
    req = _typed(model, datatype, field, values)
    direct, via = _call(triton.grpc_url, req), _call(gw.grpc_url, req)
    assert via.id == direct.id == "typed-1"
    if gw.family == "auto":  # read as Triton: its own gRPC answer, raw
        assert len(via.raw_output_contents) == len(direct.raw_output_contents) == 1
        assert not via.outputs[0].HasField("contents")
        assert np.frombuffer(via.raw_output_contents[0], dtype).tolist() == values
        assert via.raw_output_contents[0] == direct.raw_output_contents[0]
    else:  # the backend says its servers answer typed requests typed (MLServer's form)
        assert not via.raw_output_contents
        assert list(getattr(via.outputs[0].contents, field)) == values


def test_typed_bytes(gw, triton):
    values = [b"a", b"", b"\xff\x00"]
    req = _typed("identity_BYTES", "BYTES", "bytes_contents", values)
    direct, via = _call(triton.grpc_url, req), _call(gw.grpc_url, req)
    if gw.family == "auto":
        assert via.raw_output_contents[0] == direct.raw_output_contents[0]
    else:
        assert list(via.outputs[0].contents.bytes_contents) == values


def test_stream_answers_carry_triton_final_response(gw, triton):
    """Triton marks every ModelStreamInfer answer ``triton_final_response: true``; through an
    HTTP backend of Triton the gateway writes the answers itself and marks them the same way."""
    def answers(url: str) -> list:
        reqs = [pb.ModelInferRequest(model_name="identity_FP32", id=f"s{i}") for i in range(3)]
        for i, r in enumerate(reqs):
            r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
            r.raw_input_contents.append(np.array([i], "<f4").tobytes())
        with grpc.insecure_channel(url) as ch:
            call = ch.stream_stream(STREAM)
            got = [service_pb2.ModelStreamInferResponse.FromString(m) for m in
                   call(iter([r.SerializeToString() for r in reqs]), timeout=30)]
        assert all(not g.error_message for g in got)
        return [g.infer_response for g in got]

    direct, via = answers(triton.grpc_url), answers(gw.grpc_url)
    assert [r.id for r in via] == [r.id for r in direct] == ["s0", "s1", "s2"]
    final = [r.parameters["triton_final_response"].bool_param if "triton_final_response" in r.parameters else None
             for r in via]
    assert [r.parameters["triton_final_response"].bool_param for r in direct] == [True] * 3
    assert final == ([True] * 3 if gw.family == "auto" else [None] * 3)
