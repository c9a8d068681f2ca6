"""Authentication, authorization and rate limits at the gateway in front of real Triton, with
real clients (tritonclient HTTP with headers, tritonclient gRPC with metadata, raw HTTP):

- no credential → 401 + WWW-Authenticate / UNAUTHENTICATED; a wrong key the same;
- an API key (file or environment) limited to model globs → 200 on its models, 403 /
  PERMISSION_DENIED on others, on both transports and both backend protocols;
- JWTs from a JWKS file: valid, expired, wrong audience, unknown signer, alg none;
  the models claim; the control claim for trace settings;
- health always open, metadata open unless protected, model control / settings need a
  control credential; a public route (auth: false) with a per-model rate limit;
- rate limits → 429 + Retry-After / RESOURCE_EXHAUSTED + retry-after trailer;
- a key rotated by rewriting its file; a ModelStreamInfer message for a forbidden model
  ends the stream with PERMISSION_DENIED;
- keys never in the gateway's log; refusals counted in metrics; Triton alive throughout.
"""
from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import jwt
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography.hazmat.primitives.asymmetric import rsa
from tritonclient.utils import InferenceServerException

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.triton

KEY_ALPHA = "alpha-0123456789abcdef-alpha"
KEY_OPS = "ops-0123456789abcdef-ops-key"
KEY_SLOW = "slow-0123456789abcdef-slowkey"


def make_token(private, claims: dict, kid: str = "k1", alg: str = "RS256") -> str:
    base = {"iss": "test-issuer", "aud": "oip", "exp": int(time.time()) + 600, "sub": "svc-a"}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, private, algorithm=alg,
                      headers={"kid": kid})


