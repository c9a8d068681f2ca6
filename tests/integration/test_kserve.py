"""KServe as a third real backend, and KServe's own clients, through the gateway (issue 36).

KServe's ModelServer (PyPI ``kserve``, pinned in tests/support/kserve-requirements.txt) runs from
its own venv with the models of tests/models/kserve, on 127.0.0.1 (tests/support/kserve.py).
Gateways put an HTTP backend and a gRPC backend in front of it, and in front of Triton. KServe's
``InferenceRESTClient`` and ``InferenceGRPCClient`` (driven in .kserve-venv through
tests/support/kserve_client.py: kserve and tritonclient cannot share a process) send each
request through the gateway and straight to the server; the answers must agree: success or the
same error class (HTTP status / gRPC code), outputs by value, datatype and shape, the answer's
form over gRPC (typed or raw), id and parameters.

What a user of KServe meets (verified here, see the ``test_kserve_*_differences`` tests):

- KServe's REST side answers 501 "Model versioning not supported yet." to every versioned URL
  (``/v2/models/{m}/versions/{v}/...``); its gRPC side ignores ``model_version``.
- KServe's gRPC side refuses messages over 8 MiB (``--grpc_max_receive_message_length``,
  default 8388608) with RESOURCE_EXHAUSTED; its REST side has no such limit.
- KServe's REST answers carry ``"model_version": null`` (and its model metadata
  ``"versions": null``).
- FP16 cannot travel in JSON: KServe refuses it in both directions (400), over REST it needs the
  binary-data extension; KServe has no BF16.
- KServe's REST client sends an empty tensor set for binary as ``"data": null`` with
  ``binary_data_size: 0``, which KServe's own server refuses (422).
- KServe's health answers have bodies (``{"live": true}`` ...), which its REST client reads;
  Triton answers with an empty body, which KServe's REST client cannot read.
"""
from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import start_gateway
from tests.support.kserve import (
    DATATYPES,
    MODELS,
    KServeClients,
    KServeProcess,
    decode_array,
    encode_array,
    kserve_available,
)

pytestmark = pytest.mark.kserve

TRANSPORTS = ["rest", "grpc"]
BACKENDS = ["http", "grpc"]


def _unavailable(what: str, reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} must run in CI: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeProcess]:
    """One real KServe ModelServer (tests/models/kserve, its own venv) for this module."""
    reason = kserve_available()
    if reason is not None:
        _unavailable("KServe", reason)
    with KServeProcess(workdir=tmp_path_factory.mktemp("kserve")) as server:
        yield server


@pytest.fixture(scope="module")
def kclients() -> Iterator[KServeClients]:
    reason = kserve_available()
    if reason is not None:
        _unavailable("KServe", reason)
    with KServeClients() as clients:
        yield clients


