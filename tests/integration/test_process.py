"""The gateway as an operator runs it: workers, the demo command, metrics, SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from gateway import h2 as gh2
from gateway.grpcengine import ENGINE_OFF
from tests.support.clients import In, Out, infer, metadata, readiness
from tests.support.gateway import GatewayProcess, _PortFileProcess, gateway_config
from tests.support.procs import listening_ports, wait_for


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as fh:
            out.extend(int(c) for c in fh.read().split())
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
        return r.read().decode()


def add_sub_ok(kind: str, url: str) -> None:
    a = np.arange(16, dtype=np.float32)
    r = infer(kind, url, "add_sub", [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")],
              [Out("OUTPUT0", True), Out("OUTPUT1")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
    np.testing.assert_array_equal(r.outputs["OUTPUT1"], 0 * a)


def test_two_workers_share_both_ports(reference, tmp_path):
    backends = {"ref": {"protocol": "grpc", "endpoints": [reference.grpc_url]}}
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "ref"}, {"model": "*", "backend": "ref"}])
    # (With grpc's socket engine chosen: it must reach each worker before grpc loads there.)
    with GatewayProcess(cfg, tmp_path, "gw-workers", workers=2, env={"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0"}) as gw:
        workers = children(gw.proc.pid)
        assert len(workers) == 2
        for pid in workers:
            # Each worker listens on the same HTTP and gRPC ports itself (SO_REUSEPORT).
            ports = listening_ports(pid, include_children=False)
            assert {gw.ports["http"], gw.ports["grpc"]} <= ports, (pid, ports)
            # Each worker started with grpc's socket engine chosen (gateway/grpcengine.py):
            # its environment from its start, before grpc loaded in it.
            assert f"GRPC_EXPERIMENTS={ENGINE_OFF}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if not (gh2.native("server") and gh2.native("client")):  # (grpcio carries gRPC: its engine is named)
            assert "EventEngine off" in gw.log_tail(200)
        wait_for(lambda: readiness("http", gw.http_url, "add_sub")[1], timeout=20, what="ready")
        for _ in range(20):  # new connections each time: the kernel spreads them over both workers
            add_sub_ok("http", gw.http_url)
            add_sub_ok("grpc", gw.grpc_url)
        text = scrape(gw.metrics_url)
        # Metrics from both workers, aggregated by the supervisor.
        total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith('oip_gateway_requests_total{') and 'api="infer"' in line)
        assert total >= 40, text

        # A worker that dies is replaced, and the ports keep serving.
        os.kill(workers[0], signal.SIGKILL)
        wait_for(lambda: len(children(gw.proc.pid)) == 2 and workers[0] not in children(gw.proc.pid),
                 timeout=30, what="worker restart")
        add_sub_ok("grpc", gw.grpc_url)


def test_metrics_endpoint(reference, tmp_path):
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "ref"}], access_log=True)
    with GatewayProcess(cfg, tmp_path, "gw-metrics") as gw:
        add_sub_ok("http", gw.http_url)
        add_sub_ok("grpc", gw.grpc_url)
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException):
            infer("http", gw.http_url, "unrouted-model", [In("INPUT0", np.zeros(1, np.float32), "FP32")])
        text = scrape(gw.metrics_url)
        assert ('oip_gateway_requests_total{api="infer",backend="ref",code="200",protocol="http",route="add_sub"} 1.0'
                in text)
        assert ('oip_gateway_requests_total{api="infer",backend="ref",code="OK",protocol="grpc",route="add_sub"} 1.0'
                in text)
        assert 'oip_gateway_route_ready{backend="ref",route="add_sub"} 1.0' in text
        assert 'oip_gateway_conversions_total{backend="ref",direction="grpc_to_http"} 1.0' in text
        assert "oip_gateway_config_generation 1.0" in text
        # A model name a client made up never becomes a label value.
        assert "unrouted-model" not in text
        assert 'route="_unrouted"' in text
        assert "oip_gateway_upstream_duration_seconds_bucket" in text
        wait_for(lambda: "oip_gateway_ready 1.0" in scrape(gw.metrics_url), timeout=20, what="ready gauge")
        # The access log: one JSON object per request.
        entries = [json.loads(line.split("oip_gateway.access", 1)[1].split(": ", 1)[1])
                   for line in gw.log_tail(200).splitlines() if "oip_gateway.access" in line]
        by = {(e["protocol"], e["model"], e["api"]): e for e in entries}
        http_ok, grpc_ok = by[("http", "add_sub", "infer")], by[("grpc", "add_sub", "infer")]
        assert http_ok["status"] == 200 and http_ok["backend"] == "ref" and http_ok["protocol_out"] == "http"
        assert http_ok["endpoint"] == reference.http_url and http_ok["bytes_in"] > 0 and http_ok["bytes_out"] > 0
        assert grpc_ok["status"] == "OK" and grpc_ok["protocol_out"] == "http" and "reason" not in grpc_ok
        unrouted = by[("http", "unrouted-model", "infer")]
        assert unrouted["status"] == 404 and unrouted["route"] == "_unrouted" and "not routed" in unrouted["reason"]
        assert all(e["duration_ms"] >= 0 and e["time"].endswith("+00:00") for e in entries)


def test_sigterm_stops_cleanly(reference, tmp_path):
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    gw = GatewayProcess(gateway_config(backends, [{"model": "add_sub", "backend": "ref"}]), tmp_path, "gw-term")
    gw.start()
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=20) == 0
    assert "Traceback" not in gw.log_tail(200)


def test_demo_command(tmp_path):
    """`oip-gateway demo` serves the built-in models through the gateway on the ports it is given."""
    demo = _PortFileProcess(["demo", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                             "--metrics", "127.0.0.1:0"], tmp_path, "demo")
    with demo:
        for kind, url in (("http", demo.http_url), ("grpc", demo.grpc_url)):
            assert readiness(kind, url, "add_sub") == (True, True, True)
            add_sub_ok(kind, url)
            words = np.array([b"abc", b"xy"], dtype=object)
            r = infer(kind, url, "string_reverse", [In("INPUT0", words, "BYTES")])
            assert r.outputs["OUTPUT0"].tolist() == [b"cba", b"yx"]
            assert metadata(kind, url)["name"] == "oip-gateway"
        assert "oip_gateway_requests_total" in scrape(demo.metrics_url)


def test_check_command_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("backends: {t: {protocol: grpc, endpoints: ['h:1']}}\nroutes: [{model: m, backend: t}]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: {t: {protocol: grpc, endpoints: ['h:1'], colour: red}}\nroutes: []\n")
    run = lambda f: subprocess.run([sys.executable, "-m", "gateway", "check", str(f)],
                                   capture_output=True, text=True, timeout=60)
    assert run(good).returncode == 0
    r = run(bad)
    assert r.returncode == 1
    assert "backends.t.colour" in r.stderr and "routes" in r.stderr


def test_port_taken_is_a_clear_error(reference, tmp_path):
    """A single-process gateway does not silently share a port someone else listens on."""
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    with GatewayProcess(gateway_config(backends, [{"model": "add_sub", "backend": "ref"}]), tmp_path, "gw-a") as a:
        cfg = gateway_config(backends, [{"model": "add_sub", "backend": "ref"}])
        cfg["listen"]["http"] = a.http_url
        path = tmp_path / "b.yaml"
        import yaml

        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert f"cannot listen on {a.http_url}" in r.stderr and "Traceback" not in r.stderr


def test_sigterm_drains_when_configured(reference, tmp_path):
    """drain_s: after SIGTERM the gateway says 'not ready' yet still serves, then exits cleanly."""
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    # A drain long enough that the checks below run inside it even on a slow machine.
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "ref"}], drain_s=8)
    gw = GatewayProcess(cfg, tmp_path, "gw-drain").start()
    wait_for(lambda: readiness("http", gw.http_url, "add_sub")[1], timeout=20, what="ready")
    gw.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: not readiness("http", gw.http_url, "add_sub")[1], timeout=5, what="not ready")
    add_sub_ok("http", gw.http_url)  # new requests are still served while draining
    add_sub_ok("grpc", gw.grpc_url)
    assert gw.proc.wait(timeout=30) == 0


def test_server_metadata_presents_the_configured_name(reference, tmp_path):
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "ref"}],
                         server={"name": "triton", "version": "2.51.0"})
    with GatewayProcess(cfg, tmp_path, "gw-name") as gw:
        for kind, url in (("http", gw.http_url), ("grpc", gw.grpc_url)):
            meta = metadata(kind, url)
            assert (meta["name"], meta["version"]) == ("triton", "2.51.0")
            assert "binary_tensor_data" in meta["extensions"]  # the true list, whatever the name