@pytest.fixture(scope="module")
def setup(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root: Path = tmp_path_factory.mktemp("auth")
    (root / "alpha.key").write_text(KEY_ALPHA + "\n")
    (root / "slow.key").write_text(KEY_SLOW)
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="k1", alg="RS256", use="sig")
    (root / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    backends = {"h": {"protocol": "http", "endpoints": [triton.http_url]},
                "g": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    routes = [
        {"model": "add_sub", "backend": "h"},
        {"model": "identity_FP32", "backend": "g"},
        {"model": "identity_INT32", "backend": "h", "auth": False, "rate": {"per_s": 0.05, "burst": 3}},
        {"model": "identity_BOOL", "backend": "g"},
        {"model": "string_reverse", "backend": "h"},
    ]
    auth = {
        "keys": [
            {"name": "alpha", "key": {"file": str(root / "alpha.key")}, "models": ["add_sub", "identity_*"]},
            {"name": "ops", "key": {"env": "OIP_TEST_OPS_KEY"}, "control": True},
            {"name": "slow", "key": {"file": str(root / "slow.key")}, "rate": {"per_s": 0.05, "burst": 2}},
        ],
        "jwt": {"jwks_file": str(root / "jwks.json"), "issuer": "test-issuer", "audience": "oip",
                "algorithms": ["RS256"], "models_claim": "models", "control_claim": "oip_control"},
    }
    gw = GatewayProcess(gateway_config(backends, routes, auth=auth), root, "gw-auth",
                        env={"OIP_TEST_OPS_KEY": KEY_OPS})
    protected = GatewayProcess(gateway_config(backends, routes, auth={**auth, "protect_metadata": True}), root,
                               "gw-auth-meta", env={"OIP_TEST_OPS_KEY": KEY_OPS})
    gw.start()
    protected.start()
    try:
        for g in (gw, protected):
            wait_for(lambda g=g: httpclient.InferenceServerClient(g.http_url).is_server_ready(), timeout=60,
                     what="gateway readiness")
        yield {"gw": gw, "protected": protected, "private": private, "root": root}
    finally:
        gw.stop()
        protected.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def http_add_sub(url: str, headers: dict | None, model: str = "add_sub"):
    a = np.arange(4, dtype=np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    with httpclient.InferenceServerClient(url) as c:
        return c.infer(model, inputs, headers=headers).as_numpy("OUTPUT0")


def grpc_identity(url: str, headers: dict | None, model: str = "identity_FP32"):
    dtype, np_type = {"identity_FP32": ("FP32", np.float32), "identity_BOOL": ("BOOL", bool),
                      "identity_INT32": ("INT32", np.int32)}[model]
    i = grpcclient.InferInput("INPUT0", [1, 3], dtype)
    data = np.ones((1, 3), dtype=np_type)
    i.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(url) as c:
        return c.infer(model, [i], headers=headers).as_numpy("OUTPUT0")


def raw(url: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def grpc_code(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def test_no_credential_is_401_on_both_transports(setup):
    gw = setup["gw"]
    status, headers, body = raw(gw.http_url, "POST", "/v2/models/add_sub/infer", {}, b"{}")
    assert status == 401
    assert headers.get("www-authenticate", "").startswith("Bearer")
    assert "credentials required" in orjson.loads(body)["error"]
    with pytest.raises(InferenceServerException) as exc:
        grpc_identity(gw.grpc_url, None)
    assert grpc_code(exc.value) == "UNAUTHENTICATED"
    for bad in ("Bearer " + KEY_ALPHA[:-1], "Basic " + KEY_ALPHA, KEY_ALPHA):
        status, _, _ = raw(gw.http_url, "POST", "/v2/models/add_sub/infer", {"Authorization": bad}, b"{}")
        assert status == 401, bad
        with pytest.raises(InferenceServerException) as exc:
            grpc_identity(gw.grpc_url, {"authorization": bad})
        assert grpc_code(exc.value) == "UNAUTHENTICATED"


def test_api_key_models(setup):
    gw = setup["gw"]
    np.testing.assert_array_equal(http_add_sub(gw.http_url, bearer(KEY_ALPHA)), 2 * np.arange(4))
    np.testing.assert_array_equal(grpc_identity(gw.grpc_url, {"authorization": f"Bearer {KEY_ALPHA}"}),
                                  np.ones((1, 3)))
    # Cross-protocol: a gRPC client on an HTTP backend and the reverse.
    i = grpcclient.InferInput("INPUT0", [2], "FP32")
    i.set_data_from_numpy(np.ones(2, dtype=np.float32))
    j = grpcclient.InferInput("INPUT1", [2], "FP32")
    j.set_data_from_numpy(np.ones(2, dtype=np.float32))
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        out = c.infer("add_sub", [i, j], headers={"authorization": f"Bearer {KEY_ALPHA}"}).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, [2, 2])
    # string_reverse is not among alpha's models.
    status, _, body = raw(gw.http_url, "POST", "/v2/models/string_reverse/infer", bearer(KEY_ALPHA), b"{}")
    assert status == 403 and "may not use model 'string_reverse'" in orjson.loads(body)["error"]
    with pytest.raises(InferenceServerException) as exc:
        with grpcclient.InferenceServerClient(gw.grpc_url) as c:
            c.get_model_config("string_reverse", headers={"authorization": f"Bearer {KEY_ALPHA}"})
            c.infer("string_reverse", [grpcclient.InferInput("INPUT0", [1], "BYTES")],
                    headers={"authorization": f"Bearer {KEY_ALPHA}"})
    assert grpc_code(exc.value) == "PERMISSION_DENIED"
    # ops (an environment variable) may use every model.
    np.testing.assert_array_equal(http_add_sub(gw.http_url, bearer(KEY_OPS)), 2 * np.arange(4))


def test_open_and_protected_metadata(setup):
    gw, protected = setup["gw"], setup["protected"]
    for g in (gw, protected):
        with httpclient.InferenceServerClient(g.http_url) as c:
            assert c.is_server_live() and c.is_server_ready()
        with grpcclient.InferenceServerClient(g.grpc_url) as c:
            assert c.is_server_live() and c.is_server_ready()
    with httpclient.InferenceServerClient(gw.http_url) as c:
        assert c.get_model_metadata("add_sub")["name"] == "add_sub"
        assert c.get_server_metadata()["name"]
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        assert c.get_model_metadata("add_sub").name == "add_sub"
    # protect_metadata: a credential, allowed the model.
    status, _, _ = raw(protected.http_url, "GET", "/v2/models/add_sub")
    assert status == 401
    status, _, _ = raw(protected.http_url, "GET", "/v2")
    assert status == 401
    status, _, _ = raw(protected.http_url, "GET", "/v2/models/string_reverse/config", bearer(KEY_ALPHA))
    assert status == 403
    status, _, body = raw(protected.http_url, "GET", "/v2/models/add_sub/config", bearer(KEY_ALPHA))
    assert status == 200 and orjson.loads(body)["name"] == "add_sub"
    with grpcclient.InferenceServerClient(protected.grpc_url) as c:
        with pytest.raises(InferenceServerException) as exc:
            c.get_model_metadata("add_sub")
        assert grpc_code(exc.value) == "UNAUTHENTICATED"
        assert c.get_model_metadata("add_sub", headers={"authorization": f"Bearer {KEY_ALPHA}"}).name == "add_sub"
        with pytest.raises(InferenceServerException) as exc:
            c.get_model_repository_index()
        assert grpc_code(exc.value) == "UNAUTHENTICATED"


def test_control_needs_a_control_credential(setup):
    gw, private = setup["gw"], setup["private"]
    assert raw(gw.http_url, "GET", "/v2/trace/setting")[0] == 401
    assert raw(gw.http_url, "GET", "/v2/trace/setting", bearer(KEY_ALPHA))[0] == 403
    assert raw(gw.http_url, "GET", "/v2/logging", bearer(KEY_OPS))[0] == 200
    status, _, body = raw(gw.http_url, "POST", "/v2/repository/models/add_sub/unload", bearer(KEY_ALPHA), b"{}")
    assert status == 403 and "model control" in orjson.loads(body)["error"]
    ctl = make_token(private, {"models": ["*"], "oip_control": True})
    assert raw(gw.http_url, "GET", "/v2/models/add_sub/trace/setting", bearer(ctl))[0] == 200
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        with pytest.raises(InferenceServerException) as exc:
            c.get_log_settings(headers={"authorization": f"Bearer {KEY_ALPHA}"})
        assert grpc_code(exc.value) == "PERMISSION_DENIED"
        with pytest.raises(InferenceServerException) as exc:
            c.unload_model("add_sub")
        assert grpc_code(exc.value) == "UNAUTHENTICATED"
        assert c.get_log_settings(headers={"authorization": f"Bearer {KEY_OPS}"}) is not None
    with httpclient.InferenceServerClient(gw.http_url) as c:
        assert c.is_model_ready("add_sub")  # nothing was unloaded


def test_jwt(setup):
    gw, private = setup["gw"], setup["private"]
    good = make_token(private, {"models": ["add_sub", "identity_*"]})
    np.testing.assert_array_equal(http_add_sub(gw.http_url, bearer(good)), 2 * np.arange(4))
    np.testing.assert_array_equal(grpc_identity(gw.grpc_url, {"authorization": f"Bearer {good}"}), np.ones((1, 3)))
    assert raw(gw.http_url, "POST", "/v2/models/string_reverse/infer", bearer(good), b"{}")[0] == 403
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = {
        "expired": make_token(private, {"models": ["*"], "exp": int(time.time()) - 3600}),
        "audience": make_token(private, {"models": ["*"], "aud": "someone-else"}),
        "issuer": make_token(private, {"models": ["*"], "iss": "evil"}),
        "signer": make_token(other, {"models": ["*"]}),
        "alg none": jwt.encode({"models": ["*"], "exp": int(time.time()) + 60, "aud": "oip", "iss": "test-issuer"},
                               None, algorithm="none", headers={"kid": "k1"}),
    }
    for what, token in bad.items():
        status, _, body = raw(gw.http_url, "POST", "/v2/models/add_sub/infer", bearer(token), b"{}")
        assert status == 401, what
        assert "invalid" in orjson.loads(body)["error"], what
        with pytest.raises(InferenceServerException) as exc:
            grpc_identity(gw.grpc_url, {"authorization": f"Bearer {token}"})
        assert grpc_code(exc.value) == "UNAUTHENTICATED", what


def test_public_route_and_rate_limits(setup):
    gw = setup["gw"]
    # identity_INT32: no credential needed; 3 at once, then one per 20 s for everyone together.
    for _ in range(3):
        np.testing.assert_array_equal(grpc_identity(gw.grpc_url, None, "identity_INT32"), np.ones((1, 3)))
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [1]}]})
    status, headers, answer = raw(gw.http_url, "POST", "/v2/models/identity_INT32/infer", {}, body)
    assert status == 429, answer
    assert 1 <= int(headers["retry-after"]) <= 20
    assert "rate limit of model 'identity_INT32'" in orjson.loads(answer)["error"]
    channel = grpc.insecure_channel(gw.grpc_url)
    try:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        from gateway._pb import grpc_predict_v2_pb2 as pb
        req = pb.ModelInferRequest(model_name="identity_INT32")
        with pytest.raises(grpc.RpcError) as err:
            call(req.SerializeToString())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailers = dict(err.value.trailing_metadata() or ())
        assert 1 <= int(trailers["retry-after"]) <= 20
    finally:
        channel.close()
    # A key's own rate: slow may make 2 calls, then 429 — on any model.
    http_add_sub(gw.http_url, bearer(KEY_SLOW))
    grpc_identity(gw.grpc_url, {"authorization": f"Bearer {KEY_SLOW}"})
    status, headers, answer = raw(gw.http_url, "POST", "/v2/models/add_sub/infer", bearer(KEY_SLOW), b"{}")
    assert status == 429 and "key:slow" in orjson.loads(answer)["error"] and int(headers["retry-after"]) >= 1
    # Others are not slowed by it.
    http_add_sub(gw.http_url, bearer(KEY_ALPHA))


