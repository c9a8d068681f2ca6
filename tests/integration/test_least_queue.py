"""balance: least_queue with two real Tritons: the gateway reads each one's queue from its
metrics port and sends requests to the one with the shorter queue; a backend whose metrics port
is closed falls back to least-request and every request still succeeds. (How much it helps
under load is a benchmark: benchmarks/least_queue.py.)"""
from __future__ import annotations

import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.codec.queue_metrics import parse_pending
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer, triton_available

pytestmark = pytest.mark.triton

SLEEPY = '''
import time
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.sleep_s = float(params["sleep_s"]["string_value"])

    def execute(self, requests):
        time.sleep(self.sleep_s * len(requests))
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''


def repository(root: Path, sleep_s: float) -> Path:
    """A repository with one model, 'work', that takes ``sleep_s`` per request (one instance:
    requests queue behind each other)."""
    model = root / "work"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SLEEPY)
    (model / "config.pbtxt").write_text(f'''name: "work"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
parameters {{ key: "sleep_s" value {{ string_value: "{sleep_s}" }} }}
''')
    return root


@pytest.fixture(scope="module")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, TritonServer]]:
    reason = triton_available()
    if reason is not None:
        pytest.skip(f"Triton unavailable: {reason}")
    root = tmp_path_factory.mktemp("least-queue")
    a = TritonServer(repository(root / "repo-a", 0.0))
    b = TritonServer(repository(root / "repo-b", 0.5))
    a.start(root / "a")
    b.start(root / "b")
    yield a, b
    a.stop()
    b.stop()


def count(t: TritonServer) -> int:
    stats = httpclient.InferenceServerClient(t.http_url).get_inference_statistics("work")
    return sum(s["inference_count"] for s in stats["model_stats"])


def pending(t: TritonServer) -> float:
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=5) as r:
        return parse_pending(r.read()).get(("work", ""), 0.0)


def scrapes(gw: GatewayProcess, result: str) -> float:
    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("oip_gateway_queue_scrapes_total{") and f'result="{result}"' in line)


def gateway(root: Path, tritons, metrics_ports: tuple[int, int]) -> GatewayProcess:
    a, b = tritons
    endpoints = [{"address": t.grpc_url, "metrics_port": port} for t, port in zip((a, b), metrics_ports)]
    backends = {"fleet": {"protocol": "grpc", "endpoints": endpoints, "balance": "least_queue",
                          "queue_metrics": {"interval_s": 0.1}}}
    gw = GatewayProcess(gateway_config(backends, [{"model": "work", "backend": "fleet"}]), root, "gw-lq")
    gw.start()
    wait_for(lambda: httpclient.InferenceServerClient(gw.http_url).is_server_ready(), timeout=30,
             what="gateway readiness")
    return gw


def infer(url: str, n: int) -> None:
    c = grpcclient.InferenceServerClient(url)
    i = grpcclient.InferInput("INPUT0", [2], "FP32")
    i.set_data_from_numpy(np.ones(2, dtype=np.float32))
    for _ in range(n):
        c.infer("work", [i])
    c.close()


def test_requests_go_to_the_shorter_queue(tritons, tmp_path):
    a, b = tritons
    gw = gateway(tmp_path, tritons, (int(a.metrics_url.rsplit(":", 1)[1]), int(b.metrics_url.rsplit(":", 1)[1])))
    client = grpcclient.InferenceServerClient(b.grpc_url)
    done: queue.Queue = queue.Queue()
    try:
        # A backlog on b, made directly (0.5 s per request, one instance).
        i = grpcclient.InferInput("INPUT0", [2], "FP32")
        i.set_data_from_numpy(np.ones(2, dtype=np.float32))
        for _ in range(12):
            client.async_infer("work", [i], callback=lambda result, error: done.put(error))
        wait_for(lambda: pending(b) >= 6, timeout=30, what="b's queue to build up")
        seen = scrapes(gw, "ok")
        wait_for(lambda: scrapes(gw, "ok") >= seen + 4, timeout=30, what="two fresh scrapes of both")
        before = count(a), count(b)
        infer(gw.grpc_url, 20)  # round robin would send 10 of these behind b's backlog
        assert count(a) - before[0] == 20
        assert pending(b) > 0, "b's backlog drained during the test: nothing was shown"
    finally:
        errors = [done.get(timeout=60) for _ in range(12)]
        client.close()
        gw.stop()
    assert errors == [None] * 12


def test_metrics_port_down_falls_back_without_errors(tritons, tmp_path, black_hole):
    a, b = tritons
    import socket
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    hole = int(black_hole.rsplit(":", 1)[1])  # and one that never answers
    gw = gateway(tmp_path, tritons, (port, hole))
    try:
        before = count(a) + count(b)
        infer(gw.grpc_url, 10)
        assert count(a) + count(b) - before == 10
        wait_for(lambda: scrapes(gw, "failed") >= 4, timeout=30, what="failed scrapes counted")
        assert scrapes(gw, "ok") == 0
    finally:
        gw.stop()
