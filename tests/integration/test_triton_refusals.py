"""A request Triton refuses is refused the same way through the gateway — same status, same
words — on the converting paths too (a gRPC client to an HTTP backend, an HTTP client to a
gRPC backend), compared with what the real Triton answers directly."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.conftest import start_gateway


@pytest.fixture(scope="module", params=["http", "grpc"])
def gw(request, triton, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp(f"refusals-{request.param}"), triton.http_url, triton.grpc_url,
                      request.param)
    g.backend_protocol = request.param  # (which backend the routes go to: the tests compare per path)
    yield g
    g.stop()


def grpc_infer(url: str, message: bytes) -> tuple[str, str]:
    """(status code name, details) of a raw ModelInfer call."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(message, timeout=30)
            return "OK", ""
        except grpc.RpcError as err:
            return err.code().name, err.details()


def add_sub(version: str = "", typed_too: bool = False, raws: int = 2) -> bytes:
    data = np.arange(4, dtype=np.float32).tobytes()
    inputs = [pb.ModelInferRequest.InferInputTensor(name=n, datatype="FP32", shape=[4]) for n in ("INPUT0", "INPUT1")]
    if typed_too:
        inputs[1].contents.fp32_contents.extend([0, 1, 2, 3])
    msg = pb.ModelInferRequest(model_name="add_sub", model_version=version, inputs=inputs)
    msg.raw_input_contents.extend([data] * raws)
    return msg.SerializeToString()


@pytest.mark.parametrize("case", ["typed with raw", "too few raw", "version abc", "version -1"])
def test_grpc_refusals_equal_tritons(triton, gw, case):
    message = {
        "typed with raw": add_sub(typed_too=True),
        "too few raw": add_sub(raws=1),
        "version abc": add_sub(version="abc"),
        "version -1": add_sub(version="-1"),
    }[case]
    direct = grpc_infer(triton.grpc_url, message)
    assert direct[0] == "INVALID_ARGUMENT"
    assert grpc_infer(gw.grpc_url, message) == direct


def http_infer(url: str, path: str, data: list | None = None) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [2], "data": data or [1, 2]}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    req = urllib.request.Request(f"http://{url}{path}", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_http_version_that_is_not_a_number(triton, gw):
    direct = http_infer(triton.http_url, "/v2/models/add_sub/versions/abc/infer")
    assert direct == (404, {"error": "Not Found"})
    assert http_infer(gw.http_url, "/v2/models/add_sub/versions/abc/infer") == direct
    ok = http_infer(gw.http_url, "/v2/models/add_sub/versions/1/infer")
    assert ok[0] == 200


def test_json_bool_among_numbers_is_refused_never_read_as_one(triton, gw):
    # numpy reads [1.5, true] as [1.5, 1.0]; Triton refuses a JSON bool where a number belongs, and so
    # must the gateway on the converting path (gRPC backend) — never send 1.0 in the client's name.
    # (Triton answers its JSON parse errors with 500; the gateway's own refusal is a 400.)
    direct = http_infer(triton.http_url, "/v2/models/add_sub/infer", [1.5, True])
    assert direct[0] == 500 and "non-number" in direct[1]["error"], direct
    status, answer = http_infer(gw.http_url, "/v2/models/add_sub/infer", [1.5, True])
    if gw.backend_protocol == "grpc":
        refusal = "tensor 'INPUT0': 'data' holds true or false, which are not FP32 values"
        assert (status, answer) == (400, {"error": refusal})
    else:  # pass-through: Triton's own refusal, relayed
        assert (status, answer) == direct
    assert http_infer(gw.http_url, "/v2/models/add_sub/infer", [1.5, 2])[0] == 200
