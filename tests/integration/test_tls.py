"""TLS on the HTTP and gRPC listeners (``listen.tls``), with and without client
certificates, through real clients; certificates are made per test session."""
from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import json
import ssl
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from gateway.config import parse_config
from gateway.errors import ConfigError
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

ADD_SUB = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]},
                                 {"name": "INPUT1", "shape": [2], "datatype": "FP32", "data": [3, 4]}]}).encode()


def _cert(subject: str, issuer_key, issuer_name, key, *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, None, ca_key, ca=True)
    files = {"ca": ca}
    keys = {}
    for name, server in (("server", True), ("client", False)):
        keys[name] = ec.generate_private_key(ec.SECP256R1())
        files[name] = _cert(name, ca_key, ca.subject, keys[name], server=server)
    out: dict[str, Path] = {"ca_key": d / "ca.key"}
    out["ca_key"].write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    for name, cert in files.items():
        out[name] = d / f"{name}.crt"
        out[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for name, key in keys.items():
        out[f"{name}_key"] = d / f"{name}.key"
        out[f"{name}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return out


def _gateway(reference, pki, workdir, name, *, mutual: bool) -> GatewayProcess:
    tls = {"cert": str(pki["server"]), "key": str(pki["server_key"])}
    if mutual:
        tls["client_ca"] = str(pki["ca"])
    cfg = gateway_config({"ref": {"protocol": "http", "endpoints": [reference.http_url]}},
                         [{"model": "*", "backend": "ref"}])
    cfg["listen"]["tls"] = tls
    return GatewayProcess(cfg, workdir, name).start()


def _https(url: str, path: str, pki, *, client_cert: bool = False, body: bytes | None = None) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if client_cert:
        ctx.load_cert_chain(str(pki["client"]), str(pki["client_key"]))
    req = urllib.request.Request(f"https://{url}{path}", data=body, method="POST" if body else "GET")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return r.status, r.read()


def _grpc_client(url: str, pki, *, client_cert: bool = False) -> grpcclient.InferenceServerClient:
    extra = {"private_key": str(pki["client_key"]), "certificate_chain": str(pki["client"])} if client_cert else {}
    return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki["ca"]), **extra)


def _grpc_add_sub(client: grpcclient.InferenceServerClient) -> np.ndarray:
    ins = []
    for name, values in (("INPUT0", [1, 2]), ("INPUT1", [3, 4])):
        t = grpcclient.InferInput(name, [2], "FP32")
        t.set_data_from_numpy(np.array(values, np.float32))
        ins.append(t)
    return client.infer("add_sub", ins).as_numpy("OUTPUT0")


def test_tls_listeners(reference, pki, tmp_path):
    gw = _gateway(reference, pki, tmp_path, "gw-tls", mutual=False)
    try:
        status, body = _https(gw.http_url, "/v2/models/add_sub/infer", pki, body=ADD_SUB)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [4, 6]
        with _grpc_client(gw.grpc_url, pki) as c:
            assert c.is_server_live()
            np.testing.assert_array_equal(_grpc_add_sub(c), [4, 6])
        # Plain text is refused on both.
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{gw.http_url}/v2/health/live", timeout=5)
        with grpc.insecure_channel(gw.grpc_url) as ch:
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # The metrics listener stays plain HTTP (Prometheus scrapes it in-cluster).
        with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=5) as r:
            assert r.status == 200
        assert gw.proc.poll() is None
    finally:
        gw.stop()


def test_mutual_tls(reference, pki, tmp_path):
    gw = _gateway(reference, pki, tmp_path, "gw-mtls", mutual=True)
    try:
        status, _ = _https(gw.http_url, "/v2/health/live", pki, client_cert=True)
        assert status == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _https(gw.http_url, "/v2/health/live", pki)  # no client certificate
        with _grpc_client(gw.grpc_url, pki, client_cert=True) as c:
            np.testing.assert_array_equal(_grpc_add_sub(c), [4, 6])
        with _grpc_client(gw.grpc_url, pki) as c:
            with pytest.raises(InferenceServerException):
                c.is_server_live()
        assert gw.proc.poll() is None
    finally:
        gw.stop()


