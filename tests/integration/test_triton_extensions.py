"""Triton's per-model extensions through the gateway: model configuration and inference
statistics (tritonclient ``get_model_config`` / ``get_inference_statistics``; perf_analyzer
reads the configuration). Relayed unchanged between the same protocols; a clear error across
protocols, for unknown models and from the reference server."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_gateway


@pytest.fixture(scope="module", params=["http", "grpc"])
def pool(request):
    return request.param


@pytest.fixture(scope="module")
def gw(triton, pool, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp(f"ext-{pool}"), triton.http_url, triton.grpc_url, pool)
    yield g
    g.stop()


def client(protocol: str, url: str):
    return httpclient.InferenceServerClient(url) if protocol == "http" else grpcclient.InferenceServerClient(url)


def config(c, model: str, version: str = "") -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        return c.get_model_config(model, version, as_json=True)["config"]
    return c.get_model_config(model, version)


def stats(c, model: str) -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        return c.get_inference_statistics(model, as_json=True)
    return c.get_inference_statistics(model)


@pytest.mark.parametrize("model, version", [("add_sub", ""), ("identity_FP32", "1"), ("repeat_FP32", "")])
def test_model_config_same_protocol_is_relayed(triton, gw, pool, model, version):
    direct = client(pool, triton.http_url if pool == "http" else triton.grpc_url)
    through = client(pool, gw.http_url if pool == "http" else gw.grpc_url)
    assert config(through, model, version) == config(direct, model, version)
    assert config(through, model, version)["name"] == model


def test_statistics_same_protocol_is_relayed(triton, gw, pool):
    through = client(pool, gw.http_url if pool == "http" else gw.grpc_url)
    doc = stats(through, "add_sub")
    assert [s["name"] for s in doc["model_stats"]] == ["add_sub"]
    direct = stats(client(pool, triton.http_url if pool == "http" else triton.grpc_url), "add_sub")
    assert set(doc["model_stats"][0]) == set(direct["model_stats"][0])


def test_across_protocols_is_a_clear_error(gw, pool):
    other = "grpc" if pool == "http" else "http"
    through = client(other, gw.http_url if other == "http" else gw.grpc_url)
    with pytest.raises(InferenceServerException, match="same protocols"):
        config(through, "add_sub")
    with pytest.raises(InferenceServerException, match="same protocols"):
        stats(through, "add_sub")


def test_unknown_model(gw, pool):
    for protocol in ("http", "grpc"):
        through = client(protocol, gw.http_url if protocol == "http" else gw.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            config(through, "no_such_model")
        assert "no_such_model" in str(info.value)


def test_reference_server_has_no_configuration(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("ext-ref"), reference.http_url, reference.grpc_url, "http")
    try:
        with pytest.raises(InferenceServerException, match="no model config"):
            config(client("http", g.http_url), "add_sub")
    finally:
        g.stop()
