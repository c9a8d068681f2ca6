"""Requests leave no garbage in reference cycles: what one request builds is freed by reference
counting when it ends. Every cycle left per request would be walked and freed by the cyclic
collector instead — at 13 objects a gRPC call that was 7 µs of a 180 µs call (docs/design-notes.md,
"No reference cycle per gRPC call").

The gateway runs with tests/support/gcprobe on its PYTHONPATH, which counts what one collection
finds unreachable; the clients keep their connections open, so a connection's own objects are
not counted.
"""
from __future__ import annotations

import json
import os
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

PROBE = Path(__file__).resolve().parent.parent / "support" / "gcprobe"
CALLS = 200  # per client


def garbage(directory: Path) -> dict:
    out = directory / "garbage.json"
    out.unlink(missing_ok=True)
    (directory / "collect").touch()
    wait_for(out.exists, timeout=30, what="the gc probe's answer")
    return json.loads(out.read_text())


A = np.arange(16, dtype=np.float32)
B = np.full(16, 0.5, dtype=np.float32)


def inputs(module) -> list:
    out = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
    for tensor, values in zip(out, (A, B)):
        if module is httpclient:
            tensor.set_data_from_numpy(values, binary_data=False)
        else:
            tensor.set_data_from_numpy(values)
    return out


def add_sub(client, module) -> None:
    result = client.infer("add_sub", inputs(module))
    assert np.array_equal(result.as_numpy("OUTPUT0"), A + B)


def streamed(client, answers: queue.Queue, n: int) -> None:
    """``n`` requests on the client's open ModelStreamInfer stream, each answered in turn."""
    for _ in range(n):
        client.async_stream_infer("add_sub", inputs(grpcclient))
        result, error = answers.get(timeout=30)
        assert error is None, error
        assert np.array_equal(result.as_numpy("OUTPUT0"), A + B)


@pytest.mark.parametrize("pool", ["grpc", "http"])
def test_requests_leave_no_cyclic_garbage(reference, tmp_path: Path, pool: str) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    backends = {pool: {"protocol": pool, "endpoints": [reference.grpc_url if pool == "grpc" else reference.http_url]}}
    # Health rounds far apart: an error a round meets (this server has no repository index) leaves
    # its traceback in a cycle, once a round, not once a request.
    cfg = gateway_config(backends, [{"model": "*", "backend": pool}], health={"interval_s": 60.0, "timeout_s": 1.0})
    path = os.pathsep.join([str(PROBE), *filter(None, [os.environ.get("PYTHONPATH")])])
    gw = GatewayProcess(cfg, tmp_path, f"gc-{pool}", env={"PYTHONPATH": path, "OIP_TEST_GC_PROBE": str(probe)})
    with gw, grpcclient.InferenceServerClient(gw.grpc_url) as g, \
            httpclient.InferenceServerClient(gw.http_url) as h:
        wait_for(lambda: h.is_model_ready("add_sub"), timeout=30, what="add_sub ready through the gateway")
        answers: queue.Queue = queue.Queue()
        if pool == "grpc":  # (ModelStreamInfer is passed through to gRPC pools)
            g.start_stream(callback=lambda result, error: answers.put((result, error)))
        for _ in range(20):  # first requests build what stays (handlers, metric children, pools)
            add_sub(g, grpcclient)
            add_sub(h, httpclient)
        if pool == "grpc":
            streamed(g, answers, 20)
        garbage(probe)  # from here on the probe's collections are the only ones
        for _ in range(CALLS):
            add_sub(g, grpcclient)
            add_sub(h, httpclient)
        if pool == "grpc":
            streamed(g, answers, CALLS)
        left = garbage(probe)
        if pool == "grpc":
            g.stop_stream()
    # A few dozen objects are built once (lazily, by the first requests); a cycle per request
    # would leave 2 × CALLS at least.
    assert left["count"] < CALLS // 2, left