def test_tls_to_backends(reference, pki, tmp_path):
    """Gateway B reaches its backends over TLS (HTTP and gRPC backends): the backend here is
    gateway A, whose listeners require client certificates."""
    a = _gateway(reference, pki, tmp_path, "gw-a", mutual=True)
    tls = {"ca": str(pki["ca"]), "cert": str(pki["client"]), "key": str(pki["client_key"])}
    try:
        for name, with_cert in (("gw-b", True), ("gw-b-nocert", False)):
            t = tls if with_cert else {"ca": tls["ca"]}
            backends = {"a-http": {"protocol": "http", "endpoints": [a.http_url], "tls": t},
                        "a-grpc": {"protocol": "grpc", "endpoints": [a.grpc_url], "tls": t}}
            routes = [{"model": "add_sub", "backend": "a-http"}, {"model": "identity_FP32", "backend": "a-grpc"},
                      {"model": "identity_UINT8", "backend": "a-http"}]
            with GatewayProcess(gateway_config(backends, routes), tmp_path, name) as b:
                req = urllib.request.Request(f"http://{b.http_url}/v2/models/add_sub/infer", data=ADD_SUB,
                                             method="POST")
                x = np.arange(3, dtype=np.float32).reshape(1, 3)
                t_in = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
                t_in.set_data_from_numpy(x)
                with grpcclient.InferenceServerClient(b.grpc_url) as c:
                    if with_cert:
                        with urllib.request.urlopen(req, timeout=10) as r:
                            assert json.loads(r.read())["outputs"][0]["data"] == [4, 6]
                        np.testing.assert_array_equal(c.infer("identity_FP32", [t_in]).as_numpy("OUTPUT0"), x)
                        # A large binary body both ways over TLS: read past the parsers on A's
                        # listener and on B's connection to A (frontend/h1conn.py go_raw,
                        # backends/h1/), through uvloop's TLS transport.
                        big = np.random.default_rng(5).integers(0, 256, (1, 3 << 20), dtype=np.uint8)
                        with httpclient.InferenceServerClient(b.http_url, network_timeout=60) as hc:
                            big_in = httpclient.InferInput("INPUT0", list(big.shape), "UINT8")
                            big_in.set_data_from_numpy(big, binary_data=True)
                            out = hc.infer("identity_UINT8", [big_in],
                                           outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
                            np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), big)
                    else:  # A refuses B's connections without a client certificate
                        with pytest.raises(urllib.error.HTTPError) as info:
                            urllib.request.urlopen(req, timeout=10)
                        assert info.value.code in (502, 503)
                        with pytest.raises(InferenceServerException):
                            c.infer("identity_FP32", [t_in])
    finally:
        a.stop()


def test_tls_config_errors(pki, tmp_path):
    base = {"backends": {"t": {"protocol": "http", "endpoints": ["h:1"]}}, "routes": [{"model": "m", "backend": "t"}]}

    def problems(tls) -> list[str]:
        with pytest.raises(ConfigError) as info:
            parse_config(dict(base, listen={"tls": tls}))
        return info.value.problems

    assert any(p.startswith("listen.tls.key:") for p in problems({"cert": str(pki["server"])}))
    found = problems({"cert": str(tmp_path / "missing.crt"), "key": str(pki["server_key"])})
    assert any(p.startswith("listen.tls") and "cannot read" in p for p in found), found
    (tmp_path / "junk.crt").write_text("not a certificate")
    found = problems({"cert": str(tmp_path / "junk.crt"), "key": str(pki["server_key"])})
    assert any("not a PEM file" in p for p in found), found
    assert any(p.startswith("listen.tls.ciphers") for p in problems(
        {"cert": str(pki["server"]), "key": str(pki["server_key"]), "ciphers": "x"}))
    cfg = parse_config(dict(base, listen={"tls": {"cert": str(pki["server"]), "key": str(pki["server_key"])}}))
    assert cfg.listen.tls is not None and cfg.listen.tls.client_ca is None

    def backend_problems(tls) -> list[str]:
        raw = dict(base, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "tls": tls}})
        with pytest.raises(ConfigError) as info:
            parse_config(raw)
        return info.value.problems

    assert any(p.startswith("backends.t.tls") and "go together" in p
               for p in backend_problems({"cert": str(pki["client"])}))
    assert any(p.startswith("backends.t.tls.sni") for p in backend_problems({"sni": "x"}))
    assert any(p.startswith("backends.t.tls") for p in backend_problems("yes"))
    raw = dict(base, backends={"t": {"protocol": "grpc", "endpoints": ["h:1"], "tls": True}})
    assert parse_config(raw).backends["t"].tls is not None


