"""The health answers carry KServe's bodies with the Open Inference Protocol's status codes:
``{"live": ...}``, ``{"ready": ...}``, ``{"name": ..., "ready": ...}`` (kserve-v2-data-plane
text: $live_server_response, $ready_server_response, $ready_model_response). tritonclient reads
only the status; KServe's SDK parses the body (its is_server_live() raised on an empty one)."""
from __future__ import annotations

import http.client

import orjson
import pytest
import tritonclient.http as httpclient

from tests.conftest import start_gateway


@pytest.fixture(scope="module")
def gw(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("health-bodies"), reference.http_url, reference.grpc_url, "http",
                      models=["add_sub"])
    yield g
    g.stop()


def _get(url: str, path: str) -> tuple[int, str, object]:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", orjson.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("path, status, body", [
    ("/v2/health/live", 200, {"live": True}),
    ("/v2/health/ready", 200, {"ready": True}),
    ("/v2/models/add_sub/ready", 200, {"name": "add_sub", "ready": True}),
    ("/v2/models/add_sub/versions/1/ready", 200, {"name": "add_sub", "ready": True}),
    ("/v2/models/no_such_model/ready", 400, {"name": "no_such_model", "ready": False}),
])
def test_health_answers_have_bodies_and_the_same_status(gw, path, status, body):
    assert _get(gw.http_url, path) == (status, "application/json", body)


def test_tritonclient_still_reads_them(gw):
    with httpclient.InferenceServerClient(gw.http_url) as c:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("add_sub")
        assert not c.is_model_ready("no_such_model")