@pytest.fixture(scope="module")
def kgws(kserve: KServeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gateway per backend protocol in front of KServe (server_family: auto reads "kserve")."""
    out = {}
    try:
        for backend in BACKENDS:
            out[backend] = start_gateway(tmp_path_factory.mktemp(f"gw-kserve-{backend}"), kserve.http_url,
                                         kserve.grpc_url, backend, models=MODELS)
        yield out
    finally:
        for g in out.values():
            g.stop()


@pytest.fixture(scope="module")
def tgws(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gateway per backend protocol in front of Triton."""
    models = [f"identity_{dt}" for dt in DATATYPES] + ["add_sub"]
    out = {}
    try:
        for backend in BACKENDS:
            out[backend] = start_gateway(tmp_path_factory.mktemp(f"gw-triton-k-{backend}"), triton.http_url,
                                         triton.grpc_url, backend, models=models)
        yield out
    finally:
        for g in out.values():
            g.stop()


# --- helpers ---------------------------------------------------------------------------------


def url_of(server: Any, transport: str) -> str:
    return server.http_url if transport == "rest" else server.grpc_url


def sample(datatype: str, shape: tuple[int, ...] = (2, 3), seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype == "BYTES":
        n = int(np.prod(shape))
        out = np.empty(n, dtype=object)
        out[:] = [f"w{i}é".encode() for i in range(n)]
        return out.reshape(shape)
    if datatype.startswith("FP"):
        return rng.standard_normal(shape).astype(np.dtype(f"float{datatype[2:]}"))
    dt = np.dtype(datatype.lower())
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool, parameters: dict | None = None) -> dict:
    spec = {"name": name, "datatype": datatype, "array": encode_array(array), "binary": binary}
    if parameters:
        spec["parameters"] = parameters
    return spec


def infer(clients: KServeClients, transport: str, url: str, model: str, inputs: list[dict], **kw: Any) -> dict:
    return clients.call("infer", transport=transport, url=url, model=model, inputs=inputs, **kw)


def _transport_free(parameters: dict | None) -> dict:
    # binary_data_size says how an output travelled (KServe writes it on raw gRPC outputs too), not what it is
    return {k: v for k, v in (parameters or {}).items() if k != "binary_data_size"}


def outputs_of(answer: dict) -> dict[str, dict]:
    got = {}
    for o in answer["outputs"]:
        arr = decode_array(o["array"])
        got[o["name"]] = {
            "datatype": o["datatype"],
            "shape": o["shape"],
            "form": o["form"],
            "parameters": _transport_free(o["parameters"]),
            "values": arr.ravel().tolist() if arr.dtype == object else (arr.dtype.str, arr.tobytes()),
        }
    return got


def error_class(answer: dict) -> tuple[str, Any]:
    return answer["error"], answer["status"]


def assert_same(direct: dict, via: dict, *, compare_id: bool = True) -> None:
    """The gateway's answer is the server's answer: same success or error class, same outputs."""
    if not direct["ok"]:
        assert not via["ok"], f"direct failed ({direct}) but through the gateway: {via}"
        assert error_class(via) == error_class(direct), (direct, via)
        return
    assert via["ok"], f"through the gateway: {via}"
    assert via["model_name"] == direct["model_name"]
    if compare_id:
        assert via["id"] == direct["id"]
    assert _transport_free(via["parameters"]) == _transport_free(direct["parameters"])
    assert outputs_of(via) == outputs_of(direct)


def forms(datatype: str, transport: str) -> list[bool]:
    # FP16: KServe refuses it in JSON and its gRPC client has no typed field for it.
    return [True] if datatype == "FP16" else [True, False]


def wanted_outputs(transport: str, binary: bool, names: list[str]) -> list[dict] | None:
    # A REST client that sends binary asks for binary outputs too (FP16 cannot come back in JSON).
    if transport == "rest" and binary:
        return [{"name": n, "binary": True} for n in names]
    return None


# --- KServe behind the gateway -----------------------------------------------------------------


def test_kserve_serves_the_harness_models_on_loopback(kserve):
    """The harness' model list is what KServe serves, and it listens on loopback only."""
    from tests.support.kserve import listening_addresses

    conn = http.client.HTTPConnection("127.0.0.1", kserve.http_port, timeout=10)
    conn.request("GET", "/v2/models")
    listed = json.loads(conn.getresponse().read())["models"]
    conn.close()
    assert sorted(listed) == sorted(MODELS)
    addresses = listening_addresses(kserve.pid)
    assert sorted(p for _, p in addresses) == sorted([kserve.http_port, kserve.grpc_port])
    assert all(a in ("0100007F", "0000000000000000FFFF00000100007F") for a, _ in addresses), addresses


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_each_datatype(kserve, kgws, kclients, datatype, transport, backend):
    """Every datatype KServe supports, in each form the client can send it (REST: binary
    extension and JSON; gRPC: raw and typed contents), through each backend: the answer KServe
    gives directly — by value, datatype, shape, and over gRPC typed for typed, raw for raw."""
    arr = sample(datatype)
    for binary in forms(datatype, transport):
        kw = {"id": f"id-{datatype}-{binary}", "outputs": wanted_outputs(transport, binary, ["OUTPUT0"])}
        ins = [tensor("INPUT0", arr, datatype, binary)]
        direct = infer(kclients, transport, url_of(kserve, transport), f"identity_{datatype}", ins, **kw)
        via = infer(kclients, transport, url_of(kgws[backend], transport), f"identity_{datatype}", ins, **kw)
        assert direct["ok"], direct
        assert_same(direct, via)
        got = decode_array(via["outputs"][0]["array"])
        if datatype == "BYTES":
            assert got.ravel().tolist() == arr.ravel().tolist()
        else:
            assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes()
        if transport == "grpc":
            assert via["outputs"][0]["form"] == ("raw" if binary else "typed")


EMPTY = [("FP32", (0, 3)), ("INT64", (2, 0)), ("BYTES", (0, 3)), ("BOOL", (2, 0))]


def _empty(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=object) if datatype == "BYTES" else np.zeros(shape, dtype=sample(datatype).dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("datatype, shape", EMPTY)
def test_empty_tensors(kserve, kgws, kclients, datatype, shape, transport, backend):
    """Empty tensors (REST: JSON ``data: []``; gRPC: raw and typed) come back empty, with their
    shape and datatype, as KServe answers them directly. (KServe's REST client sends an empty
    *binary* tensor as ``data: null``, which KServe itself refuses: test_kserve_empty_binary...)"""
    arr = _empty(datatype, shape)
    for binary in ([True, False] if transport == "grpc" else [False]):
        ins = [tensor("INPUT0", arr, datatype, binary)]
        direct = infer(kclients, transport, url_of(kserve, transport), f"identity_{datatype}", ins, id="empty")
        via = infer(kclients, transport, url_of(kgws[backend], transport), f"identity_{datatype}", ins, id="empty")
        assert direct["ok"], direct
        assert_same(direct, via)
        assert via["outputs"][0]["shape"] == list(shape) and via["outputs"][0]["datatype"] == datatype


def test_kserve_empty_binary_tensor_from_its_rest_client_differences(kserve, kgws, kclients):
    """KServe's REST client writes an empty tensor set for binary as ``"data": null`` plus
    ``binary_data_size: 0``; KServe's server refuses that with 422. Through the HTTP backend the
    gateway relays the request and the refusal unchanged."""
    ins = [tensor("INPUT0", np.zeros((0, 3), np.float32), "FP32", True)]
    direct = infer(kclients, "rest", kserve.http_url, "identity_FP32", ins)
    assert error_class(direct) == ("HTTPStatusError", 422), direct
    via = infer(kclients, "rest", kgws["http"].http_url, "identity_FP32", ins)
    assert error_class(via) == ("HTTPStatusError", 422), via


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_large_tensor(kserve, kgws, kclients, transport, backend):
    """A 6 MiB FP32 tensor (binary / raw; under KServe's 8 MiB gRPC default) both ways."""
    arr = np.arange(6 * 1024 * 1024 // 4, dtype=np.float32).reshape(1024, -1)
    ins = [tensor("INPUT0", arr, "FP32", True)]
    kw = {"id": "large", "outputs": wanted_outputs(transport, True, ["OUTPUT0"])}
    direct = infer(kclients, transport, url_of(kserve, transport), "identity_FP32", ins, **kw)
    via = infer(kclients, transport, url_of(kgws[backend], transport), "identity_FP32", ins, **kw)
    assert direct["ok"], direct
    assert_same(direct, via)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_add_sub_ids_and_parameters(kserve, kgws, kclients, transport, backend):
    """Request id, request parameters (string, bool, int) and tensor parameters reach the model
    and come back (echo_params), and a two-input model answers as directly."""
    x = np.arange(5, dtype=np.int32)
    ins = [tensor("INPUT0", x, "INT32", False, {"unit": "m", "scale": 3, "exact": True})]
    params = {"tenant": "t-1", "priority": 2, "trace": False}
    direct = infer(kclients, transport, url_of(kserve, transport), "echo_params", ins, id="req-42", parameters=params)
    via = infer(kclients, transport, url_of(kgws[backend], transport), "echo_params", ins, id="req-42",
                parameters=params)
    assert direct["ok"], direct
    assert_same(direct, via)
    assert via["id"] == "req-42"
    assert via["parameters"] == params
    assert _transport_free(via["outputs"][0]["parameters"]) == {"unit": "m", "scale": 3, "exact": True}

    a, b = np.arange(8, dtype=np.float32), np.full(8, 0.5, dtype=np.float32)
    ins = [tensor("INPUT0", a, "FP32", False), tensor("INPUT1", b, "FP32", False)]
    direct = infer(kclients, transport, url_of(kserve, transport), "add_sub", ins, id="as-1")
    via = infer(kclients, transport, url_of(kgws[backend], transport), "add_sub", ins, id="as-1")
    assert_same(direct, via)
    outs = {o["name"]: decode_array(o["array"]) for o in via["outputs"]}
    np.testing.assert_array_equal(outs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outs["OUTPUT1"], a - b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("model, rest_status, grpc_code", [
    ("fail", 400, "INVALID_ARGUMENT"),  # the model raised InvalidInput
    ("crash", 500, "INTERNAL"),  # the model raised RuntimeError
    ("no_such_model", 404, "NOT_FOUND"),
])
def test_model_errors(kserve, kgws, kclients, transport, backend, model, rest_status, grpc_code):
    """A model's error reaches the client in its protocol's class, as KServe answers directly."""
    ins = [tensor("INPUT0", np.ones(3, np.float32), "FP32", False)]
    direct = infer(kclients, transport, url_of(kserve, transport), model, ins)
    via = infer(kclients, transport, url_of(kgws[backend], transport), model, ins)
    assert error_class(direct) == (("HTTPStatusError", rest_status) if transport == "rest"
                                   else ("AioRpcError", grpc_code)), direct
    assert_same(direct, via)
    if model == "fail":  # the model's own words survive the conversion
        assert "fail: this model refuses every request" in via["message"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_health(kserve, kgws, kclients, transport, backend):
    """KServe's clients read the gateway's server live / ready and model ready as KServe's."""
    for server in (kserve, kgws[backend]):
        url = url_of(server, transport)
        assert kclients.call("server_live", transport=transport, url=url) == {"ok": True, "value": True}
        assert kclients.call("server_ready", transport=transport, url=url) == {"ok": True, "value": True}
        for model in ("add_sub", "identity_BYTES"):
            assert kclients.call("model_ready", transport=transport, url=url, model=model) == {"ok": True, "value": True}
    direct = kclients.call("model_ready", transport=transport, url=url_of(kserve, transport), model="no_such_model")
    via = kclients.call("model_ready", transport=transport, url=url_of(kgws[backend], transport), model="no_such_model")
    if transport == "rest":  # KServe's REST client: any non-2xx answer is "not ready"
        assert direct == via == {"ok": True, "value": False}
    else:
        assert error_class(direct) == ("AioRpcError", "NOT_FOUND")
        if backend == "grpc":
            assert error_class(via) == ("AioRpcError", "NOT_FOUND"), via
        else:  # KServe's REST 404 reaches the gateway as "not ready" (V2: 4xx = not ready)
            assert via == {"ok": True, "value": False} or error_class(via) == ("AioRpcError", "NOT_FOUND"), via


def _get(url: str, path: str) -> tuple[int, Any]:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, (json.loads(body) if body else None)
    finally:
        conn.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_health_bodies_and_metadata(kserve, kgws, backend):
    """The gateway's health answers carry KServe's bodies; model metadata through either backend
    (HTTP and gRPC clients, tritonclient) is KServe's."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    gw = kgws[backend]
    assert _get(gw.http_url, "/v2/health/live") == (200, {"live": True})
    assert _get(gw.http_url, "/v2/health/ready") == (200, {"ready": True})
    assert _get(gw.http_url, "/v2/models/add_sub/ready") == (200, {"name": "add_sub", "ready": True})
    assert _get(kserve.http_url, "/v2/models/add_sub/ready") == (200, {"name": "add_sub", "ready": True})

    status, direct = _get(kserve.http_url, "/v2/models/add_sub")
    assert status == 200 and direct["versions"] is None  # KServe's own answer

    def shape(meta: dict) -> tuple:
        return (meta["name"], meta.get("platform", ""),
                [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]],
                [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]])

    with httpclient.InferenceServerClient(gw.http_url) as c:
        via_http = c.get_model_metadata("add_sub")
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        via_grpc = c.get_model_metadata("add_sub", as_json=True)
    with grpcclient.InferenceServerClient(kserve.grpc_url) as c:
        direct_grpc = c.get_model_metadata("add_sub", as_json=True)
    assert shape(via_http) == shape(direct)
    assert shape(via_grpc) == shape(direct_grpc) == shape(direct)


def test_kserve_versions_and_message_limit_differences(kserve, kgws, kclients):
    """What a user of KServe meets, verified on the server and through the gateway:
    its REST side answers 501 to every versioned URL (relayed as is by an HTTP backend, as
    UNIMPLEMENTED to a gRPC client; a versioned model-ready is the gateway's "not ready"); its
    gRPC side ignores model_version (so a gRPC backend serves versioned URLs); and its gRPC side
    refuses a message over 8 MiB with RESOURCE_EXHAUSTED, also when a gRPC backend carries it,
    while its REST side (and so an HTTP backend) takes it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    unsupported = (501, {"error": "Model versioning not supported yet."})
    for path in ("/v2/models/add_sub/versions/1", "/v2/models/add_sub/versions/1/ready"):
        assert _get(kserve.http_url, path) == unsupported
    # Through an HTTP backend: metadata relayed as is; readiness is the gateway's "not ready" answer.
    assert _get(kgws["http"].http_url, "/v2/models/add_sub/versions/1") == unsupported
    status, body = _get(kgws["http"].http_url, "/v2/models/add_sub/versions/1/ready")
    assert status >= 400 and body.get("ready") is False, (status, body)
    # Through a gRPC backend the version reaches KServe's gRPC side, which ignores it.
    assert _get(kgws["grpc"].http_url, "/v2/models/add_sub/versions/1/ready") == (200, {"name": "add_sub", "ready": True})

    a = np.ones((1, 4), np.float32)

    def triton_grpc_infer(url: str, version: str) -> np.ndarray:
        with grpcclient.InferenceServerClient(url) as c:
            i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            i.set_data_from_numpy(a)
            return c.infer("identity_FP32", [i], model_version=version).as_numpy("OUTPUT0")

    np.testing.assert_array_equal(triton_grpc_infer(kserve.grpc_url, "1"), a)  # version ignored
    with pytest.raises(InferenceServerException) as info:
        triton_grpc_infer(kgws["http"].grpc_url, "1")
    assert "UNIMPLEMENTED" in str(info.value) or "versioning" in str(info.value), str(info.value)

    big = np.zeros((1, 9 * 1024 * 1024 // 4), np.float32)  # 9 MiB
    ins = [tensor("INPUT0", big, "FP32", True)]
    direct = infer(kclients, "grpc", kserve.grpc_url, "identity_FP32", ins)
    assert error_class(direct) == ("AioRpcError", "RESOURCE_EXHAUSTED"), direct
    via = infer(kclients, "grpc", kgws["grpc"].grpc_url, "identity_FP32", ins)
    assert error_class(via) == ("AioRpcError", "RESOURCE_EXHAUSTED"), via
    outs = [{"name": "OUTPUT0", "binary": True}]
    assert infer(kclients, "rest", kserve.http_url, "identity_FP32", ins, outputs=outs)["ok"]
    via_http_backend = infer(kclients, "grpc", kgws["http"].grpc_url, "identity_FP32", ins)
    assert via_http_backend["ok"], via_http_backend
    assert decode_array(via_http_backend["outputs"][0]["array"]).tobytes() == big.tobytes()


# --- KServe's clients in front of Triton -------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_kserve_clients_through_gateway_to_triton(triton, tgws, kclients, transport, backend):
    """KServe's clients against the gateway in front of Triton, compared with the same client
    straight to Triton: every datatype both support, each form, empty and large tensors, ids,
    parameters and errors."""
    direct_url, via_url = url_of(triton, transport), url_of(tgws[backend], transport)

    def both(model: str, ins: list[dict], **kw: Any) -> tuple[dict, dict]:
        return (infer(kclients, transport, direct_url, model, ins, **kw),
                infer(kclients, transport, via_url, model, ins, **kw))

    for datatype in DATATYPES:
        arr = sample(datatype, seed=11)
        for binary in forms(datatype, transport):
            ins = [tensor("INPUT0", arr, datatype, binary)]
            kw = {"id": f"t-{datatype}-{binary}", "outputs": wanted_outputs(transport, binary, ["OUTPUT0"])}
            direct, via = both(f"identity_{datatype}", ins, **kw)
            assert direct["ok"], (datatype, binary, direct)
            assert_same(direct, via)
            if transport == "grpc":  # Triton answers raw, typed requests too
                assert via["outputs"][0]["form"] == "raw"

    for datatype, shape in EMPTY:
        for binary in ([True, False] if transport == "grpc" else [False]):
            direct, via = both(f"identity_{datatype}", [tensor("INPUT0", _empty(datatype, shape), datatype, binary)],
                               id="t-empty")
            assert direct["ok"], (datatype, binary, direct)
            assert_same(direct, via)

    large = np.arange(6 * 1024 * 1024 // 4, dtype=np.float32).reshape(1024, -1)
    direct, via = both("identity_FP32", [tensor("INPUT0", large, "FP32", True)], id="t-large",
                       outputs=wanted_outputs(transport, True, ["OUTPUT0"]))
    assert direct["ok"], direct
    assert_same(direct, via)

    a, b = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    direct, via = both("add_sub", [tensor("INPUT0", a, "FP32", False), tensor("INPUT1", b, "FP32", False)],
                       id="t-params", parameters={"tenant": "t-1", "priority": 2})
    assert direct["ok"], direct
    assert_same(direct, via)

    # Errors: an unknown model; a datatype the model does not take.
    for model, ins in (("no_such_model", [tensor("INPUT0", a, "FP32", False)]),
                       ("identity_INT32", [tensor("INPUT0", a.reshape(1, 4), "FP32", False)])):
        direct, via = both(model, ins)
        assert not direct["ok"], direct
        assert_same(direct, via)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_kserve_clients_health_through_gateway_to_triton(triton, tgws, kclients, transport, backend):
    """KServe's health calls through the gateway in front of Triton. Straight to Triton,
    KServe's REST client cannot read server live / ready (Triton answers with an empty body);
    through the gateway (which answers with KServe's bodies) it can."""
    url = url_of(tgws[backend], transport)
    assert kclients.call("server_live", transport=transport, url=url) == {"ok": True, "value": True}
    assert kclients.call("server_ready", transport=transport, url=url) == {"ok": True, "value": True}
    assert kclients.call("model_ready", transport=transport, url=url, model="add_sub") == {"ok": True, "value": True}
    direct = kclients.call("server_live", transport=transport, url=url_of(triton, transport))
    if transport == "rest":
        assert not direct["ok"] and direct["error"] == "JSONDecodeError", direct
    else:
        assert direct == {"ok": True, "value": True}
