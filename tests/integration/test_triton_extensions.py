"""Triton's per-model extensions through the gateway: model configuration and inference
statistics (tritonclient ``get_model_config`` / ``get_inference_statistics``; perf_analyzer
reads the configuration), on every client × backend protocol pair, compared with the same call
made directly. Same protocol: relayed unchanged. Across protocols: converted exactly (Triton's
HTTP JSON is the mapping of its protobuf). Statistics of a backend with several endpoints are
summed per model and version; with no model name, every backend's models are listed."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.conftest import start_gateway
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for


@pytest.fixture(scope="module", params=["http", "grpc"])
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def gw(triton, backend, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp(f"ext-{backend}"), triton.http_url, triton.grpc_url, backend)
    yield g
    g.stop()


def client(protocol: str, url: str):
    return httpclient.InferenceServerClient(url) if protocol == "http" else grpcclient.InferenceServerClient(url)


def direct(triton, protocol: str):
    return client(protocol, triton.http_url if protocol == "http" else triton.grpc_url)


def through(gw, protocol: str):
    return client(protocol, gw.http_url if protocol == "http" else gw.grpc_url)


def config(c, model: str, version: str = "") -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        return c.get_model_config(model, version, as_json=True)["config"]
    return c.get_model_config(model, version)


def stats(c, model: str = "", version: str = "") -> dict:
    if isinstance(c, grpcclient.InferenceServerClient):
        return c.get_inference_statistics(model, version, as_json=True)
    return c.get_inference_statistics(model, version)


def stats_pb(c, model: str = "") -> dict:
    """gRPC statistics as Triton's HTTP JSON has them (numbers, not protobuf's strings)."""
    msg = c.get_inference_statistics(model)
    from gateway.codec.tritonjson import message_to_json
    from gateway.codec.tritonstats import stats_from_pb
    return message_to_json(stats_from_pb(msg.SerializeToString()))


@pytest.mark.parametrize("model, version", [("add_sub", ""), ("identity_FP32", "1"), ("repeat_FP32", ""),
                                            ("identity_BYTES", "")])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_config_equals_direct(triton, gw, backend, protocol, model, version):
    """Every client × backend pair: the configuration equals Triton's own answer in the client's
    protocol (gRPC: compared as messages, so a changed or dropped field fails)."""
    if protocol == "grpc":
        got = through(gw, "grpc").get_model_config(model, version)
        want = direct(triton, "grpc").get_model_config(model, version)
        assert got == want
    else:
        assert config(through(gw, "http"), model, version) == config(direct(triton, "http"), model, version)
        assert config(through(gw, "http"), model, version)["name"] == model


def _run(c, model: str = "add_sub") -> None:
    """One inference of add_sub (HTTP or gRPC client)."""
    import numpy as np
    mod = httpclient if isinstance(c, httpclient.InferenceServerClient) else grpcclient
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = mod.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(i)
    c.infer(model, inputs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_statistics_equal_direct(triton, gw, backend, protocol):
    """Statistics of one endpoint through the gateway are Triton's, in the client's form.
    Nothing infers in between: the gateway's answer is bracketed by two direct reads."""
    _run(through(gw, protocol))
    before = stats(direct(triton, protocol), "add_sub")
    got = stats(through(gw, protocol), "add_sub")
    after = stats(direct(triton, protocol), "add_sub")
    assert before == after, "something else inferred meanwhile"
    assert got == before
    s = got["model_stats"][0]
    assert s["name"] == "add_sub"
    count = s["inference_count"]
    assert int(count) >= 1  # gRPC JSON: a string, as protobuf prints uint64


def test_statistics_of_every_model(triton, gw, backend):
    """No model name: every model of every backend, as Triton lists them (HTTP /v2/models/stats)."""
    for protocol in ("http", "grpc"):
        got = stats(through(gw, protocol))
        want = stats(direct(triton, protocol))
        assert {(s["name"], s["version"]) for s in got["model_stats"]} == \
            {(s["name"], s["version"]) for s in want["model_stats"]}
        assert {"add_sub", "identity_FP32"} <= {s["name"] for s in got["model_stats"]}


