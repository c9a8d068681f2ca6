"""NaN and ±Inf through the converting paths against real Triton: an HTTP client asking for
JSON outputs from a model behind a gRPC backend gets the very text Triton itself writes
(`[1.0,Infinity,-Infinity,NaN]`), not nulls; FP16 in JSON reaches Triton's gRPC side as
numbers rounded to FP16 and comes back exactly."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tests.support.gateway import GatewayProcess, gateway_config

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def gw(triton, tmp_path_factory):
    backends = {"g": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    cfg = gateway_config(backends, [{"model": "*", "backend": "g"}])
    with GatewayProcess(cfg, tmp_path_factory.mktemp("nonfinite"), "gw-nonfinite") as g:
        yield g


def post(url: str, model: str, body: bytes, header_length: int | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def binary_request(values: np.ndarray, datatype: str) -> tuple[bytes, int]:
    raw = values.tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": list(values.shape), "datatype": datatype,
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}).encode()
    return head + raw, len(head)


def data_text(answer: bytes) -> bytes:
    start = answer.index(b'"data":') + len(b'"data":')
    return answer[start:answer.index(b"]", start) + 1]


def test_json_outputs_hold_triton_s_tokens_not_null(triton, gw):
    values = np.array([[1.0, np.inf, -np.inf, np.nan]], dtype=np.float32)
    body, hl = binary_request(values, "FP32")
    status, direct = post(triton.http_url, "identity_FP32", body, hl)
    assert status == 200
    status, via = post(gw.http_url, "identity_FP32", body, hl)  # HTTP client → gRPC backend → JSON
    assert status == 200
    assert data_text(via) == data_text(direct) == b"[1.0,Infinity,-Infinity,NaN]"


def test_json_inputs_with_tokens_reach_triton_unchanged(gw):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP64",
                                   "data": [float("inf"), float("-inf"), 2.5]}]}).encode()  # Infinity tokens
    status, answer = post(gw.http_url, "identity_FP64", body)
    assert status == 200 and data_text(answer) == b"[Infinity,-Infinity,2.5]"


def test_fp16_as_json_numbers_through_a_grpc_backend(gw):
    """Triton refuses FP16 in JSON on its own HTTP side; through a gRPC backend the gateway carries
    it: numbers rounded once to FP16 (ties to even), answers widened exactly."""
    halfway = 1 + 2.0**-11  # ties to even: 1.0
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP16",
                                   "data": [0.5, halfway, 65504.0, -0.0]}]}).encode()
    status, answer = post(gw.http_url, "identity_FP16", body)
    assert status == 200
    assert json.loads(data_text(answer)) == [0.5, 1.0, 65504.0, -0.0]
    assert data_text(answer).endswith(b"-0.0]")
