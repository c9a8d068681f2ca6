"""A second real backend, MLServer, behind both transports of the gateway.

MLServer has no HTTP binary-data extension, so its HTTP backend is configured
with ``binary_extension: false``: gRPC clients routed there are converted to
JSON requests. HTTP clients to its gRPC backend may use binary inputs and outputs,
which the gateway converts to and from raw gRPC contents.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.clients import In, Out, infer, metadata, protocol_of
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.mlserver

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]


@pytest.fixture(scope="module")
def gws(mlserver, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gw-mlserver")
    backends = {
        "http": {"protocol": "http", "endpoints": [mlserver.http_url], "binary_extension": False,
                 "non_utf8_bytes": "base64"},
        "grpc": {"protocol": "grpc", "endpoints": [mlserver.grpc_url]},
    }
    out = {}
    for backend in ("http", "grpc"):
        routes = [{"model": "add_sub", "backend": backend}, {"model": "*", "backend": backend}]
        out[backend] = GatewayProcess(gateway_config(backends, routes), workdir, f"gw-ml-{backend}").start()
    for g in out.values():
        import tritonclient.http as httpclient

        def ready(g=g):
            with httpclient.InferenceServerClient(g.http_url) as c:
                return c.is_server_ready()

        wait_for(ready, timeout=30, what="gateway ready")
    yield out
    for g in out.values():
        g.stop()


def sample(datatype: str, rng) -> np.ndarray:
    shape = (2, 3)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype == "BYTES":
        return np.array([f"w{i}é".encode() for i in range(6)], dtype=object).reshape(shape)
    if datatype.startswith("FP"):
        return rng.standard_normal(shape).astype(np.dtype(f"float{datatype[2:]}"))
    dt = np.dtype(datatype.lower())
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def norm(a: np.ndarray) -> list:
    # tritonclient's HTTP JSON path gives BYTES back as str; compare as bytes.
    if a.dtype == object:
        return [x.encode() if isinstance(x, str) else x for x in a.ravel().tolist()]
    return [a.dtype.str, a.shape, a.tobytes()]


@pytest.mark.parametrize("backend", ["http", "grpc"])
@pytest.mark.parametrize("client", ["http", "grpc", "http_aio", "grpc_aio"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_through_gateway(mlserver, gws, client, backend, datatype):
    proto = protocol_of(client)
    if client == "http_aio" and backend == "http":
        pytest.skip("tritonclient.http.aio posts JSON as application/octet-stream, which MLServer "
                    "refuses with 422 directly too; the pass-through backend relays exactly that")
    arr = sample(datatype, np.random.default_rng(5))
    # HTTP JSON cannot carry FP16: against the HTTP (JSON-only) backend that is MLServer's
    # own limit, but through the gRPC backend the gateway carries it binary → raw.
    binary = proto == "http" and backend == "grpc"
    if datatype == "FP16" and proto == "http" and not binary:
        pytest.skip("FP16 cannot travel in JSON and MLServer has no binary extension")
    # A gRPC client's FP16 to the JSON-only backend travels as JSON numbers (MLServer reads FP16
    # numbers), widened exactly and rounded back to the same FP16 by MLServer's numpy.
    ins = [In("INPUT0", arr, datatype, binary)]
    outs = [Out("OUTPUT0", binary)]
    direct_url = mlserver.http_url if proto == "http" else mlserver.grpc_url
    gw = gws[backend]
    via_url = gw.http_url if proto == "http" else gw.grpc_url
    d_ins = [In("INPUT0", arr, datatype, False)] if proto == "http" else ins
    if datatype == "FP16" and proto == "http":
        direct_result = arr  # nothing to compare with directly over JSON: compare with the input
    else:
        direct_result = infer(proto, direct_url, f"identity_{datatype}", d_ins,
                              [Out("OUTPUT0", False)] if proto == "http" else outs).outputs["OUTPUT0"]
    via = infer(client, via_url, f"identity_{datatype}", ins, outs)
    got = via.outputs["OUTPUT0"]
    assert norm(got) == norm(direct_result)
    assert norm(got) == norm(arr)


@pytest.mark.parametrize("backend", ["http", "grpc"])
@pytest.mark.parametrize("client", ["http", "grpc"])
def test_add_sub_and_string_reverse(gws, client, backend):
    gw = gws[backend]
    url = gw.http_url if protocol_of(client) == "http" else gw.grpc_url
    a = np.arange(8, dtype=np.float32)
    b = np.full(8, 0.5, dtype=np.float32)
    r = infer(client, url, "add_sub", [In("INPUT0", a, "FP32", False), In("INPUT1", b, "FP32", False)],
              request_id="ml-1")
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(r.outputs["OUTPUT1"], a - b)
    assert r.id == "ml-1"
    words = np.array([b"abc", b"", b"xyz"], dtype=object)
    r = infer(client, url, "string_reverse", [In("INPUT0", words, "BYTES", False)])
    assert norm(r.outputs["OUTPUT0"]) == [b"cba", b"", b"zyx"]


@pytest.mark.parametrize("backend", ["http", "grpc"])
def test_metadata_through_gateway(mlserver, gws, backend):
    gw = gws[backend]
    for kind, url in (("http", gw.http_url), ("grpc", gw.grpc_url)):
        meta = metadata(kind, url, "add_sub")
        assert meta["name"] == "add_sub"
        assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"]


NONFINITE = np.array([[1.0, np.inf, -np.inf], [np.nan, -0.0, 2.5]], dtype=np.float32)


@pytest.mark.parametrize("backend", ["http", "grpc"])
@pytest.mark.parametrize("client", ["http", "grpc"])
@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_infinities_and_nan_never_change_on_the_way_to_mlserver(mlserver, gws, client, backend, datatype):
    """±Inf and NaN on every path to MLServer. The gateway writes Triton's tokens (Infinity,
    NaN) where it writes JSON; MLServer's own parsers refuse them (its REST side: a 422 JSON
    decode error; its gRPC side: a 500), and that refusal is what the client gets — as going
    direct does. What must never happen: an answer with a value changed (an Inf read as NaN)."""
    from tritonclient.utils import InferenceServerException

    arr = NONFINITE.astype(datatype.lower().replace("fp", "float"))
    gw = gws[backend]
    url = gw.http_url if client == "http" else gw.grpc_url
    try:
        got = infer(client, url, f"identity_{datatype}", [In("INPUT0", arr, datatype, False)],
                    [Out("OUTPUT0", False)]).outputs["OUTPUT0"]
    except InferenceServerException as exc:
        assert "JSON decode error" in str(exc) or "not a float" in str(exc), str(exc)  # MLServer's words
        return
    assert got.dtype == arr.dtype and np.array_equal(np.isnan(got), np.isnan(arr))
    finite = ~np.isnan(arr)
    assert got[finite].tobytes() == arr[finite].tobytes()


@pytest.mark.parametrize("typed", [True, False])
def test_answer_in_the_client_s_form(mlserver, gws, typed):
    """A gRPC client that sends typed contents gets typed contents back, as MLServer answers it
    directly; a raw request gets raw_output_contents (all tritonclient reads) — through the
    JSON-only HTTP backend, where the gateway writes the gRPC answer itself."""
    import grpc

    from gateway._pb import grpc_predict_v2_pb2 as pb

    def call(url: str) -> pb.ModelInferResponse:
        req = pb.ModelInferRequest(model_name="identity_INT32")
        tensor = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 3])
        values = [-7, 0, 2**31 - 1]
        if typed:
            tensor.contents.int_contents.extend(values)
        else:
            req.raw_input_contents.append(np.array(values, "<i4").tobytes())
        with grpc.insecure_channel(url) as ch:
            answer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(req.SerializeToString(), timeout=30)
        return pb.ModelInferResponse.FromString(answer)

    direct, via = call(mlserver.grpc_url), call(gws["http"].grpc_url)
    for resp in (direct, via):
        if typed:
            assert not resp.raw_output_contents and list(resp.outputs[0].contents.int_contents) == [-7, 0, 2**31 - 1]
        else:
            assert np.frombuffer(resp.raw_output_contents[0], "<i4").tolist() == [-7, 0, 2**31 - 1]


NOT_UTF8 = [b"\xff\xfe\x00abc", b"plain", b"", bytes(range(256))]


def _hexes(url: str, values: list[bytes], grpc_client: bool) -> list[str]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    mod = grpcclient if grpc_client else httpclient
    with mod.InferenceServerClient(url) as c:
        i = mod.InferInput("INPUT0", [len(values)], "BYTES")
        if grpc_client:
            i.set_data_from_numpy(np.array(values, dtype=object))
        else:
            i.set_data_from_numpy(np.array(values, dtype=object), binary_data=True)
        out = c.infer("bytes_hex", [i]).as_numpy("OUTPUT0")
    return [v.decode() if isinstance(v, bytes) else v for v in out.reshape(-1).tolist()]


def test_bytes_that_are_not_utf8_reach_mlserver_unchanged(mlserver, gws):
    """A gRPC client's BYTES that are not UTF-8, to MLServer's JSON-only HTTP backend: sent as
    MLServer's base64 content type (non_utf8_bytes: base64), so the model reads the very
    bytes it reads when the same request goes to MLServer over gRPC directly."""
    want = [v.hex() for v in NOT_UTF8]
    assert _hexes(mlserver.grpc_url, NOT_UTF8, True) == want
    assert _hexes(gws["http"].grpc_url, NOT_UTF8, True) == want
    # An HTTP client sending them binary to the gRPC backend needs no base64 at all.
    assert _hexes(gws["grpc"].http_url, NOT_UTF8, False) == want


def test_bytes_that_are_not_utf8_are_refused_by_default(mlserver, tmp_path):
    from tritonclient.utils import InferenceServerException
    backends = {"http": {"protocol": "http", "endpoints": [mlserver.http_url], "binary_extension": False}}
    with GatewayProcess(gateway_config(backends, [{"model": "*", "backend": "http"}]), tmp_path, "gw-refuse") as g:
        with pytest.raises(InferenceServerException) as info:
            _hexes(g.grpc_url, NOT_UTF8, True)
    assert "'INPUT0'" in str(info.value) and "UTF-8" in str(info.value)
    assert "StatusCode.INVALID_ARGUMENT" in str(info.value)