def test_across_protocols_unknown_model_is_the_backends_answer(gw, backend):
    for protocol in ("http", "grpc"):
        with pytest.raises(InferenceServerException) as info:
            config(through(gw, protocol), "no_such_model")
        assert "no_such_model" in str(info.value)
        with pytest.raises(InferenceServerException) as info:
            stats(through(gw, protocol), "no_such_model")
        assert "no_such_model" in str(info.value)


@pytest.fixture(scope="module")
def doubled(triton, tmp_path_factory):
    """Two gateways whose backend has two endpoints that are one Triton (by two names): the
    statistics the gateway gathers are those of two identical servers, so their sum is
    exactly twice Triton's — a sum that can be checked to the nanosecond."""
    _, http_port = triton.http_url.rsplit(":", 1)
    _, grpc_port = triton.grpc_url.rsplit(":", 1)
    gws = {}
    for protocol, port in (("http", http_port), ("grpc", grpc_port)):
        backends = {"b": {"protocol": protocol, "endpoints": [f"127.0.0.1:{port}", f"localhost:{port}"]}}
        g = GatewayProcess(gateway_config(backends, [{"model": "*", "backend": "b"}]),
                           tmp_path_factory.mktemp(f"doubled-{protocol}"), name=f"gateway-{protocol}")
        g.start()
        gws[protocol] = g
    try:
        for g in gws.values():
            wait_for(lambda g=g: httpclient.InferenceServerClient(g.http_url).is_server_ready(), timeout=30,
                     what="gateway readiness")
        yield gws
    finally:
        for g in gws.values():
            g.stop()


def _doubled(doc: dict) -> dict:
    out = []
    for s in doc["model_stats"]:
        s = dict(s)
        for k in ("inference_count", "execution_count"):
            s[k] = 2 * s[k]
        s["inference_stats"] = {k: {"count": 2 * v["count"], "ns": 2 * v["ns"]}
                                for k, v in s["inference_stats"].items()}
        s["batch_stats"] = [{"batch_size": b["batch_size"],
                             **{k: {"count": 2 * v["count"], "ns": 2 * v["ns"]} for k, v in b.items()
                                if k != "batch_size"}} for b in s["batch_stats"]]
        out.append(s)
    return {"model_stats": out}


@pytest.mark.parametrize("backend_protocol", ["http", "grpc"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_statistics_are_summed_over_endpoints(triton, doubled, backend_protocol, protocol):
    g = doubled[backend_protocol]
    _run(direct(triton, "http"))
    before = stats(direct(triton, "http"), "add_sub")
    got = stats_pb(through(g, "grpc"), "add_sub") if protocol == "grpc" else stats(through(g, "http"), "add_sub")
    assert stats(direct(triton, "http"), "add_sub") == before, "something else inferred meanwhile"
    assert got == _doubled(before)
    assert got["model_stats"][0]["last_inference"] == before["model_stats"][0]["last_inference"]


def test_reference_server_has_no_configuration(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("ext-ref"), reference.http_url, reference.grpc_url, "http")
    try:
        with pytest.raises(InferenceServerException, match="config"):
            config(client("http", g.http_url), "add_sub")
    finally:
        g.stop()


def test_config_json_is_the_protobuf_mapping(triton):
    """The codec's rule, checked on Triton itself: its HTTP JSON is its gRPC message mapped
    with 64-bit integers as numbers — for every model in the test repository."""
    import orjson

    from gateway.codec.tritonjson import config_to_json
    h, g = direct(triton, "http"), direct(triton, "grpc")
    for entry in h.get_model_repository_index():
        name = entry["name"]
        if entry.get("state") != "READY":
            continue
        answer = g.get_model_config(name)
        assert orjson.loads(config_to_json(answer.SerializeToString())) == h.get_model_config(name), name
        assert json_format.MessageToDict(answer) is not None


def test_extensions_listed_are_tritons_and_carried(triton, gw):
    """Server metadata's extensions: what the gateway carries end to end (each proven in
    these tests), in Triton's own spelling — a subset of what Triton itself lists."""
    from gateway.proxy import EXTENSIONS
    listed = through(gw, "http").get_server_metadata()["extensions"]
    assert listed == EXTENSIONS
    assert list(through(gw, "grpc").get_server_metadata().extensions) == EXTENSIONS
    tritons = set(direct(triton, "http").get_server_metadata()["extensions"])
    assert set(listed) <= tritons
    assert not {"system_shared_memory", "cuda_shared_memory"} & set(listed)
