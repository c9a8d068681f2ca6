"""Model control through the gateway (tritonclient load_model / unload_model, on both
transports): sent to every endpoint of the model's pool, effects observed on every real
Triton, a combined answer — and an endpoint that cannot take it named in the error."""
from __future__ import annotations

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
            # Cross-protocol model control is refused with the reason, not half done.
            with httpclient.InferenceServerClient(gw.http_url) as c:
                with pytest.raises(InferenceServerException, match="same protocols"):
                    c.unload_model("m_grpc")
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