def test_stream_message_for_a_forbidden_model_ends_the_stream(setup):
    gw = setup["gw"]
    results: list = []
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.append((result, error)),
                       headers={"authorization": f"Bearer {KEY_ALPHA}"})
        i = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        i.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
        c.async_stream_infer("identity_FP32", [i])
        wait_for(lambda: len(results) >= 1, timeout=30, what="first stream answer")
        s = grpcclient.InferInput("INPUT0", [1], "BYTES")
        s.set_data_from_numpy(np.array([b"abc"], dtype=object))
        c.async_stream_infer("string_reverse", [s])
        wait_for(lambda: len(results) >= 2, timeout=30, what="the stream's end")
        c.stop_stream()
    assert results[0][1] is None
    assert results[1][1] is not None and "PERMISSION_DENIED" in str(results[1][1].status())


def test_key_rotation_by_file(setup):
    gw, root = setup["gw"], setup["root"]
    new = "alpha-rotated-0123456789abcdef"
    path = root / "alpha.key"
    tmp = root / "alpha.key.new"
    tmp.write_text(new)
    tmp.replace(path)  # an atomic swap, as a Secret update is
    wait_for(lambda: raw(gw.http_url, "POST", "/v2/models/add_sub/infer", bearer(KEY_ALPHA), b"{}")[0] == 401,
             timeout=10, what="old key refused")
    np.testing.assert_array_equal(http_add_sub(gw.http_url, bearer(new)), 2 * np.arange(4))


