"""Fleet-grade backends against real Triton processes, faults injected for real.

Two Triton endpoints behind one HTTP backend and one gRPC backend; steady load over both client
transports (so pass-through and conversion both run); one Triton is SIGKILLed and restarted
with models that take seconds to load — its ports open and server-live answers long before
its models are ready. No client may see "unknown model" (404 / NOT_FOUND); only requests in
flight on the killed endpoint may fail, and fast; the endpoint takes traffic again once its
models are ready.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.fleet import slow_repository
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.load import Load
from tests.support.procs import wait_for
from tests.support.triton import TritonServer

pytestmark = pytest.mark.triton

LOAD_DELAY_S = 3.0
MODELS = ["fleet_h", "fleet_g"]  # routed to the HTTP backend and to the gRPC backend
# Outcomes a client may see when its request was in flight on the killed endpoint.
ALLOWED_FAILURES = {"502", "503", "UNAVAILABLE", "INTERNAL"}


@pytest.fixture(autouse=True)
def _needs_triton(triton_required: None) -> None:
    """Triton processes of this module's own (a skip on a developer machine, a failure in CI)."""


def inference_count(server: TritonServer, model: str) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.loads(r.read())["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def test_kill_and_restart_one_of_two_tritons_under_load(tmp_path: Path) -> None:
    repo = slow_repository(tmp_path, MODELS, LOAD_DELAY_S)
    a, b = TritonServer(repo), TritonServer(repo)
    a.start(tmp_path / "a")
    b.start(tmp_path / "b")
    try:
        backends = {
            "th": {"protocol": "http", "endpoints": [a.http_url, b.http_url]},
            "tg": {"protocol": "grpc", "endpoints": [a.grpc_url, b.grpc_url]},
        }
        routes = [{"model": "fleet_h", "backend": "th"}, {"model": "fleet_g", "backend": "tg"}]
        cfg = gateway_config(backends, routes, health={"interval_s": 0.5, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-fleet") as gw:
            wait_for(lambda: urllib.request.urlopen(f"http://{gw.http_url}/v2/health/ready", timeout=5).status == 200,
                     timeout=30, what="gateway ready")
            with Load(http_url=gw.http_url, grpc_url=gw.grpc_url, models=MODELS, http_concurrency=3,
                      grpc_concurrency=3, pause_s=0.005, max_seconds=240, timeout_s=20) as load:
                load.wait_requests(200, timeout=60, ok_only=True)
                before = {m: inference_count(a, m) for m in MODELS}
                assert all(before.values()), f"both endpoints take traffic before the kill: {before}"

                killed = time.monotonic()
                a.kill()
                # Restarted with nothing loaded: live at once, models ready seconds later.
                a.startup_models = ()
                a.restart()
                restarted = time.monotonic()
                assert a.live() and a.ready_models() == set()
                load.wait_requests(100, timeout=60)  # traffic goes on meanwhile
                loader = a.load_models_async(MODELS, transport="grpc")
                loader.result(timeout=120)
                ready_at = time.monotonic()
                # Back in the backend: the restarted endpoint serves both backends again.
                wait_for(lambda: all(inference_count(a, m) > 0 for m in MODELS), timeout=30,
                         what="the restarted endpoint to take traffic again")
                back = time.monotonic()
                load.wait_requests(100, timeout=60, ok_only=True)
                summary = load.stop()
        report = summary.report()
        print(report)
        print(f"killed at 0 s; restarted +{restarted - killed:.2f} s; models ready +{ready_at - killed:.2f} s; "
              f"traffic back +{back - killed:.2f} s")
        assert summary.succeeded > 400, report
        bad = [g for g in summary.failures if g.outcome not in ALLOWED_FAILURES]
        assert not bad, f"clients saw other failures than the killed endpoint's in-flight ones:\n{report}"
        # Only requests in flight at the kill may fail, and fast (no hang).
        assert summary.failed <= 2 * 6, report
        assert all(g.max_latency < 2.0 for g in summary.failures), report
    finally:
        a.stop()
        b.stop()
