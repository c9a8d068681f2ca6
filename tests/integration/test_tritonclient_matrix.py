"""tritonclient through the gateway gets exactly what it gets from the server directly.

Matrix: server (the built-in reference server, real Triton) × client (http,
grpc, http.aio, grpc.aio) × path (``same``: the gateway's backend speaks the client's
protocol, pass-through; ``cross``: the gateway's backend speaks the other protocol, the
gateway converts) × case. The direct answer always comes from the server's
port of the client's own protocol.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import start_gateway
from tests.support.clients import CLIENTS, In, Out, infer, metadata, protocol_of, readiness

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "BF16", "FP32", "FP64", "BYTES"]
NO_JSON = {"FP16", "BF16"}  # spec README: FP16/BF16 cannot travel in JSON data


@pytest.fixture(scope="module", params=["reference", "triton"])
def server(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def gateways(server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gw")
    gws = {p: start_gateway(workdir, server.http_url, server.grpc_url, p) for p in ("http", "grpc")}
    yield gws
    for gw in gws.values():
        gw.stop()


def urls(server, gateways, client: str, path: str) -> tuple[str, str]:
    proto = protocol_of(client)
    backend = proto if path == "same" else ("grpc" if proto == "http" else "http")
    gw = gateways[backend]
    return (server.http_url if proto == "http" else server.grpc_url,
            gw.http_url if proto == "http" else gw.grpc_url)


def sample(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype == "BYTES":
        n = int(np.prod(shape))
        words = [("é" * int(rng.integers(0, 3)) + f"w{i}" * int(rng.integers(0, 4))).encode() for i in range(n)]
        return np.array(words, dtype=object).reshape(shape)
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        # tritonclient (r26.06+) takes BF16 as ml_dtypes.bfloat16 arrays.
        dt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": ml_dtypes.bfloat16}[datatype]
        return rng.standard_normal(shape).astype(dt)
    dt = np.dtype(datatype.lower())
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def assert_same(direct, via) -> None:
    assert via.model_name == direct.model_name
    assert via.id == direct.id
    assert via.outputs.keys() == direct.outputs.keys()
    for name, want in direct.outputs.items():
        got = via.outputs[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if want.dtype == object:
            assert got.tolist() == want.tolist(), name
        else:
            assert got.tobytes() == want.tobytes(), name
    assert via.response == direct.response


PATHS = ["same", "cross"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("form", ["json", "binary_in", "binary_out", "subset", "request_id"])
def test_add_sub(server, gateways, client, path, form):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    ins = [In("INPUT0", a, "FP32", form == "binary_in"), In("INPUT1", b, "FP32", form == "binary_in")]
    outs = {
        "json": [Out("OUTPUT0"), Out("OUTPUT1")],
        "binary_in": [Out("OUTPUT0"), Out("OUTPUT1")],
        "binary_out": [Out("OUTPUT0", True), Out("OUTPUT1", True)],
        "subset": [Out("OUTPUT1", True)],
        "request_id": None,
    }[form]
    rid = "req-42" if form == "request_id" else ""
    direct_url, via_url = urls(server, gateways, client, path)
    direct = infer(client, direct_url, "add_sub", ins, outs, request_id=rid)
    via = infer(client, via_url, "add_sub", ins, outs, request_id=rid)
    assert_same(direct, via)
    if outs is not None:
        assert list(via.outputs) == [o.name for o in outs]
    np.testing.assert_array_equal(via.outputs["OUTPUT1"], a - b)
    if form == "request_id":
        assert via.id == "req-42"


def _has_model(server, model: str) -> bool:
    return readiness("http", server.http_url, model)[2]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("shape", [(2, 3), (0, 4)], ids=["2x3", "0x4"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity(server, gateways, client, path, shape, datatype):
    model = f"identity_{datatype}"
    if not _has_model(server, model):
        pytest.skip(f"{model} is not served by this server")
    arr = sample(datatype, shape, np.random.default_rng(7))
    binary = datatype in NO_JSON or shape == (2, 3)
    ins = [In("INPUT0", arr, datatype, binary)]
    outs = [Out("OUTPUT0", binary)]
    direct_url, via_url = urls(server, gateways, client, path)
    direct = infer(client, direct_url, model, ins, outs)
    via = infer(client, via_url, model, ins, outs)
    assert_same(direct, via)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("client", CLIENTS)
def test_string_reverse(server, gateways, client, path):
    arr = np.array([b"hello", b"", "wörld".encode(), b"x" * 1000], dtype=object)
    direct_url, via_url = urls(server, gateways, client, path)
    ins = [In("INPUT0", arr, "BYTES", client.startswith("grpc"))]
    direct = infer(client, direct_url, "string_reverse", ins)
    via = infer(client, via_url, "string_reverse", ins)
    assert_same(direct, via)
    assert via.outputs["OUTPUT0"].tolist() == [b"olleh", b"", "wörld".encode()[::-1], b"x" * 1000]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("client", ["http", "grpc"])
def test_large_tensor_64mb(server, gateways, client, path):
    """64 MB through both listeners and every backend channel (gRPC's 4 MiB default would refuse it)."""
    arr = np.random.default_rng(3).integers(0, 255, size=(1, 64 * 1024 * 1024), dtype=np.uint8)
    _, via_url = urls(server, gateways, client, path)
    ins = [In("INPUT0", arr, "UINT8", True)]
    outs = [Out("OUTPUT0", True)]
    via = infer(client, via_url, "identity_UINT8", ins, outs)
    assert via.outputs["OUTPUT0"].tobytes() == arr.tobytes()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("client", ["http", "grpc"])
def test_model_metadata_and_readiness(server, gateways, client, path):
    direct_url, via_url = urls(server, gateways, client, path)
    for model in ("add_sub", "identity_FP32", "string_reverse"):
        assert metadata(client, via_url, model) == metadata(client, direct_url, model)
    live, ready, model_ready = readiness(client, via_url, "add_sub")
    assert live and ready and model_ready


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_server_metadata_is_the_gateways_own(gateways, client):
    url = gateways["http"].http_url if client == "http" else gateways["http"].grpc_url
    meta = metadata(client, url)
    assert meta["name"] == "oip-gateway"
    assert "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("client", CLIENTS)
def test_compression(server, gateways, client, path, algorithm):
    """Compressed requests and responses, as tritonclient asks for them (HTTP Content-Encoding /
    Accept-Encoding; gRPC message compression)."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    binary = client.startswith("http")
    ins = [In("INPUT0", a, "FP32", binary), In("INPUT1", b, "FP32", False)]
    outs = [Out("OUTPUT0", True), Out("OUTPUT1", False)]
    if protocol_of(client) == "http":
        kw = {"request_compression_algorithm": algorithm, "response_compression_algorithm": algorithm}
    else:
        kw = {"compression_algorithm": algorithm}
    direct_url, via_url = urls(server, gateways, client, path)
    direct = infer(client, direct_url, "add_sub", ins, outs, **kw)
    via = infer(client, via_url, "add_sub", ins, outs, **kw)
    assert_same(direct, via)
    np.testing.assert_array_equal(via.outputs["OUTPUT0"], a + b)
