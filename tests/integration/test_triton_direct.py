"""Sanity tests straight against the real Triton (no gateway): they prove the harness and the model repository.

The raw-HTTP tests at the end pin Triton's own answers (status, headers, body) to odd requests; they are
the ground truth the gateway's pass-through behaviour is compared with.
"""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.triton import TritonServer

pytestmark = pytest.mark.triton

MODELS = ["add_sub", "string_reverse"] + [
    f"identity_{dt}"
    for dt in (
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "BF16",
        "FP32",
        "FP64",
        "BYTES",
    )
]
DATATYPES = [m.removeprefix("identity_") for m in MODELS if m.startswith("identity_")]

# (protocol, binary_in, binary_out); gRPC always carries raw bytes.
MODES = [
    pytest.param(("http", False, False), id="http-json"),
    pytest.param(("http", True, False), id="http-binin"),
    pytest.param(("http", False, True), id="http-binout"),
    pytest.param(("http", True, True), id="http-binary"),
    pytest.param(("grpc", True, True), id="grpc"),
]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def http_client(triton: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(triton.http_url, connection_timeout=60, network_timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(triton: TritonServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, http_client: Any, grpc_client: Any) -> Any:
    return http_client if request.param == "http" else grpc_client


def _infer(
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    mode: tuple[str, bool, bool],
    model: str,
    inputs: dict[str, tuple[np.ndarray, str]],
    outputs: list[str],
) -> dict[str, np.ndarray]:
    protocol, binary_in, binary_out = mode
    if protocol == "http":
        infer_inputs = []
        for name, (array, datatype) in inputs.items():
            inp = httpclient.InferInput(name, list(array.shape), datatype)
            inp.set_data_from_numpy(array, binary_data=binary_in)
            infer_inputs.append(inp)
        requested = [httpclient.InferRequestedOutput(name, binary_data=binary_out) for name in outputs]
        result = http_client.infer(model, infer_inputs, outputs=requested)
    else:
        infer_inputs = []
        for name, (array, datatype) in inputs.items():
            inp = grpcclient.InferInput(name, list(array.shape), datatype)
            inp.set_data_from_numpy(array)
            infer_inputs.append(inp)
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = grpc_client.infer(model, infer_inputs, outputs=requested)
    return {name: result.as_numpy(name) for name in outputs}


# ------------------------------------------------------------------------------------------- harness


def test_harness_ports(triton: TritonServer) -> None:
    ports = {triton.http_port, triton.grpc_port, triton.metrics_port}
    assert None not in ports and len(ports) == 3
    assert triton.listening_ports() == ports
    assert triton.http_url == f"127.0.0.1:{triton.http_port}"
    assert triton.grpc_url == f"127.0.0.1:{triton.grpc_port}"
    assert triton.log_path is not None and triton.log_path.exists()


def test_metrics_endpoint(triton: TritonServer) -> None:
    status, _, body = _request(triton.metrics_port, "GET", "/metrics")
    assert status == 200
    assert b"nv_inference_request_success" in body


# ------------------------------------------------------------------------------ health and metadata


def test_server_live_and_ready(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


@pytest.mark.parametrize("model", MODELS)
def test_model_ready(http_client: Any, grpc_client: Any, model: str) -> None:
    assert http_client.is_model_ready(model)
    assert grpc_client.is_model_ready(model)
    assert http_client.is_model_ready(model, "1")


def test_unknown_model_not_ready(client: Any) -> None:
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("add_sub", "7")


def test_repository_index(http_client: httpclient.InferenceServerClient) -> None:
    index = http_client.get_model_repository_index()
    # repeat_FP32 (decoupled) serves the stream tests only (test_stream.py), generate_words
    # the generate extension's (test_generate.py).
    expected = {(m, "1", "READY") for m in [*MODELS, "repeat_FP32", "generate_words"]}
    assert {(m["name"], m["version"], m["state"]) for m in index} == expected


def test_server_metadata(http_client: Any, grpc_client: Any) -> None:
    meta = http_client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]
    gmeta = grpc_client.get_server_metadata(as_json=True)
    assert gmeta["name"] == meta["name"] and gmeta["version"] == meta["version"]


def test_model_metadata(http_client: Any, grpc_client: Any) -> None:
    expected = {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [-1]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1]},
        ],
    }
    assert http_client.get_model_metadata("add_sub") == expected
    gmeta = grpc_client.get_model_metadata("add_sub", as_json=True)
    # protobuf JSON renders int64 dims as strings.
    for tensor in gmeta["inputs"] + gmeta["outputs"]:
        tensor["shape"] = [int(d) for d in tensor["shape"]]
    assert gmeta == expected


