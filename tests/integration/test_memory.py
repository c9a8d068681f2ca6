"""Memory comes back: after a burst of large converted requests (HTTP binary client → gRPC
pool → real Triton) drove the gateway's RSS up, it returns to within 50 MB of its idle level
within 30 s of the burst ending — the allocator keeps freed buffers while large requests
come (their speed: gateway/malloc.py) and gives them back once they stop."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.support.clients import In, Out, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

MB = 1_000_000


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def gw(triton, tmp_path_factory):
    backends = {"t": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    cfg = gateway_config(backends, [{"model": "identity_FP32", "backend": "t"}])
    with GatewayProcess(cfg, tmp_path_factory.mktemp("memory"), "gw-memory") as g:
        yield g


def test_rss_returns_after_a_burst(gw):
    assert gw.proc is not None
    pid = gw.proc.pid
    small = np.ones((1, 16), dtype=np.float32)
    for _ in range(20):
        infer("http", gw.http_url, "identity_FP32", [In("INPUT0", small, "FP32")], [Out("OUTPUT0")])
    idle = rss(pid)
    big = np.arange(2_000_000, dtype=np.float32).reshape(1, -1)  # 8 MB each way
    peak = [idle]
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(3):
                r = infer("http", gw.http_url, "identity_FP32", [In("INPUT0", big, "FP32")], [Out("OUTPUT0")])
                assert r.outputs["OUTPUT0"].shape == big.shape
                peak[0] = max(peak[0], rss(pid))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert peak[0] > idle + 100 * MB, f"the burst did not drive RSS up ({idle} → {peak[0]}): nothing shown"
    wait_for(lambda: rss(pid) <= idle + 50 * MB, timeout=30,
             what=f"RSS back within 50 MB of idle ({idle / MB:.0f} MB; peak {peak[0] / MB:.0f} MB)")
    # Still serving, and as fast a path as before: the tuning is not turned off by the trim.
    r = infer("http", gw.http_url, "identity_FP32", [In("INPUT0", big, "FP32")], [Out("OUTPUT0")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], big)
