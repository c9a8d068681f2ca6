"""Triton's trace and log settings through the gateway (tritonclient get/update_trace_settings,
get/update_log_settings), both client protocols × both backend protocols, two real Tritons:
a per-model trace setting reaches every endpoint of the model's backend, a server-wide setting
every endpoint of every backend, each seen on the Tritons directly; reads equal Triton's own
answers; Triton's refusals come back as its errors."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.fleet import slow_repository
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer, triton_available

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    reason = triton_available()
    if reason is not None:
        pytest.skip(f"Triton unavailable: {reason}")
    root = tmp_path_factory.mktemp("settings")
    repo = slow_repository(root, ["mh", "mg"], 0)
    a, b = TritonServer(repo), TritonServer(repo)
    a.start(root / "a")
    b.start(root / "b")
    backends = {"th": {"protocol": "http", "endpoints": [a.http_url, b.http_url]},
                "tg": {"protocol": "grpc", "endpoints": [a.grpc_url, b.grpc_url]}}
    routes = [{"model": "mh", "backend": "th"}, {"model": "mg", "backend": "tg"}]
    gw = GatewayProcess(gateway_config(backends, routes), root, "gw-settings")
    try:
        gw.start()
        wait_for(lambda: httpclient.InferenceServerClient(gw.http_url).is_server_ready(), timeout=30,
                 what="gateway readiness")
        yield {"a": a, "b": b, "gw": gw}
    finally:
        gw.stop()
        a.stop()
        b.stop()


def client(protocol: str, url: str):
    return httpclient.InferenceServerClient(url) if protocol == "http" else grpcclient.InferenceServerClient(url)


def log_settings(c) -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        return {k: v.get("boolParam", v.get("uint32Param", v.get("stringParam")))
                for k, v in c.get_log_settings(as_json=True)["settings"].items()}
    return c.get_log_settings()


def trace_settings(c, model: str | None = None) -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        answer = c.get_trace_settings(model_name=model, as_json=True)["settings"]
        return {k: v.get("value", []) for k, v in answer.items()}
    return {k: v if isinstance(v, list) else [v] for k, v in c.get_trace_settings(model_name=model).items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_log_settings_reach_every_endpoint(fleet, protocol):
    gw, tritons = fleet["gw"], (fleet["a"], fleet["b"])
    through = client(protocol, gw.http_url if protocol == "http" else gw.grpc_url)
    try:
        answer = through.update_log_settings({"log_verbose_level": 1, "log_info": False})
        for t in tritons:
            direct = httpclient.InferenceServerClient(t.http_url).get_log_settings()
            assert direct["log_verbose_level"] == 1 and direct["log_info"] is False
        assert log_settings(through) == log_settings(client(protocol, tritons[0].http_url if protocol == "http"
                                                            else tritons[0].grpc_url))
        assert answer is not None
    finally:
        through.update_log_settings({"log_verbose_level": 0, "log_info": True})
    for t in tritons:
        assert httpclient.InferenceServerClient(t.http_url).get_log_settings()["log_verbose_level"] == 0


@pytest.mark.parametrize("model", ["mh", "mg"])  # a model of the HTTP backend, one of the gRPC backend
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_trace_settings_reach_the_models_backend(fleet, protocol, model):
    gw, tritons = fleet["gw"], (fleet["a"], fleet["b"])
    through = client(protocol, gw.http_url if protocol == "http" else gw.grpc_url)
    rate = "17" if protocol == "http" else "23"
    through.update_trace_settings(model_name=model, settings={"trace_rate": rate, "trace_level": ["OFF"]})
    for t in tritons:
        direct = httpclient.InferenceServerClient(t.http_url)
        assert direct.get_trace_settings(model_name=model)["trace_rate"] == rate
        assert direct.get_trace_settings(model_name=model)["trace_level"] == ["OFF"]
        assert direct.get_trace_settings()["trace_rate"] != rate  # server-wide left alone
    direct = client(protocol, tritons[0].http_url if protocol == "http" else tritons[0].grpc_url)
    assert trace_settings(through, model) == trace_settings(direct, model)
    # Clearing (null over HTTP, an empty value over gRPC) goes back to the server-wide value.
    through.update_trace_settings(model_name=model, settings={"trace_rate": None, "trace_level": None})
    for t in tritons:
        direct_http = httpclient.InferenceServerClient(t.http_url)
        assert direct_http.get_trace_settings(model_name=model)["trace_rate"] == \
            direct_http.get_trace_settings()["trace_rate"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_server_trace_settings_and_tritons_refusal(fleet, protocol):
    gw, a = fleet["gw"], fleet["a"]
    through = client(protocol, gw.http_url if protocol == "http" else gw.grpc_url)
    direct = client(protocol, a.http_url if protocol == "http" else a.grpc_url)
    assert trace_settings(through) == trace_settings(direct)
    # Triton refuses to move its trace file over the network: its own words come back.
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        through.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})


def test_unknown_model_and_bad_values(fleet):
    gw = fleet["gw"]
    with pytest.raises(InferenceServerException) as info:
        httpclient.InferenceServerClient(gw.http_url).update_trace_settings(model_name="nope",
                                                                            settings={"trace_rate": "2"})
    assert "nope" in str(info.value)
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"http://{gw.http_url}/v2/logging", method="POST",
                                 data=b'{"log_verbose_level": -1}')
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_settings_path_of_unknown_kind_is_404(fleet):
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{fleet['gw'].http_url}/v2/trace/unknown", timeout=10)
    assert err.value.code == 404
    assert "error" in err.value.read().decode()