def _peer_serial(url: str, pki, alpn: list[str] | None = None) -> int:
    """The serial number of the certificate a new TLS connection to ``url`` is shown."""
    host, port = url.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if alpn:
        ctx.set_alpn_protocols(alpn)
    import socket

    with socket.create_connection((host, int(port)), timeout=10) as raw_sock, \
            ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as tls_sock:
        der = tls_sock.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_certificate_reloaded_without_dropping_connections(reference, pki, tmp_path):
    """A rotated certificate (a Secret's atomic swap, then a half-written one) is taken by new
    handshakes on both listeners; connections already open keep working."""
    from cryptography.hazmat.primitives.asymmetric import ec as _ec

    live = tmp_path / "live"
    live.mkdir()
    (live / "tls.crt").write_bytes(pki["server"].read_bytes())
    (live / "tls.key").write_bytes(pki["server_key"].read_bytes())
    cfg = gateway_config({"ref": {"protocol": "http", "endpoints": [reference.http_url]}},
                         [{"model": "*", "backend": "ref"}])
    cfg["listen"]["tls"] = {"cert": str(live / "tls.crt"), "key": str(live / "tls.key")}
    gw = GatewayProcess(cfg, tmp_path, "gw-rotate").start()
    try:
        old_serial = x509.load_pem_x509_certificate(pki["server"].read_bytes()).serial_number
        assert _peer_serial(gw.http_url, pki) == old_serial
        assert _peer_serial(gw.grpc_url, pki, ["h2"]) == old_serial
        # Connections opened before the rotation.
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        host, port = gw.http_url.rsplit(":", 1)
        kept = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
        kept.request("POST", "/v2/models/add_sub/infer", body=ADD_SUB)
        first = kept.getresponse()
        assert first.status == 200 and first.read()
        channel = _grpc_client(gw.grpc_url, pki)
        np.testing.assert_array_equal(_grpc_add_sub(channel), [4, 6])

        # The new certificate, from the same CA (what cert-manager does), swapped in atomically.
        new_key = _ec.generate_private_key(_ec.SECP256R1())
        ca_cert = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
        ca_priv = serialization.load_pem_private_key(pki["ca_key"].read_bytes(), None)
        new_cert = _cert("server-rotated", ca_priv, ca_cert.subject, new_key, server=True)
        staging = tmp_path / "staging"
        staging.mkdir()
        (staging / "tls.crt").write_bytes(new_cert.public_bytes(serialization.Encoding.PEM))
        (staging / "tls.key").write_bytes(new_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        # A half-written rotation first (new cert, old key): refused, the old one stays.
        (live / "tls.crt").write_bytes((staging / "tls.crt").read_bytes())
        wait_for(lambda: "cannot be used" in gw.log_tail(200), timeout=10, what="the refusal logged")
        assert _peer_serial(gw.http_url, pki) == old_serial
        assert _peer_serial(gw.grpc_url, pki, ["h2"]) == old_serial
        (staging / "tls.key").replace(live / "tls.key")
        wait_for(lambda: _peer_serial(gw.http_url, pki) == new_cert.serial_number, timeout=10,
                 what="HTTP listener shows the new certificate")
        wait_for(lambda: _peer_serial(gw.grpc_url, pki, ["h2"]) == new_cert.serial_number, timeout=10,
                 what="gRPC listener shows the new certificate")
        # The connections from before still work.
        kept.request("POST", "/v2/models/add_sub/infer", body=ADD_SUB)
        r = kept.getresponse()
        assert r.status == 200 and json.loads(r.read())["outputs"][0]["data"] == [4, 6]
        np.testing.assert_array_equal(_grpc_add_sub(channel), [4, 6])
        # And new clients too.
        assert _https(gw.http_url, "/v2/health/ready", pki)[0] == 200
        np.testing.assert_array_equal(_grpc_add_sub(_grpc_client(gw.grpc_url, pki)), [4, 6])
        kept.close()
        channel.close()
    finally:
        gw.stop()


def _pair(name: str, issuer_key, issuer: x509.Certificate | None, directory: Path, *, ca: bool = False):
    """(key, certificate) written to directory/<name>.key and .crt; self-signed without an issuer."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(name, issuer_key or key, issuer.subject if issuer else None, key, ca=ca)
    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return key, cert


def test_replaced_client_ca_is_no_longer_trusted(reference, pki, tmp_path):
    """The client CA file replaced by another CA's (a compromised CA revoked): new handshakes
    on both listeners trust the new CA only — clients of the old one are refused at once,
    without a restart; a connection opened before keeps working."""
    live, other = tmp_path / "live", tmp_path / "other"
    live.mkdir()
    other.mkdir()
    (live / "ca.crt").write_bytes(pki["ca"].read_bytes())
    new_ca_key, new_ca = _pair("new-ca", None, None, other, ca=True)
    _pair("new-client", new_ca_key, new_ca, other)
    new_client = {**pki, "client": other / "new-client.crt", "client_key": other / "new-client.key"}
    cfg = gateway_config({"ref": {"protocol": "http", "endpoints": [reference.http_url]}},
                         [{"model": "*", "backend": "ref"}])
    cfg["listen"]["tls"] = {"cert": str(pki["server"]), "key": str(pki["server_key"]),
                            "client_ca": str(live / "ca.crt")}
    gw = GatewayProcess(cfg, tmp_path, "gw-ca-rotate").start()
    try:
        assert _https(gw.http_url, "/v2/health/live", pki, client_cert=True)[0] == 200
        with _grpc_client(gw.grpc_url, pki, client_cert=True) as c:
            np.testing.assert_array_equal(_grpc_add_sub(c), [4, 6])
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _https(gw.http_url, "/v2/health/live", new_client, client_cert=True)  # not trusted yet
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        ctx.load_cert_chain(str(pki["client"]), str(pki["client_key"]))
        host, port = gw.http_url.rsplit(":", 1)
        kept = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
        kept.request("GET", "/v2/health/live")
        assert kept.getresponse().read() is not None

        staged = tmp_path / "ca.crt.new"
        staged.write_bytes(new_ca.public_bytes(serialization.Encoding.PEM))
        staged.replace(live / "ca.crt")  # atomic, as a Secret's swap

        def new_client_accepted() -> bool:
            try:
                return _https(gw.http_url, "/v2/health/live", new_client, client_cert=True)[0] == 200
            except (ssl.SSLError, urllib.error.URLError, ConnectionError):
                return False

        wait_for(new_client_accepted, timeout=10, what="the new CA's client accepted over HTTP")
        for _ in range(3):  # every new handshake, not one
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                _https(gw.http_url, "/v2/health/live", pki, client_cert=True)  # the old CA: refused
        with _grpc_client(gw.grpc_url, new_client, client_cert=True) as c:
            np.testing.assert_array_equal(_grpc_add_sub(c), [4, 6])
        with _grpc_client(gw.grpc_url, pki, client_cert=True) as c:
            with pytest.raises(InferenceServerException):
                c.is_server_live()
        kept.request("GET", "/v2/health/live")  # opened before: it keeps its handshake
        assert kept.getresponse().status == 200
        kept.close()
        assert gw.proc.poll() is None
    finally:
        gw.stop()
