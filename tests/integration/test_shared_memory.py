"""Triton's shared-memory extension cannot work across a network hop: tritonclient's
register / status / unregister calls get a clear refusal that says why, on both transports;
unknown /v2 paths are a 404 with a V2 error body (nothing is relayed blindly)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.gateway import GatewayProcess, gateway_config


@pytest.fixture(scope="module")
def gw(reference, tmp_path_factory):
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    cfg = gateway_config(backends, [{"model": "*", "backend": "ref"}])
    with GatewayProcess(cfg, tmp_path_factory.mktemp("shm"), "gw-shm") as g:
        yield g


@pytest.mark.parametrize("module, attr", [(httpclient, "http_url"), (grpcclient, "grpc_url")])
def test_shared_memory_calls_are_refused_with_the_reason(gw, module, attr):
    with module.InferenceServerClient(getattr(gw, attr)) as client:
        for call in (lambda: client.register_system_shared_memory("r", "/key", 64),
                     lambda: client.get_system_shared_memory_status(),
                     lambda: client.unregister_cuda_shared_memory("r")):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert "shared memory cannot cross the gateway" in str(info.value)
            status = info.value.status()
            assert status in ("400", "StatusCode.UNIMPLEMENTED"), status


def test_unknown_v2_path_is_a_404_with_an_error_body(gw):
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://{gw.http_url}/v2/no/such/thing", timeout=10)
    assert info.value.code == 404
    assert "error" in json.loads(info.value.read())
