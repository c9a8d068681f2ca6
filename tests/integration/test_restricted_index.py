"""Triton with a restricted repository API (``--http-restricted-api`` /
``--grpc-restricted-protocol``, as pytriton-launched servers always run): the health
checker reads the repository index with the configured header (value from an environment
variable), and falls back to per-model ready calls when it has none.

What tells the two apart from outside: a glob-routed model that Triton has in its
repository but has not loaded. With the index the gateway knows it (listed, not ready) and
answers 503 "not ready"; without it the model is unknown to the gateway, which lets Triton
answer for itself (its own "unknown model").
"""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import _unavailable
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer, triton_available

pytestmark = pytest.mark.triton

KEY = "s3cret-admin-key"
RESTRICTED = [f"--http-restricted-api=model-repository:admin-key={KEY}",
              f"--grpc-restricted-protocol=model-repository:admin-key={KEY}"]


@pytest.fixture(scope="module")
def restricted_triton(tmp_path_factory: pytest.TempPathFactory):
    reason = triton_available()
    if reason is not None:
        _unavailable("Triton", reason)
    server = TritonServer(extra_args=RESTRICTED, startup_models=["add_sub"])
    server.start(tmp_path_factory.mktemp("restricted"))
    try:
        yield server
    finally:
        server.stop()


def status(url: str, model: str) -> tuple[int, str]:
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"INT32","data":[1,2]}]}'
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_index_read_with_the_configured_header(restricted_triton, tmp_path: Path, protocol: str) -> None:
    url = restricted_triton.http_url if protocol == "http" else restricted_triton.grpc_url
    backends = {"t": {"protocol": protocol, "endpoints": [url],
                      "check_headers": {"admin-key": {"env": "TRITON_ADMIN_KEY"}}}}
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "t"}, {"model": "*", "backend": "t"}])
    with GatewayProcess(cfg, tmp_path, f"gw-key-{protocol}", env={"TRITON_ADMIN_KEY": KEY}) as gw:
        wait_for(lambda: status(gw.http_url, "add_sub")[0] == 400, timeout=30, what="add_sub routed")  # bad input
        code, text = status(gw.http_url, "identity_INT32")  # in the repository, not loaded
        assert code == 503 and "not ready on any endpoint" in text, (code, text)
        assert KEY not in gw.log_tail(500)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refused_index_falls_back_to_per_model_calls(restricted_triton, tmp_path: Path, protocol: str) -> None:
    url = restricted_triton.http_url if protocol == "http" else restricted_triton.grpc_url
    cfg = gateway_config({"t": {"protocol": protocol, "endpoints": [url]}},
                         [{"model": "add_sub", "backend": "t"}, {"model": "*", "backend": "t"}])
    with GatewayProcess(cfg, tmp_path, f"gw-nokey-{protocol}") as gw:
        # Ready all the same: add_sub is checked with a per-model ready call.
        wait_for(lambda: urllib.request.urlopen(f"http://{gw.http_url}/v2/health/ready", timeout=5).status == 200,
                 timeout=30, what="readiness through per-model calls")
        code, text = status(gw.http_url, "identity_INT32")
        assert code != 503 and "unknown model" in text.lower(), (code, text)  # Triton's own answer
