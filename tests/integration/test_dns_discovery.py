"""DNS discovery against a real DNS server (Debian's dnsmasq on loopback) whose records
change under load: the backend follows them — a new address takes traffic once checked ready,
a removed one stops taking new requests — and no request is lost.

Two real V2 servers (the built-in reference server) listen on the same port at 127.0.0.2
and 127.0.0.3, as two pods of a Kubernetes headless Service would on their own IPs.
"""
from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from tests.support.dnsmasq import Dnsmasq, dnsmasq_available
from tests.support.gateway import GatewayProcess, _PortFileProcess, gateway_config
from tests.support.load import Load
from tests.support.procs import wait_for

NAME = "triton-headless.models.svc.cluster.local"


@pytest.fixture
def dnsmasq(tmp_path: Path):
    reason = dnsmasq_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"dnsmasq must run in CI: {reason}")
        pytest.skip(f"dnsmasq unavailable: {reason}")
    with Dnsmasq(tmp_path / "dns") as server:
        yield server


def reference_on(ip: str, port: int, workdir: Path, name: str) -> _PortFileProcess:
    return _PortFileProcess(["reference", "--http", f"{ip}:{port}", "--grpc", f"{ip}:0", "--metrics", f"{ip}:0"],
                            workdir, name).start()


def infer_count(server: _PortFileProcess, ip: str) -> int:
    with urllib.request.urlopen(f"http://{ip}:{server.ports['metrics']}/metrics", timeout=10) as r:
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith("oip_gateway_requests_total{") and 'api="infer"' in line))


def test_backend_follows_dns_records_under_load(dnsmasq, tmp_path: Path) -> None:
    first = reference_on("127.0.0.2", 0, tmp_path, "ref-2")
    port = first.ports["http"]
    second = reference_on("127.0.0.3", port, tmp_path, "ref-3")
    try:
        dnsmasq.set_records(NAME, ["127.0.0.2"])
        ns_ip, ns_port = dnsmasq.address
        backends = {"pods": {"protocol": "http", "endpoints": [{"dns": f"{NAME}:{port}"}]}}
        cfg = gateway_config(backends, [{"model": "add_sub", "backend": "pods"}],
                             dns={"nameservers": [f"{ns_ip}:{ns_port}"], "refresh_s": 0.3, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-dns") as gw, \
                Load(http_url=gw.http_url, grpc_url=gw.grpc_url, models=["add_sub"], http_concurrency=2,
                     grpc_concurrency=2, pause_s=0.005, max_seconds=120) as load:
            load.wait_requests(100, timeout=60, ok_only=True)
            assert infer_count(first, "127.0.0.2") > 0 and infer_count(second, "127.0.0.3") == 0

            # A second pod appears: it takes traffic (once checked ready).
            dnsmasq.set_records(NAME, ["127.0.0.2", "127.0.0.3"])
            wait_for(lambda: infer_count(second, "127.0.0.3") > 20, timeout=20, what="the new address to take traffic")

            # The first pod goes away: it stops taking requests; those in flight finish.
            dnsmasq.set_records(NAME, ["127.0.0.3"])

            def first_idle() -> bool:
                before = infer_count(first, "127.0.0.2")
                load.wait_requests(50, timeout=30)
                return infer_count(first, "127.0.0.2") == before

            wait_for(first_idle, timeout=20, what="the removed address to stop taking traffic")
            # A DNS failure (the server stops) keeps the last known addresses.
            dnsmasq.stop()
            load.wait_requests(200, timeout=60)
            summary = load.stop()
        report = summary.report()
        print(report)
        assert summary.failed == 0, report
        assert summary.succeeded > 300, report
    finally:
        first.stop()
        second.stop()
