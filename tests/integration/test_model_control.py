"""Model control through the gateway (tritonclient load_model / unload_model, on both
transports): sent to every endpoint of the model's backend, effects observed on every real
Triton, a combined answer — and an endpoint that cannot take it named in the error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.fleet import slow_repository
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer

pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def _needs_triton(triton_required: None) -> None:
    """Triton processes of this module's own."""


def test_load_and_unload_reach_every_endpoint(tmp_path: Path) -> None:
    repo = slow_repository(tmp_path, ["m_http", "m_grpc"], 0.2)
    a, b = TritonServer(repo, startup_models=()), TritonServer(repo, startup_models=())
    a.start(tmp_path / "a")
    b.start(tmp_path / "b")
    try:
        backends = {"th": {"protocol": "http", "endpoints": [a.http_url, b.http_url]},
                    "tg": {"protocol": "grpc", "endpoints": [a.grpc_url, b.grpc_url]}}
        routes = [{"model": "m_http", "backend": "th"}, {"model": "m_grpc", "backend": "tg"}]
        with GatewayProcess(gateway_config(backends, routes), tmp_path, "gw-control") as gw:
            with httpclient.InferenceServerClient(gw.http_url) as c:
                c.load_model("m_http")
            with grpcclient.InferenceServerClient(gw.grpc_url) as c:
                c.load_model("m_grpc")
            assert a.ready_models() == b.ready_models() == {"m_http", "m_grpc"}
            # The gateway then sees them ready (its checker) and serves them.
            with httpclient.InferenceServerClient(gw.http_url) as c:
                wait_for(lambda: c.is_model_ready("m_http") and c.is_model_ready("m_grpc"), timeout=20,
                         what="the loaded models ready through the gateway")
                c.unload_model("m_http")
            assert a.ready_models() == b.ready_models() == {"m_grpc"}
            # Across protocols: converted (unload_dependents too), to every endpoint as well.
            with httpclient.InferenceServerClient(gw.http_url) as c:
                c.unload_model("m_grpc", unload_dependents=True)
                assert a.ready_models() == b.ready_models() == set()
                c.load_model("m_grpc")
            with grpcclient.InferenceServerClient(gw.grpc_url) as c:
                c.load_model("m_http")
                assert a.ready_models() == b.ready_models() == {"m_http", "m_grpc"}
                c.unload_model("m_http", unload_dependents=True)
            assert a.ready_models() == b.ready_models() == {"m_grpc"}
            # An endpoint that cannot take it: named in a combined error.
            b.kill()
            with grpcclient.InferenceServerClient(gw.grpc_url) as c:
                with pytest.raises(InferenceServerException) as info:
                    c.unload_model("m_grpc")
            assert "failed on 1 of 2 endpoints" in str(info.value) and b.grpc_url.split(":")[1] in str(info.value)
            assert a.ready_models() == set()  # the live one did it
    finally:
        a.stop()
        b.stop()


ADD_SUB = Path(__file__).resolve().parents[1] / "models" / "triton" / "add_sub"


def _override(origin: str) -> str:
    """add_sub's configuration with a parameter naming who loaded it."""
    tensors = lambda kind, names: [{"name": n, "data_type": "TYPE_FP32", "dims": [-1]} for n in names]
    return json.dumps({"backend": "python", "max_batch_size": 0,
                       "input": tensors("input", ["INPUT0", "INPUT1"]),
                       "output": tensors("output", ["OUTPUT0", "OUTPUT1"]),
                       "parameters": {"origin": {"string_value": origin}}})


@pytest.mark.parametrize("client_protocol", ["http", "grpc"])
def test_load_with_config_and_files_across_protocols(tmp_path: Path, client_protocol: str) -> None:
    """tritonclient's load_model(config=..., files=...) through a backend of the other protocol:
    the configuration override and the file's bytes (base64 over HTTP, bytes over gRPC)
    reach every endpoint, which then serves the model as configured."""
    repo = slow_repository(tmp_path, ["m"], 0)
    backend = "grpc" if client_protocol == "http" else "http"
    a, b = TritonServer(repo, startup_models=()), TritonServer(repo, startup_models=())
    a.start(tmp_path / "a")
    b.start(tmp_path / "b")
    try:
        urls = [s.http_url if backend == "http" else s.grpc_url for s in (a, b)]
        backends = {"p": {"protocol": backend, "endpoints": urls}}
        with GatewayProcess(gateway_config(backends, [{"model": "m", "backend": "p"}]), tmp_path, "gw") as gw:
            mod = httpclient if client_protocol == "http" else grpcclient
            url = gw.http_url if client_protocol == "http" else gw.grpc_url
            files = {"file:1/model.py": (ADD_SUB / "1" / "model.py").read_bytes()}
            with mod.InferenceServerClient(url) as c:
                c.load_model("m", config=_override(f"{client_protocol}-client"), files=files)
            for server in (a, b):
                with httpclient.InferenceServerClient(server.http_url) as direct:
                    assert direct.is_model_ready("m")
                    params = direct.get_model_config("m")["parameters"]
                    assert params["origin"] == {"string_value": f"{client_protocol}-client"}
            # A malformed body is the gateway's clear 400, not a backend's 500 (HTTP clients).
            if client_protocol == "http":
                import urllib.error
                import urllib.request
                req = urllib.request.Request(f"http://{gw.http_url}/v2/repository/models/m/load", method="POST",
                                             data=b'{"parameters": {"file:1/model.py": "not base64!"}}')
                with pytest.raises(urllib.error.HTTPError) as info:
                    urllib.request.urlopen(req, timeout=10)
                assert info.value.code == 400
                assert "file:1/model.py" in json.loads(info.value.read())["error"]
    finally:
        a.stop()
        b.stop()
