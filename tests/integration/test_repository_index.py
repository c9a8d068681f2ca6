"""The gateway's repository index (`POST /v2/repository/index`, gRPC `RepositoryIndex`): every
backend's endpoints' indexes merged — model, version, state, reason, and which backend and endpoints
hold it — read with tritonclient on both transports and compared with Triton's own answer."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.gateway import GatewayProcess, gateway_config

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def gw(triton, reference, tmp_path_factory):
    backends = {"t-http": {"protocol": "http", "endpoints": [triton.http_url]},
                "t-grpc": {"protocol": "grpc", "endpoints": [triton.grpc_url]},
                "ref": {"protocol": "http", "endpoints": [reference.http_url]}}  # no index: adds nothing
    routes = [{"model": "add_sub", "backend": "t-http"}, {"model": "*", "backend": "t-grpc"}]
    with GatewayProcess(gateway_config(backends, routes), tmp_path_factory.mktemp("index"), "gw-index") as g:
        yield g


def test_index_merged_over_backends_matches_triton(triton, gw):
    with httpclient.InferenceServerClient(triton.http_url) as c:
        direct = {(e["name"], e.get("version", ""), e.get("state", "")) for e in c.get_model_repository_index()}
    assert direct
    with httpclient.InferenceServerClient(gw.http_url) as c:
        via_http = c.get_model_repository_index()
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        via_grpc = c.get_model_repository_index(as_json=True)["models"]
    for backend, url in (("t-http", triton.http_url), ("t-grpc", triton.grpc_url)):
        entries = [e for e in via_http if e["backend"] == backend]
        assert {(e["name"], e["version"], e["state"]) for e in entries} == direct
        assert all(e["endpoints"] == [url] for e in entries)
    assert {e["backend"] for e in via_http} == {"t-http", "t-grpc"}
    # gRPC has no field for the backend: one ModelIndex per backend entry, Triton's fields.
    assert sorted((e["name"], e.get("version", ""), e.get("state", "")) for e in via_grpc) == sorted(
        (e["name"], e["version"], e["state"]) for e in via_http)


def test_ready_only(gw):
    import json
    import urllib.request

    req = urllib.request.Request(f"http://{gw.http_url}/v2/repository/index", data=b'{"ready": true}', method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        ready = json.loads(r.read())
    assert ready and all(e["state"] == "READY" for e in ready)
