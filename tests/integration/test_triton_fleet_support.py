"""The fleet-test support against a real Triton: a slow-loading repository, models loaded after
startup through the repository API, SIGKILL of Triton and its Python-backend stubs, and a restart
on the same ports (tests/support/triton.py, fleet.py, load.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.fleet import slow_repository
from tests.support.load import Load
from tests.support.procs import wait_for
from tests.support.triton import TritonRepositoryError, TritonServer

pytestmark = pytest.mark.triton

DELAY_S = 2.0
ADMIN = {"admin-key": "secret"}
RESTRICTED = [
    "--http-restricted-api=model-repository:admin-key=secret",
    "--grpc-restricted-protocol=model-repository:admin-key=secret",
]


@pytest.fixture(autouse=True)
def _needs_triton(triton_required: None) -> None:
    """Triton processes of this module's own (a skip on a developer machine, a failure in CI)."""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _loading(server: TritonServer, name: str) -> bool:
    return any(e["name"] == name and e.get("state") == "LOADING" for e in server.repository_index())


def test_slow_model_loads_after_start_and_again_after_kill_and_restart(tmp_path: Path) -> None:
    repo = slow_repository(tmp_path, ["slow_a", "slow_b"], DELAY_S)
    server = TritonServer(repo, startup_models=())
    server.start(tmp_path / "triton")
    try:
        assert server.live() and server.ready_models() == set() and not server.model_ready("slow_a")

        # Steady load on keep-alive connections while slow_a loads (through gRPC, which holds
        # nothing back): Triton refuses the model as unknown on both transports, at once.
        urls = {"http_url": server.http_url, "grpc_url": server.grpc_url}
        with Load(**urls, models=["slow_a"], http_concurrency=2, grpc_concurrency=2, pause_s=0.02) as load:
            load.wait_requests(8, timeout=30)
            loader = server.load_models_async(["slow_a"], transport="grpc")
            wait_for(lambda: _loading(server, "slow_a"), timeout=30, what="slow_a LOADING")
            assert server.live() and not server.model_ready("slow_a")
            loading = time.monotonic()
            wait_for(
                lambda: {"http", "grpc"} <= {g.transport for g in load.summary(since=loading).failures},
                timeout=30,
                what="refusals on both transports",
            )
            assert loader.is_alive(), "slow_a finished loading before both transports were refused"
            seconds = loader.result(timeout=60)["slow_a"]
            load.wait_requests(10, timeout=30, ok_only=True)
            summary = load.stop()
        assert DELAY_S * 0.9 <= seconds < DELAY_S + 15, seconds
        unknown = "Request for unknown model: 'slow_a' is not found"
        no_versions = "Request for unknown model: 'slow_a' has no available versions"
        groups = {(g.transport, g.outcome, g.message) for g in summary.failures}
        assert {("http", "404", no_versions), ("grpc", "NOT_FOUND", no_versions)} <= groups, summary.report()
        refusals = (("http", "404"), ("grpc", "NOT_FOUND"))
        assert groups <= {(t, o, m) for t, o in refusals for m in (unknown, no_versions)}, summary.report()
        assert summary.max_failed_latency < 1.0 and summary.slow == 0, summary.report()
        assert server.ready_models() == {"slow_a"} and server.model_ready("slow_a")

        ports = (server.http_port, server.grpc_port, server.metrics_port)
        pids = server.processes()
        assert server.pid in pids and len(pids) >= 2, pids  # tritonserver and slow_a's stub
        shm = server.shared_memory()
        assert shm, "the Python backend's shared memory regions were not found"
        assert server.kill() == -9
        assert not server.is_running() and not any(_alive(pid) for pid in pids)
        assert not any(os.path.exists(path) for path in shm), shm  # removed by kill(): Triton could not

        server.restart()
        assert (server.http_port, server.grpc_port, server.metrics_port) == ports
        assert server.live() and server.ready_models() == set()
        seconds = server.load_model("slow_a")
        assert DELAY_S * 0.9 <= seconds < DELAY_S + 15, seconds
        assert server.ready_models() == {"slow_a"}
        with Load(http_url=server.http_url, grpc_url=server.grpc_url, models=["slow_a"], max_requests=40) as load:
            after = load.wait_done(timeout=60)
        assert after.succeeded == 40, after.report()
    finally:
        server.stop()


def test_restricted_repository_api_needs_the_header(tmp_path: Path) -> None:
    repo = slow_repository(tmp_path, ["quick"], 0.0)
    server = TritonServer(repo, startup_models=(), extra_args=RESTRICTED)
    server.start(tmp_path / "triton")
    try:
        with pytest.raises(TritonRepositoryError) as denied:
            server.ready_models()
        assert denied.value.status == 403
        assert denied.value.body == b'{"error":"This API is restricted, expecting header \'admin-key\'"}'
        with pytest.raises(TritonRepositoryError):
            server.load_model("quick")
        assert server.ready_models(headers=ADMIN) == set()
        server.load_models_async(["quick"], headers=ADMIN).result(timeout=60)
        assert server.ready_models(headers=ADMIN) == {"quick"}
        assert server.model_ready("quick")  # readiness is not part of the restricted API
        with pytest.raises(TritonRepositoryError) as refused_load:
            server.load_model("quick", transport="grpc")
        assert refused_load.value.status == "UNAVAILABLE"
        server.load_model("quick", headers=ADMIN, transport="grpc")  # sent as triton-grpc-protocol-admin-key

        # gRPC: UNAVAILABLE (not PERMISSION_DENIED), and the metadata key carries a prefix.
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            index = service_pb2.RepositoryIndexRequest(ready=True)
            with pytest.raises(grpc.RpcError) as refused:
                stub.RepositoryIndex(index, metadata=(("admin-key", "secret"),), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert refused.value.details() == (
                "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
            )
            answer = stub.RepositoryIndex(index, metadata=(("triton-grpc-protocol-admin-key", "secret"),), timeout=10)
            assert [m.name for m in answer.models] == ["quick"]
    finally:
        server.stop()
