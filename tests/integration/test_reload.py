"""Hot reload under load, against a real Triton: SIGHUP and ``--watch`` (a rewritten file,
and a Kubernetes-style ConfigMap ``..data`` symlink swap) apply a new config atomically.

100 reloads while steady load runs over both transports: the loaded model moves between an
HTTP and a gRPC backend, a route and a backend come and go, one file among them is invalid.
Nothing in flight fails; an added route answers within a second of its reload; the invalid
file changes nothing and is counted in the metrics.
"""
from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.load import Load
from tests.support.procs import wait_for

pytestmark = pytest.mark.triton

RELOADS = 100
FAILURES = 'oip_gateway_config_reloads_total{result="failure"}'


def http_status(url: str, model: str) -> int:
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"INT32","data":[1,2]}]}'
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def config(triton, i: int, *, extra_route: bool) -> dict[str, Any]:
    """The i-th config: add_sub alternates between the HTTP and the gRPC backend; every other
    config has a route (identity_INT32) and a backend that the others lack."""
    backends: dict[str, Any] = {
        "t-http": {"protocol": "http", "endpoints": [triton.http_url]},
        "t-grpc": {"protocol": "grpc", "endpoints": [triton.grpc_url]},
    }
    routes = [{"model": "add_sub", "backend": "t-http" if i % 2 else "t-grpc"}]
    if extra_route:
        backends["extra"] = {"protocol": "grpc", "endpoints": [triton.grpc_url], "timeout_s": 30 + i % 7}
        routes.append({"model": "identity_INT32", "backend": "extra"})
    return gateway_config(backends, routes)


def write_atomically(path: Path, cfg: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    os.replace(tmp, path)


def test_100_reloads_under_load(triton, tmp_path: Path) -> None:
    gw = GatewayProcess(config(triton, 0, extra_route=False), tmp_path, "gw-reload")
    gw._args.append("--watch")
    gw.start()
    try:
        wait_for(lambda: http_status(gw.http_url, "add_sub") in (200, 400), timeout=30, what="gateway serving")
        latencies = []
        with Load(http_url=gw.http_url, grpc_url=gw.grpc_url, models=["add_sub"], http_concurrency=2,
                  grpc_concurrency=2, pause_s=0.002, max_seconds=600) as load:
            load.wait_requests(50, timeout=60, ok_only=True)
            for i in range(1, RELOADS + 1):
                extra = i % 2 == 1
                if i == 50:
                    # One invalid file: refused, the previous config keeps serving.
                    before = metric(gw.metrics_url, 'oip_gateway_config_reloads_total{result="failure"}')
                    gw.config_path.write_text("backends: {broken: {protocol: smtp}}\nroutes: []\n")
                    gw.proc.send_signal(signal.SIGHUP)
                    wait_for(lambda b=before: metric(gw.metrics_url, FAILURES) > b, timeout=10,
                             what="the invalid file to be refused")
                    assert metric(gw.metrics_url, "oip_gateway_config_last_reload_successful") == 0
                    # The config before it still serves, routes and all: nothing changed.
                    assert http_status(gw.http_url, "identity_INT32") == 200  # config 49 routes it
                    continue
                cfg = config(triton, i, extra_route=extra)
                start = time.monotonic()
                write_atomically(gw.config_path, cfg)  # seen by --watch
                if i % 3 == 0:
                    gw.proc.send_signal(signal.SIGHUP)  # and a SIGHUP on top: applied in order
                want = 200 if extra else 404
                wait_for(lambda w=want: http_status(gw.http_url, "identity_INT32") == w, timeout=10,
                         interval=0.02, what=f"reload {i} to apply")
                if extra:
                    latencies.append(time.monotonic() - start)
                load.wait_requests(10, timeout=30)
            summary = load.stop()
        report = summary.report()
        print(report)
        print(f"added route answered after {max(latencies):.3f} s at most (median "
              f"{sorted(latencies)[len(latencies) // 2]:.3f} s) over {len(latencies)} reloads")
        assert summary.failed == 0, report
        assert summary.succeeded > RELOADS * 10, report
        assert max(latencies) < 1.0, latencies
        assert metric(gw.metrics_url, 'oip_gateway_config_reloads_total{result="success"}') >= RELOADS - 1
        assert metric(gw.metrics_url, "oip_gateway_config_last_reload_successful") == 1
        assert gw.proc.poll() is None
    finally:
        gw.stop()


def test_configmap_symlink_swap_is_picked_up(reference, tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as ``file -> ..data/file`` and updates it by swapping
    the ``..data`` symlink to a new directory: the watched path's content changes though
    the file itself is never written."""
    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(n: int, cfg: dict[str, Any]) -> None:
        version = mount / f"..2026_{n}"
        version.mkdir()
        (version / "config.yaml").write_text(yaml.safe_dump(cfg))
        tmp_link = mount / "..data_tmp"
        tmp_link.symlink_to(version.name)
        os.replace(tmp_link, mount / "..data")

    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    publish(1, gateway_config(backends, [{"model": "add_sub", "backend": "ref"}]))
    (mount / "config.yaml").symlink_to("..data/config.yaml")
    gw = GatewayProcess({}, tmp_path, "gw-cm")
    gw._args[gw._args.index("--config") + 1] = str(mount / "config.yaml")
    gw._args.append("--watch")
    gw.start()
    try:
        assert http_status(gw.http_url, "identity_INT32") == 404
        publish(2, gateway_config(backends, [{"model": "add_sub", "backend": "ref"},
                                             {"model": "identity_INT32", "backend": "ref"}]))
        wait_for(lambda: http_status(gw.http_url, "identity_INT32") == 200, timeout=5, what="the swap to apply")
    finally:
        gw.stop()


def test_sighup_reloads_every_worker(reference, tmp_path: Path) -> None:
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    gw = GatewayProcess(gateway_config(backends, [{"model": "add_sub", "backend": "ref"}]), tmp_path, "gw-workers",
                        workers=2)
    gw.start()
    try:
        assert http_status(gw.http_url, "identity_INT32") == 404
        gw.config_path.write_text(yaml.safe_dump(gateway_config(
            backends, [{"model": "add_sub", "backend": "ref"}, {"model": "identity_INT32", "backend": "ref"}])))
        gw.proc.send_signal(signal.SIGHUP)
        # Each urlopen is a new connection: the kernel spreads them over both workers.
        wait_for(lambda: all(http_status(gw.http_url, "identity_INT32") == 200 for _ in range(20)), timeout=10,
                 what="every worker to reload")
        gw.config_path.write_text("routes: 1\n")  # invalid: refused by the supervisor and by every worker
        gw.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reload refused" in gw.log_tail(), timeout=10, what="the refusal to be logged")
        assert all(http_status(gw.http_url, "identity_INT32") == 200 for _ in range(20))
        assert gw.log_tail(200).count("config reload refused") == 1  # one line, from the supervisor
        assert gw.proc.poll() is None
    finally:
        gw.stop()
