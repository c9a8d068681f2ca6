"""``balance: least_request`` through a real gateway: with one endpoint busy on a slow
request, new requests go to the idle endpoint instead of queueing behind it (round robin
would send every other one there)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.support.clients import In, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.scripted import ScriptedHttp


@pytest.fixture
def slow_backend():
    """A healthy HTTP endpoint (health and readiness GETs answer 200 at once) whose
    inference answers wait until ``release`` is set; ``posts`` counts inference requests."""
    release = threading.Event()
    posts: list[int] = []

    def on_post(request_line: str, headers: dict[str, str], body: bytes) -> bytes:
        posts.append(1)
        release.wait(30)
        return b'{"model_name":"add_sub","outputs":[]}'

    server = ScriptedHttp(on_post)
    yield server.address, release, posts
    release.set()
    server.close()


def _ready(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as r:
        return r.status == 200


def test_least_request_avoids_the_busy_endpoint(reference, slow_backend, tmp_path):
    slow, release, posts = slow_backend
    backends = {"b": {"protocol": "http", "endpoints": [slow, reference.http_url], "balance": "least_request"}}
    # One health round at start-up, then none during the test: a probe in flight would
    # count as load on its endpoint.
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "b"}], health={"interval_s": 60, "timeout_s": 2})
    with GatewayProcess(cfg, tmp_path, "gw-lr") as g:
        wait_for(lambda: _ready(g.http_url), timeout=10, what="the first health round")
        a = np.arange(4, dtype=np.float32)
        ins = [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")]
        # Ties go in round-robin order, so the first request goes to the slow endpoint and stays there.
        held = threading.Thread(target=lambda: infer("http", g.http_url, "add_sub", ins))
        held.start()
        try:
            wait_for(lambda: len(posts) == 1, timeout=10, what="the first request to reach the slow endpoint")
            for _ in range(6):
                r = infer("http", g.http_url, "add_sub", ins)
                np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
            assert len(posts) == 1  # none of the six went to the busy endpoint
        finally:
            release.set()
            held.join(timeout=30)
