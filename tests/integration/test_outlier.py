"""Passive outlier ejection and safe retries through a real gateway: one endpoint of a backend
passes every health check but resets each inference connection before answering (a broken
pod behind a healthy sidecar). Clients never see it — each such request is retried on the
good endpoint — and after ``consecutive_failures`` of them the endpoint is ejected."""
from __future__ import annotations

import urllib.request

import numpy as np

from tests.support.clients import In, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.scripted import ScriptedHttp


class ResettingBackend:
    """Health and readiness GETs answer 200; the repository index 404 (none); every
    inference POST is read and the connection reset (RST) without a byte of answer."""

    def __init__(self) -> None:
        self.resets = 0
        self._server = ScriptedHttp(self._on_post)
        self.address = self._server.address

    def _on_post(self, request_line: str, headers: dict[str, str], body: bytes) -> bytes | None:
        self.resets += 1
        return None

    def close(self) -> None:
        self._server.close()


def metric_lines(g: GatewayProcess, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(name)]


def test_resetting_endpoint_is_retried_around_then_ejected(reference, tmp_path):
    bad = ResettingBackend()
    try:
        backends = {"b": {"protocol": "http", "endpoints": [bad.address, reference.http_url],
                             "outlier": {"consecutive_failures": 3, "base_ejection_s": 60}}}
        cfg = gateway_config(backends, [{"model": "add_sub", "backend": "b"}],
                             health={"interval_s": 0.2, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-outlier") as g:
            a = np.arange(4, dtype=np.float32)
            ins = [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")]
            sent = 0

            def ejected() -> bool:
                nonlocal sent
                for _ in range(5):
                    r = infer("http", g.http_url, "add_sub", ins)  # raises on any error
                    np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
                    sent += 1
                return any(f'endpoint="{bad.address}"' in line and line.endswith(" 1.0")
                           for line in metric_lines(g, "oip_gateway_endpoint_ejected"))

            wait_for(ejected, timeout=30, interval=0.05, what="the resetting endpoint to be ejected")
            assert bad.resets >= 3
            events = metric_lines(g, "oip_gateway_backend_events_total")
            assert any('event="ejection"' in line and not line.endswith(" 0.0") for line in events), events
            assert any('event="retry"' in line and not line.endswith(" 0.0") for line in events), events
            # Ejected: it gets no more inference requests, though its health checks pass.
            before = bad.resets
            for _ in range(20):
                infer("http", g.http_url, "add_sub", ins)
            assert bad.resets == before
            print(f"{sent} requests all answered; {before} resets retried; ejected")
    finally:
        bad.close()