@pytest.mark.parametrize("dt", DATATYPES)
def test_identity_metadata(http_client: Any, dt: str) -> None:
    meta = http_client.get_model_metadata(f"identity_{dt}")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": dt, "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": dt, "shape": [-1, -1]}]


def test_model_config(http_client: Any) -> None:
    config = http_client.get_model_config("identity_BYTES")
    assert config["backend"] == "python"
    assert config["input"][0]["data_type"] == "TYPE_STRING"


# ------------------------------------------------------------------------------------------ add_sub


@pytest.mark.parametrize("mode", MODES)
def test_add_sub(http_client: Any, grpc_client: Any, mode: tuple[str, bool, bool]) -> None:
    a = np.array([1.0, 2.5, -3.0, 1e30], dtype=np.float32)
    b = np.array([0.5, 0.25, 4.0, -1e30], dtype=np.float32)
    out = _infer(
        http_client,
        grpc_client,
        mode,
        "add_sub",
        {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")},
        ["OUTPUT0", "OUTPUT1"],
    )
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert out["OUTPUT0"].dtype == np.float32


@pytest.mark.parametrize("mode", MODES)
def test_add_sub_empty(http_client: Any, grpc_client: Any, mode: tuple[str, bool, bool]) -> None:
    a = np.zeros(0, dtype=np.float32)
    out = _infer(
        http_client,
        grpc_client,
        mode,
        "add_sub",
        {"INPUT0": (a, "FP32"), "INPUT1": (a, "FP32")},
        ["OUTPUT0", "OUTPUT1"],
    )
    assert out["OUTPUT0"].shape == (0,) and out["OUTPUT1"].shape == (0,)


def test_add_sub_model_error(client: Any) -> None:
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    i0 = mod.InferInput("INPUT0", [2], "FP32")
    i0.set_data_from_numpy(np.ones(2, np.float32))
    i1 = mod.InferInput("INPUT1", [3], "FP32")
    i1.set_data_from_numpy(np.ones(3, np.float32))
    with pytest.raises(InferenceServerException, match=r"INPUT0 shape \[2\] != INPUT1 shape \[3\]"):
        client.infer("add_sub", [i0, i1])


# ----------------------------------------------------------------------------------------- identity


def _as_bytes(value: Any) -> bytes:
    # tritonclient.http returns BYTES from JSON outputs as str, from binary outputs as bytes.
    return value.encode() if isinstance(value, str) else bytes(value)


def _sample(dt: str, shape: tuple[int, ...], *, json_safe: bool) -> np.ndarray:
    """Values of ``dt``; ``json_safe`` keeps BYTES valid UTF-8 (Triton puts raw bytes in JSON strings)."""
    n = int(np.prod(shape))
    if dt == "BOOL":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dt == "BYTES":
        pool = [b"", b"a", "h\u00e9llo".encode(), b"x" * 300]
        if not json_safe:
            pool += [b"\x00\xff\xfe", b"\x80"]
        values = np.empty(n, dtype=np.object_)
        for i in range(n):
            values[i] = pool[i % len(pool)]
        return values.reshape(shape)
    if dt == "BF16":
        return (np.linspace(-3, 3, n, dtype=np.float32).astype(ml_dtypes.bfloat16)).reshape(shape)
    np_dtype = np.dtype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dt, dt.lower()))
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        base = np.array([info.min, info.max, 0, 1, info.max // 3], dtype=np_dtype)
    else:
        # Triton reads and writes Infinity/NaN in JSON too (see test_raw_http_json_non_finite).
        info = np.finfo(np_dtype)
        base = np.array([-1.5, 0.0, 2.25, info.max, info.tiny, np.inf, -np.inf, np.nan], dtype=np_dtype)
    return np.resize(base, n).reshape(shape)


def _identity_modes(dt: str) -> list[Any]:
    # Half floats travel over HTTP only as binary data: Triton refuses FP16 JSON inputs and FP16/BF16 JSON
    # outputs (see test_raw_http_fp16_json_input, test_raw_http_half_float_json_output), and tritonclient
    # refuses BF16 JSON inputs ("BF16 inputs must be sent as binary data over HTTP").
    return [m for m in MODES if not (dt in ("FP16", "BF16") and not (m.values[0][1] and m.values[0][2]))]


@pytest.mark.parametrize("shape", [(2, 3), (0, 4), (3, 0), (1, 1)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    ("dt", "mode"),
    [pytest.param(dt, m.values[0], id=f"{dt}-{m.id}") for dt in DATATYPES for m in _identity_modes(dt)],
)
def test_identity(
    http_client: Any, grpc_client: Any, dt: str, mode: tuple[str, bool, bool], shape: tuple[int, int]
) -> None:
    data = _sample(dt, shape, json_safe=not (mode[1] and mode[2]))
    out = _infer(http_client, grpc_client, mode, f"identity_{dt}", {"INPUT0": (data, dt)}, ["OUTPUT0"])[
        "OUTPUT0"
    ]
    assert out.shape == data.shape
    if dt == "BYTES":
        assert out.dtype == np.object_
        assert [_as_bytes(v) for v in out.flat] == list(data.flat)
    else:
        assert out.dtype == data.dtype
        np.testing.assert_array_equal(out, data)


LARGE = 64 * 1024 * 1024


@pytest.mark.parametrize("mode", [m for m in MODES if m.values[0][1] and m.values[0][2]])
@pytest.mark.parametrize("dt", ["FP32", "UINT8", "BYTES"])
def test_identity_64mb(http_client: Any, grpc_client: Any, dt: str, mode: tuple[str, bool, bool]) -> None:
    rng = np.random.default_rng(0)
    if dt == "BYTES":
        data = np.empty((8, 8), dtype=np.object_)
        for i in range(data.size):
            data.flat[i] = rng.bytes(LARGE // data.size)
    elif dt == "UINT8":
        data = rng.integers(0, 256, size=(1024, LARGE // 1024), dtype=np.uint8)
    else:
        data = rng.standard_normal((4096, LARGE // 4 // 4096), dtype=np.float32)
    out = _infer(http_client, grpc_client, mode, f"identity_{dt}", {"INPUT0": (data, dt)}, ["OUTPUT0"])[
        "OUTPUT0"
    ]
    assert out.shape == data.shape
    if dt == "BYTES":
        assert all(bytes(o) == d for o, d in zip(out.flat, data.flat, strict=True))
    else:
        np.testing.assert_array_equal(out, data)


# ------------------------------------------------------------------------------------- string_reverse


@pytest.mark.parametrize("mode", MODES)
def test_string_reverse(http_client: Any, grpc_client: Any, mode: tuple[str, bool, bool]) -> None:
    values = [b"abc", b"", b"racecar!"]
    if mode[2]:  # reversed multi-byte UTF-8 is not UTF-8: only binary outputs can carry it (over HTTP)
        values.append("h\u00e9llo".encode())
    if mode[1] and mode[2]:
        values.append(b"\x00\x01\xff")
    data = np.array(values, dtype=np.object_)
    out = _infer(http_client, grpc_client, mode, "string_reverse", {"INPUT0": (data, "BYTES")}, ["OUTPUT0"])
    assert [_as_bytes(v) for v in out["OUTPUT0"]] == [v[::-1] for v in values]


@pytest.mark.parametrize("mode", MODES)
def test_string_reverse_empty(http_client: Any, grpc_client: Any, mode: tuple[str, bool, bool]) -> None:
    data = np.array([], dtype=np.object_)
    out = _infer(http_client, grpc_client, mode, "string_reverse", {"INPUT0": (data, "BYTES")}, ["OUTPUT0"])
    assert out["OUTPUT0"].shape == (0,)


# --------------------------------------------------------------------------------- errors (clients)


def test_unknown_model_and_version(http_client: Any, grpc_client: Any) -> None:
    i0 = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    i0.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as err:
        http_client.infer("no_such_model", [i0])
    assert err.value.status() == "404"
    assert err.value.message() == "Request for unknown model: 'no_such_model' is not found"

    g0 = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    g0.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer("identity_FP32", [g0], model_version="7")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert err.value.message() == "Request for unknown model: 'identity_FP32' version 7 is not found"


# ------------------------------------------------------------------------- raw HTTP (ground truth)


def _request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _binary_request(dt: str, shape: list[int], raw: bytes, *, binary_out: bool = True) -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": dt,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary_out}}],
        }
    ).encode()
    return header + raw, len(header)


ADD_SUB_ONE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1], "data": [1]},
    ]
}


@pytest.mark.parametrize(
    ("path", "body", "status", "content_type", "error"),
    [
        (
            "/v2/models/nope/infer",
            ADD_SUB_ONE,
            404,
            "text/plain",
            "Request for unknown model: 'nope' is not found",
        ),
        (
            "/v2/models/add_sub/versions/7/infer",
            ADD_SUB_ONE,
            404,
            "text/plain",
            "Request for unknown model: 'add_sub' version 7 is not found",
        ),
        (
            "/v2/models/add_sub/infer",
            b'{"inputs":[',
            500,
            "application/json",
            "failed to parse the request JSON buffer: Invalid value. at 11",
        ),
        (
            "/v2/models/add_sub/infer",
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]},
            400,
            "application/json",
            (
                "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) "
                "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
            ),
        ),
        (
            "/v2/models/add_sub/infer",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]},
                    {"name": "INPUT1", "datatype": "FP32", "shape": [1], "data": [1]},
                ]
            },
            500,
            "text/plain",
            "INPUT0 shape [2] != INPUT1 shape [1]",
        ),
    ],
    ids=["unknown-model", "unknown-version", "malformed-json", "missing-input", "model-error"],
)
def test_raw_http_errors(
    triton: TritonServer, path: str, body: Any, status: int, content_type: str, error: str
) -> None:
    """Note the Content-Type: Triton labels some JSON error bodies text/plain."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    got_status, headers, got_body = _request(triton.http_port, "POST", path, payload)
    assert (got_status, headers["content-type"], json.loads(got_body)) == (
        status,
        content_type,
        {"error": error},
    )


def test_raw_http_unknown_model_metadata(triton: TritonServer) -> None:
    status, headers, body = _request(triton.http_port, "GET", "/v2/models/nope")
    assert (status, headers["content-type"], json.loads(body)) == (
        404,
        "application/json",
        {"error": "Request for unknown model: 'nope' is not found"},
    )
    # Readiness of an unknown model is a 400, not a 404.
    status, _, body = _request(triton.http_port, "GET", "/v2/models/nope/ready")
    assert (status, json.loads(body)) == (400, {"error": "Model version not ready"})


def test_raw_http_header_length_beyond_body(triton: TritonServer) -> None:
    body, _ = _binary_request("FP32", [1, 2], np.array([1, 2], np.float32).tobytes())
    status, headers, got = _request(
        triton.http_port,
        "POST",
        "/v2/models/identity_FP32/infer",
        body,
        {"Inference-Header-Content-Length": str(len(body) + 10)},
    )
    assert (status, headers["content-type"]) == (400, "text/plain")
    assert json.loads(got) == {
        "error": f"inference header size should be in range (0, {len(body)}), got: {len(body) + 10}"
    }


def test_raw_http_binary_output(triton: TritonServer) -> None:
    raw = np.array([[1, 2]], np.float32).tobytes()
    body, header_len = _binary_request("FP32", [1, 2], raw)
    status, headers, got = _request(
        triton.http_port,
        "POST",
        "/v2/models/identity_FP32/infer",
        body,
        {"Inference-Header-Content-Length": str(header_len)},
    )
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    json_len = int(headers["inference-header-content-length"])
    meta = json.loads(got[:json_len])
    assert meta["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert got[json_len:] == raw


@pytest.mark.parametrize("dt", ["FP32", "BYTES"])
def test_raw_http_zero_byte_binary_output(triton: TritonServer, dt: str) -> None:
    """Quirk: when every binary output is 0 bytes Triton answers plain JSON, with no
    Inference-Header-Content-Length, although the output still says binary_data_size 0."""
    body, header_len = _binary_request(dt, [0, 4], b"")
    status, headers, got = _request(
        triton.http_port,
        "POST",
        f"/v2/models/identity_{dt}/infer",
        body,
        {"Inference-Header-Content-Length": str(header_len)},
    )
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    assert json.loads(got)["outputs"] == [
        {"name": "OUTPUT0", "datatype": dt, "shape": [0, 4], "parameters": {"binary_data_size": 0}}
    ]


def test_raw_http_bytes_single_empty_element(triton: TritonServer) -> None:
    # One empty BYTES element is still 4 bytes on the wire (its length prefix), so this one is binary.
    body, header_len = _binary_request("BYTES", [1, 1], struct.pack("<I", 0))
    status, headers, got = _request(
        triton.http_port,
        "POST",
        "/v2/models/identity_BYTES/infer",
        body,
        {"Inference-Header-Content-Length": str(header_len)},
    )
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    json_len = int(headers["inference-header-content-length"])
    assert got[json_len:] == b"\x00\x00\x00\x00"


def test_raw_http_fp16_json_input(triton: TritonServer) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 1], "data": [1]}]}
    status, _, got = _request(
        triton.http_port, "POST", "/v2/models/identity_FP16/infer", json.dumps(body).encode()
    )
    assert (status, json.loads(got)) == (
        400,
        {
            "error": "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0"
        },
    )


@pytest.mark.parametrize("dt", ["FP16", "BF16"])
def test_raw_http_half_float_json_output(triton: TritonServer, dt: str) -> None:
    body, header_len = _binary_request(dt, [1, 1], b"\x00\x3c", binary_out=False)
    status, _, got = _request(
        triton.http_port,
        "POST",
        f"/v2/models/identity_{dt}/infer",
        body,
        {"Inference-Header-Content-Length": str(header_len)},
    )
    assert (status, json.loads(got)) == (
        400,
        {
            "error": f"sending {dt} data via JSON is not supported. Please use the binary data format for output"
        },
    )


def test_raw_http_json_non_finite(triton: TritonServer) -> None:
    """Triton accepts and emits the non-standard JSON tokens Infinity, -Infinity and NaN."""
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,3],"data":[Infinity,-Infinity,NaN]}]}'
    status, _, got = _request(triton.http_port, "POST", "/v2/models/identity_FP32/infer", body)
    assert status == 200
    assert got.endswith(b'"data":[Infinity,-Infinity,NaN]}]}')


def test_raw_http_json_output_raw_bytes(triton: TritonServer) -> None:
    """Triton copies BYTES elements into JSON strings verbatim, so the response body is not valid UTF-8."""
    body, header_len = _binary_request("BYTES", [1, 1], struct.pack("<I", 2) + b"\xff\xfe", binary_out=False)
    status, headers, got = _request(
        triton.http_port,
        "POST",
        "/v2/models/identity_BYTES/infer",
        body,
        {"Inference-Header-Content-Length": str(header_len)},
    )
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert got.endswith(b'"data":["\xff\xfe"]}]}')
