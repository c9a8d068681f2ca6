"""Memory comes back: after a burst of large requests through a gRPC backend (HTTP clients, binary
extension or plain JSON, converted; gRPC clients, ModelInfer and ModelStreamInfer, passed through) to real Triton drove
the gateway's RSS up, it returns to near its idle level within 30 s of the burst ending — the allocator keeps freed
buffers while large requests come (their speed: gateway/malloc.py) and gives them back once
they stop. Whether the clients close their connections after the burst or keep them open (``held``):
grpc's read-ahead on a connection stays allocated while the connection does, and is capped.

The issue's bound is 50 MB over idle; the gateway gives back all but ~1 MB, so the test holds it
to ``SLACK``: with two malloc arenas (before session 17) the second one's top, where grpc's
threads put message buffers, kept ~56 MB after these bursts — a bound at 50 MB would catch that
only just."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from gateway import h2
from tests.support import burst
from tests.support.clients import In, Out, infer, stream_infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

MB = 1_000_000


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture()
def gw(triton, tmp_path_factory):  # one per case: each starts from its own idle level
    backends = {"t": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    cfg = gateway_config(backends, [{"model": "identity_FP32", "backend": "t"}])
    with GatewayProcess(cfg, tmp_path_factory.mktemp("memory"), "gw-memory") as g:
        yield g


SLACK = 32 * MB
JSON_MB = 4
# What stays after a burst besides the trim's work: grpc's read-ahead on each connection, capped at
# 1 MiB a connection (gateway/grpcengine.py READ_BUFFER_CAP). Uncapped, a ModelStreamInfer burst left
# up to 73 MB on the one backend connection, and 16 clients keeping their connections open +67 MB.


@pytest.mark.parametrize("held", [False, True], ids=["closed", "held"])
@pytest.mark.parametrize("client", ["http", "json", "grpc", "stream"])
def test_rss_returns_after_a_burst(gw, client, held):
    """``held``: the 16 clients keep their connections (one each) open after the burst, as a
    service keeping its clients would; RSS is judged while they are still connected."""
    assert gw.proc is not None
    pid = gw.proc.pid
    url = gw.http_url if client in ("http", "json") else gw.grpc_url
    small = np.ones((1, 16), dtype=np.float32)
    for _ in range(20):
        if client == "stream":
            stream_infer(url, small, 2)
        else:
            binary = client != "json"
            infer("http" if client == "json" else client, url, "identity_FP32",
                  [In("INPUT0", small, "FP32", binary)], [Out("OUTPUT0", binary)])
    idle = rss(pid)
    peak = idle
    # 16 clients × 2 requests of 16 MB each way, from a process of their own (tests/support/burst.py);
    # JSON: 4 MB tensors, ~19 MB of JSON text each way (encoded once by the burst's process),
    # converted to gRPC and back by the gateway.
    mb = JSON_MB if client == "json" else 16
    load = burst.start(client, url, mb=mb, clients=16, count=2, hold=held)
    try:
        deadline = time.monotonic() + 300
        while load.running() and time.monotonic() < deadline:
            peak = max(peak, rss(pid))
            time.sleep(0.05)  # sampling RSS while the burst runs, not waiting on it (wait() below is)
        outcomes = load.wait(timeout=60)
        assert outcomes == ["200"] * 32, outcomes
        if client == "grpc" and h2.native("server") and h2.native("client"):
            # Pass-through on the gateway's own HTTP/2 streams both ways (frontend/h2upload.py,
            # backends/h2stream.py Relay): 1 GB passed through, about a window per call held.
            assert peak < idle + 64 * MB, f"a streamed gRPC burst drove RSS up ({idle} → {peak})"
        else:
            assert peak > idle + 64 * MB, f"the burst did not drive RSS up ({idle} → {peak}): nothing shown"
        try:
            wait_for(lambda: rss(pid) <= idle + SLACK, timeout=30, what="RSS back near idle")
        except TimeoutError:
            pytest.fail(f"RSS not back within {SLACK // MB} MB of idle 30 s after the burst: idle {idle / MB:.0f} MB, "
                        f"peak {peak / MB:.0f} MB, now {rss(pid) / MB:.0f} MB")
    finally:
        load.release()
    # Still serving, and as fast a path as before: the tuning is not turned off by the trim.
    assert burst.start(client, url, mb=mb, clients=1, count=1).wait(timeout=60) == ["200"]