def test_keys_never_logged_refusals_counted(setup, triton):
    gw = setup["gw"]
    raw(gw.http_url, "POST", "/v2/models/add_sub/infer", {"Authorization": "Bearer " + KEY_OPS + "x"}, b"{}")
    log = gw.log_tail(100_000)
    for key in (KEY_ALPHA, KEY_OPS, KEY_SLOW):
        assert key not in log
    text = urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=10).read().decode()
    for reason in ("unauthenticated", "permission_denied", "rate_limited"):
        assert any(line.startswith("oip_gateway_refusals_total") and f'reason="{reason}"' in line
                   and not line.endswith(" 0.0") for line in text.splitlines()), reason
    assert KEY_OPS not in text
    with httpclient.InferenceServerClient(triton.http_url) as c:
        assert c.is_server_live()


def test_first_generation_api_is_guarded_too(setup):
    """/api/... (HTTP) and nvidia.inferenceserver.GRPCService pass the same guard."""
    from gateway._pb import legacy_v1_pb2 as v1

    gw = setup["gw"]
    only_add_sub = make_token(setup["private"], {"models": ["add_sub"]})
    assert raw(gw.http_url, "GET", "/api/health/live")[0] == 200  # health stays open
    status, headers, _ = raw(gw.http_url, "POST", "/api/infer/add_sub", {"NV-InferRequest": "batch_size: 1"}, b"")
    assert status == 401 and headers.get("www-authenticate", "").startswith("Bearer")
    status, _, _ = raw(gw.http_url, "POST", "/api/infer/string_reverse",
                       {"NV-InferRequest": "batch_size: 1", **bearer(only_add_sub)}, b"")
    assert status == 403
    channel = grpc.insecure_channel(gw.grpc_url)
    try:
        infer = channel.unary_unary("/nvidia.inferenceserver.GRPCService/Infer",
                                    request_serializer=v1.InferRequest.SerializeToString,
                                    response_deserializer=v1.InferResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            infer(v1.InferRequest(model_name="add_sub"))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            infer(v1.InferRequest(model_name="string_reverse"), metadata=(("authorization", f"Bearer {only_add_sub}"),))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        health = channel.unary_unary("/nvidia.inferenceserver.GRPCService/Health",
                                     request_serializer=v1.HealthRequest.SerializeToString,
                                     response_deserializer=v1.HealthResponse.FromString)
        assert health(v1.HealthRequest(mode="live")).health
    finally:
        channel.close()


def test_auth_follows_a_reload(setup):
    """A key added to the config and a route made public take effect at SIGHUP; the gateway
    keeps serving through it."""
    import signal

    import yaml

    gw = setup["protected"]
    cfg = yaml.safe_load(gw.config_path.read_text())
    added = "added-0123456789abcdef-added"
    cfg["auth"]["keys"].append({"name": "added", "key": {"file": str(setup["root"] / "added.key")},
                                "models": ["add_sub"]})
    (setup["root"] / "added.key").write_text(added)
    cfg["routes"][4]["auth"] = False  # string_reverse becomes public
    assert raw(gw.http_url, "POST", "/v2/models/add_sub/infer", bearer(added), b"{}")[0] == 401
    gw.config_path.write_text(yaml.safe_dump(cfg))
    gw.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: raw(gw.http_url, "GET", "/v2/models/add_sub", bearer(added))[0] == 200, timeout=15,
             what="the added key accepted")
    np.testing.assert_array_equal(http_add_sub(gw.http_url, bearer(added)), 2 * np.arange(4))
    s = httpclient.InferInput("INPUT0", [1], "BYTES")
    s.set_data_from_numpy(np.array([b"abc"], dtype=object))
    with httpclient.InferenceServerClient(gw.http_url) as c:
        assert c.infer("string_reverse", [s]).as_numpy("OUTPUT0")[0] == b"cba"
