"""The guard below the network: config parsing of auth / rate / limits, API keys (constant-time
compare, rotation by file), JWT verification (issuer, audience, expiry, algorithms, kid, the
models claim), token buckets and the decisions per kind of call."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.config.loader import parse_config
from gateway.config.parsing import Problems
from gateway.config.security import Rate, parse_auth
from gateway.errors import ConfigError, PermissionDenied, RateLimited, Unauthenticated
from gateway.routing.table import RouteTable
from gateway.security.bucket import Buckets, TokenBucket, retry_after
from gateway.security.credentials import bearer
from gateway.security.guard import CONTROL, INFER, METADATA, OPEN, Guard, guard_for

KEY_A = "alpha-key-0123456789abcdef"
KEY_OPS = "ops-key-0123456789abcdef-ops"


def rsa_jwks(tmp: Path, kid: str = "k1") -> tuple[object, Path]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid=kid, alg="RS256", use="sig")
    path = tmp / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    return private, path


def token(private, claims: dict, kid: str = "k1", alg: str = "RS256") -> str:
    base = {"iss": "issuer", "aud": "oip", "exp": int(time.time()) + 300, "sub": "svc"}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, private, algorithm=alg,
                      headers={"kid": kid})


def config(tmp: Path, jwks: Path | None = None, **auth_extra) -> dict:
    (tmp / "alpha").write_text(KEY_A + "\n")
    os.environ["OIP_TEST_OPS_KEY"] = KEY_OPS
    auth: dict = {"keys": [
        {"name": "alpha", "key": {"file": str(tmp / "alpha")}, "models": ["add_sub", "identity_*"],
         "rate": {"per_s": 0.01, "burst": 2}},
        {"name": "ops", "key": {"env": "OIP_TEST_OPS_KEY"}, "control": True},
    ]}
    if jwks is not None:
        auth["jwt"] = {"jwks_file": str(jwks), "issuer": "issuer", "audience": "oip", "algorithms": ["RS256"],
                       "models_claim": "models", "control_claim": "ctl"}
    auth.update(auth_extra)
    return {
        "backends": {"b": {"protocol": "http", "endpoints": ["127.0.0.1:1"]}},
        "routes": [
            {"model": "add_sub", "backend": "b"},
            {"model": "public", "backend": "b", "auth": False, "rate": {"per_s": 0.01, "burst": 1}},
            {"model": "identity_*", "backend": "b"},
            {"model": "other", "backend": "b"},
        ],
        "auth": auth,
    }


def guard(cfg: dict) -> Guard:
    parsed = parse_config(cfg)
    g = guard_for(parsed, RouteTable(parsed.routes))
    assert g is not None
    return g


def test_no_auth_no_rate_means_no_guard():
    parsed = parse_config({"backends": {"b": {"protocol": "http", "endpoints": ["127.0.0.1:1"]}},
                           "routes": [{"model": "m", "backend": "b"}]})
    assert guard_for(parsed, RouteTable(parsed.routes)) is None


def test_bearer_parsing():
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer   abc ") == "abc"
    for bad in (None, "Basic abc", "Bearer", "abc"):
        with pytest.raises(Unauthenticated):
            bearer(bad)


def test_keys_and_models(tmp_path):
    g = guard(config(tmp_path))
    with pytest.raises(Unauthenticated, match="credentials required"):
        g.admit(INFER, "add_sub", "", None)
    with pytest.raises(Unauthenticated, match="invalid credential"):
        g.admit(INFER, "add_sub", "", "Bearer " + KEY_A + "x")
    assert g.admit(INFER, "add_sub", "", "Bearer " + KEY_A) == "key:alpha"
    assert g.admit(INFER, "identity_FP32", "", "Bearer " + KEY_OPS) == "key:ops"
    with pytest.raises(PermissionDenied, match="may not use model 'other'"):
        g.admit(INFER, "other", "", "Bearer " + KEY_A)
    # An unrouted model still needs a credential (no hint which names exist).
    with pytest.raises(Unauthenticated):
        g.admit(INFER, "nope", "", None)
    # Health is open; metadata open unless protected; control needs a control key.
    assert g.admit(OPEN, "", "", None) is None
    assert g.admit(METADATA, "other", "", None) is None
    with pytest.raises(Unauthenticated):
        g.admit(CONTROL, "", "", None)
    with pytest.raises(PermissionDenied, match="model control"):
        g.admit(CONTROL, "add_sub", "", "Bearer " + KEY_A)
    assert g.admit(CONTROL, "other", "", "Bearer " + KEY_OPS) == "key:ops"


def test_protect_metadata(tmp_path):
    g = guard(config(tmp_path, protect_metadata=True))
    with pytest.raises(Unauthenticated):
        g.admit(METADATA, "", "", None)
    with pytest.raises(PermissionDenied):
        g.admit(METADATA, "other", "", "Bearer " + KEY_A)
    assert g.admit(METADATA, "add_sub", "", "Bearer " + KEY_A) == "key:alpha"


def test_rates_and_public_route(tmp_path):
    g = guard(config(tmp_path))
    # The public route needs no credential; its per-model bucket holds one request.
    assert g.admit(INFER, "public", "", None) is None
    with pytest.raises(RateLimited) as exc:
        g.admit(INFER, "public", "", None)
    assert exc.value.http_status == 429 and exc.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert 1 <= exc.value.retry_after <= 100
    # alpha's own bucket: 2 at once, then refused — on any model.
    g.admit(INFER, "add_sub", "", "Bearer " + KEY_A)
    g.admit(INFER, "identity_FP32", "", "Bearer " + KEY_A)
    with pytest.raises(RateLimited, match="key:alpha"):
        g.admit(INFER, "add_sub", "", "Bearer " + KEY_A)
    # ops has no rate of its own.
    for _ in range(5):
        g.admit(INFER, "add_sub", "", "Bearer " + KEY_OPS)
    # A reload keeps the buckets (no fresh burst).
    parsed = parse_config(config(tmp_path))
    g2 = guard_for(parsed, RouteTable(parsed.routes), g)
    assert g2 is not None
    with pytest.raises(RateLimited):
        g2.admit(INFER, "add_sub", "", "Bearer " + KEY_A)


def test_refused_rate_takes_no_token(tmp_path):
    """A request the route's bucket refuses does not spend the caller's token."""
    cfg = config(tmp_path)
    cfg["routes"][0]["rate"] = {"per_s": 0.01, "burst": 1}
    g = guard(cfg)
    g.admit(INFER, "add_sub", "", "Bearer " + KEY_A)
    with pytest.raises(RateLimited, match="model 'add_sub'"):
        g.admit(INFER, "add_sub", "", "Bearer " + KEY_A)
    g.admit(INFER, "identity_FP32", "", "Bearer " + KEY_A)  # alpha's second token is still there


def test_key_file_rotation(tmp_path):
    g = guard(config(tmp_path))
    g.admit(METADATA, "", "", None)
    new = "alpha-rotated-0123456789abcdef"
    (tmp_path / "alpha").write_text(new)
    os.utime(tmp_path / "alpha", ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    g.keys._checked -= 5  # the once-a-second recheck is due
    assert g.admit(INFER, "add_sub", "", "Bearer " + new) == "key:alpha"
    with pytest.raises(Unauthenticated):
        g.admit(INFER, "add_sub", "", "Bearer " + KEY_A)


def test_jwt(tmp_path):
    private, jwks = rsa_jwks(tmp_path)
    g = guard(config(tmp_path, jwks))
    ok = token(private, {"models": ["add_sub"]})
    assert g.admit(INFER, "add_sub", "", "Bearer " + ok) == "jwt:svc"
    assert g.admit(INFER, "add_sub", "", "Bearer " + token(private, {"models": "identity_* add_sub"})) == "jwt:svc"
    with pytest.raises(PermissionDenied):
        g.admit(INFER, "other", "", "Bearer " + ok)
    with pytest.raises(PermissionDenied):  # no models claim: no model
        g.admit(INFER, "add_sub", "", "Bearer " + token(private, {}))
    with pytest.raises(PermissionDenied):
        g.admit(CONTROL, "", "", "Bearer " + ok)
    assert g.admit(CONTROL, "", "", "Bearer " + token(private, {"models": ["*"], "ctl": True})) == "jwt:svc"
    bad = {
        "expired": token(private, {"models": ["*"], "exp": int(time.time()) - 3600}),
        "no exp": token(private, {"models": ["*"], "exp": None}),
        "audience": token(private, {"models": ["*"], "aud": "other"}),
        "issuer": token(private, {"models": ["*"], "iss": "evil"}),
        "kid": token(private, {"models": ["*"]}, kid="k2"),
        "other key": token(rsa.generate_private_key(public_exponent=65537, key_size=2048), {"models": ["*"]}),
        "alg none": jwt.encode({"models": ["*"], "exp": int(time.time()) + 60, "aud": "oip", "iss": "issuer"},
                               None, algorithm="none", headers={"kid": "k1"}),
        "HS256 with the public key": jwt.encode(
            {"models": ["*"], "exp": int(time.time()) + 60, "aud": "oip", "iss": "issuer"},
            "x" * 32, algorithm="HS256", headers={"kid": "k1"}),
        "garbage": "a.b.c",
    }
    for what, t in bad.items():
        with pytest.raises(Unauthenticated):
            g.admit(INFER, "add_sub", "", "Bearer " + t)
            pytest.fail(what)


def test_jwks_rotation(tmp_path):
    private, jwks = rsa_jwks(tmp_path)
    g = guard(config(tmp_path, jwks))
    new_private, _ = rsa_jwks(tmp_path, kid="k2")  # rewrites jwks.json with k2 only
    g.jwt._checked -= 5
    assert g.admit(INFER, "add_sub", "", "Bearer " + token(new_private, {"models": ["*"]}, kid="k2"))
    with pytest.raises(Unauthenticated):
        g.admit(INFER, "add_sub", "", "Bearer " + token(private, {"models": ["*"]}))


def test_ec_keys(tmp_path):
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="e1")
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    cfg = config(tmp_path, tmp_path / "jwks.json")
    cfg["auth"]["jwt"]["algorithms"] = ["ES256"]
    g = guard(cfg)
    assert g.admit(INFER, "add_sub", "", "Bearer " + token(private, {"models": ["*"]}, kid="e1", alg="ES256"))


def test_config_problems(tmp_path):
    cfg = config(tmp_path)
    cfg["auth"]["keys"][0]["key"] = {"env": "OIP_TEST_UNSET_VARIABLE"}
    cfg["auth"]["keys"][1]["rate"] = {"per_s": 0}
    cfg["auth"]["keys"].append({"name": "short", "key": {"env": "OIP_TEST_SHORT"}})
    os.environ["OIP_TEST_SHORT"] = "abc"
    cfg["routes"][0]["auth"] = "yes"
    cfg["limits"] = {"max_tensors": 0, "bogus": 1}
    with pytest.raises(ConfigError) as exc:
        parse_config(cfg)
    text = "\n".join(exc.value.problems)
    for needle in ("auth.keys[0].key.env", "auth.keys[1].rate", "auth.keys[2].key: too short",
                   "routes[0].auth", "limits.bogus", "max_tensors"):
        assert needle in text, (needle, text)
    assert "abc" not in text  # a secret's value is never shown
    p = Problems()
    assert parse_auth(p, {}) is None and p.items
    p = Problems()
    assert parse_auth(p, {"jwt": {"jwks_file": str(tmp_path / "missing.json")}}) is None
    assert "cannot read" in p.items[0]


def test_bucket():
    b = TokenBucket(Rate(2.0, 2), 0.0)
    assert b.wait(0.0) == 0.0
    b.take()
    b.take()
    assert b.wait(0.0) == pytest.approx(0.5)
    assert b.wait(0.5) == 0.0
    assert retry_after(0.01) == 1 and retry_after(2.5) == 3
    many = Buckets(limit=3)
    for i in range(10):
        many.get(i, Rate(1.0, 1), 0.0)
    assert len(many) == 3
