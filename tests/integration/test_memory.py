"""Memory comes back: after a burst of large requests through a gRPC pool (HTTP binary clients,
converted; gRPC clients, ModelInfer and ModelStreamInfer, passed through) to real Triton drove
the gateway's RSS up, it returns to near its idle level within 30 s of the burst ending — the allocator keeps freed
buffers while large requests come (their speed: gateway/malloc.py) and gives them back once
they stop.

The issue's bound is 50 MB over idle; the gateway gives back all but ~1 MB, so the test holds it
to ``SLACK``: with two malloc arenas (before session 17) the second one's top, where grpc's
threads put message buffers, kept ~56 MB after these bursts — a bound at 50 MB would catch that
only just."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

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
# After ModelStreamInfer bursts grpc's own objects stay alive for a while (up to ~40 MB here,
# in use at the allocator, given back by later traffic, not growing with more bursts): the
# issue's 50 MB. What the stream case guards is the trim itself — without it RSS stayed
# ~430 MB up.
STREAM_SLACK = 50 * MB


@pytest.mark.parametrize("client", ["http", "grpc", "stream"])
def test_rss_returns_after_a_burst(gw, client):
    assert gw.proc is not None
    pid = gw.proc.pid
    url = gw.http_url if client == "http" else gw.grpc_url
    small = np.ones((1, 16), dtype=np.float32)
    for _ in range(20):
        if client == "stream":
            stream_infer(url, small, 2)
        else:
            infer(client, url, "identity_FP32", [In("INPUT0", small, "FP32")], [Out("OUTPUT0")])
    idle = rss(pid)
    big = np.arange(4_000_000, dtype=np.float32).reshape(1, -1)  # 16 MB each way
    peak = [idle]
    errors: list[BaseException] = []

    def one_client() -> None:
        try:
            if client == "stream":  # ModelStreamInfer: the same bytes, two requests on one stream
                outs = stream_infer(url, big, 2)
                assert len(outs) == 2 and all(o.size == big.size for o in outs)
                peak[0] = max(peak[0], rss(pid))
                return
            for _ in range(2):
                r = infer(client, url, "identity_FP32", [In("INPUT0", big, "FP32")], [Out("OUTPUT0")])
                assert r.outputs["OUTPUT0"].shape == big.shape
                peak[0] = max(peak[0], rss(pid))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one_client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert peak[0] > idle + 100 * MB, f"the burst did not drive RSS up ({idle} → {peak[0]}): nothing shown"
    slack = STREAM_SLACK if client == "stream" else SLACK
    try:
        wait_for(lambda: rss(pid) <= idle + slack, timeout=30, what="RSS back near idle")
    except TimeoutError:
        pytest.fail(f"RSS not back within {slack // MB} MB of idle 30 s after the burst: idle {idle / MB:.0f} MB, "
                    f"peak {peak[0] / MB:.0f} MB, now {rss(pid) / MB:.0f} MB")
    # Still serving, and as fast a path as before: the tuning is not turned off by the trim.
    if client == "stream":
        np.testing.assert_array_equal(stream_infer(url, big, 1)[0], big.ravel())
    else:
        r = infer(client, url, "identity_FP32", [In("INPUT0", big, "FP32")], [Out("OUTPUT0")])
        np.testing.assert_array_equal(r.outputs["OUTPUT0"], big)

