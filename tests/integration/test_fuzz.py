"""Whatever a client sends, the gateway answers with a clear 4xx/gRPC error and keeps serving.

Random bodies and messages go through the *converting* paths, where the gateway
itself decodes them (pass-through paths hand the bytes to the backend unread).
"""
from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.conftest import start_gateway

DATATYPES = ["BOOL", "UINT8", "INT32", "FP16", "FP32", "BYTES", "bool", "FP128", ""]

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                        st.text(max_size=8))
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["INPUT0", "INPUT1", "", "x"]),
     "datatype": st.sampled_from(DATATYPES),
     "shape": st.lists(st.integers(-2, 6), max_size=3)},
    optional={"data": json_value, "parameters": st.dictionaries(
        st.sampled_from(["binary_data_size", "binary_data", "x"]), json_scalar, max_size=2)},
)
request = st.fixed_dictionaries({"inputs": st.lists(tensor, max_size=3)},
                                optional={"id": json_scalar, "parameters": json_value,
                                          "outputs": st.lists(st.dictionaries(st.just("name"), json_scalar),
                                                              max_size=2)})


@pytest.fixture(scope="module")
def gw(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("fuzz"), reference.http_url, reference.grpc_url, "grpc")
    yield g
    g.stop()


@pytest.fixture(scope="module")
def gw_http_backend(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("fuzz-h"), reference.http_url, reference.grpc_url, "http")
    yield g
    g.stop()


def post_many(url: str, bodies: list[tuple[bytes, dict[str, str]]]) -> list[tuple[int, bytes]]:
    async def run():
        out = []
        async with aiohttp.ClientSession() as s:
            for body, headers in bodies:
                async with s.post(f"http://{url}/v2/models/identity_FP32/infer", data=body, headers=headers) as r:
                    out.append((r.status, await r.read()))
        return out

    return asyncio.run(run())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=request, tail=st.binary(max_size=64), cut=st.integers(-5, 400))
def test_random_http_requests_get_4xx(gw, doc, tail, cut):
    body = json.dumps(doc).encode()  # stdlib: orjson refuses ints beyond 64 bits, which we want to send
    bodies = [(body, {}), (body + tail, {"Inference-Header-Content-Length": str(len(body))}),
              (body[: max(cut, 0)], {"Inference-Header-Content-Length": str(cut)})]
    for status, answer in post_many(gw.http_url, bodies):
        assert status < 500 or status in (502, 503, 504), (status, answer)
        if status != 200:
            assert isinstance(orjson.loads(answer)["error"], str)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), name=st.sampled_from(["identity_FP32", "add_sub", "nope"]),
       dims=st.lists(st.integers(-3, 5), max_size=3), datatype=st.sampled_from(DATATYPES),
       contents=st.lists(st.binary(max_size=40), max_size=3))
def test_random_grpc_requests_get_clean_errors(gw_http_backend, raw, name, dims, datatype, contents):
    msg = pb.ModelInferRequest(model_name=name, raw_input_contents=contents)
    msg.inputs.add(name="INPUT0", datatype=datatype, shape=dims)
    with grpc.insecure_channel(gw_http_backend.grpc_url) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for message in (msg.SerializeToString(), raw, msg.SerializeToString() + raw):
            try:
                call(message, timeout=10)
            except grpc.RpcError as err:
                assert err.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) or \
                    "internal gateway error" not in (err.details() or ""), err
                assert err.code() != grpc.StatusCode.UNKNOWN, err


def test_no_tracebacks_logged(gw, gw_http_backend):
    """Runs after the fuzzers (file order): nothing they sent reached an unhandled-error path."""
    for g in (gw, gw_http_backend):
        assert g.proc.poll() is None
        log = g.log_tail(100000)
        assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
