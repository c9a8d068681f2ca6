"""The things under load: Triton itself ("direct"), nginx in front of it, and the gateway.

Triton and the gateway bind port 0 and report their ports (tests/support). nginx cannot bind
port 0 and report it, so — benchmark only — we ask the kernel for a free port (bind 0, read it,
close) and hand it to nginx, retrying with new ports if nginx then fails to bind. That race is
harmless here (nothing else on a benchmark machine competes for ephemeral ports) and is not the
way the test suite does it.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import terminate, wait_for

__all__ = ["Nginx", "Target", "ensure_tools", "gateway_routes_config", "nginx_config", "start_gateway"]

TOOLS = {"nginx": "nginx", "h2load": "nghttp2-client", "wrk": "wrk"}
APT_COMMAND = "apt-get update && apt-get install -y nginx nghttp2-client wrk"


@dataclass
class Target:
    """Where the load goes, and which process tree's CPU and memory count as the proxy's."""

    name: str
    http_url: str  # host:port
    grpc_url: str
    pid: int | None  # root of the proxy's process tree; None for direct (there is no proxy)


def ensure_tools(install: bool) -> None:
    """Check nginx, h2load and wrk are on PATH; install the Debian packages if allowed (needs root)."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    if not install:
        raise SystemExit(f"missing {', '.join(missing)}; install with: {APT_COMMAND}")
    print(f"installing {' '.join(missing)}: {APT_COMMAND}", flush=True)
    sudo = [] if _is_root() else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update"], check=True)
    subprocess.run([*sudo, "apt-get", "install", "-y", *missing], check=True,
                   env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


# -------------------------------------------------------------------------------------------- nginx


def nginx_config(workdir: Path, http_port: int, grpc_port: int, triton_http: str, triton_grpc: str,
                 workers: int = 1) -> str:
    """A plain reverse proxy: HTTP/1.1 with upstream keep-alive, gRPC with grpc_pass, no body limits."""
    return f"""
worker_processes {workers};
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/client_body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    client_max_body_size 0;            # no request body limit
    client_body_buffer_size 32m;       # keep 16 MB bodies in memory, not in temp files
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    http2_max_concurrent_streams 1024;
    http2_body_preread_size 1m;
    upstream triton_http {{ server {triton_http}; keepalive 256; keepalive_requests 1000000; }}
    upstream triton_grpc {{ server {triton_grpc}; keepalive 256; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{http_port} reuseport backlog=4096;
        location / {{
            proxy_pass http://triton_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffers 64 256k;
            proxy_buffer_size 64k;
            proxy_max_temp_file_size 0;    # never spill answers to disk
            proxy_read_timeout 300s;
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2 reuseport backlog=4096;
        location / {{
            grpc_pass grpc://triton_grpc;
            grpc_buffer_size 1m;
            grpc_read_timeout 300s;
            grpc_send_timeout 300s;
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Nginx:
    """``nginx -c <generated file> -g 'daemon off;'`` as a child process."""

    def __init__(self, workdir: Path, triton_http: str, triton_grpc: str, workers: int = 1) -> None:
        self.workdir = workdir
        self.triton_http, self.triton_grpc, self.workers = triton_http, triton_grpc, workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = self.grpc_port = 0

    def start(self, attempts: int = 5) -> Nginx:
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _ in range(attempts):
            self.http_port, self.grpc_port = _free_port(), _free_port()
            conf = self.workdir / "nginx.conf"
            conf.write_text(nginx_config(self.workdir, self.http_port, self.grpc_port, self.triton_http,
                                         self.triton_grpc, self.workers))
            log = open(self.workdir / "nginx.stderr", "wb")
            self.proc = subprocess.Popen(["nginx", "-e", str(self.workdir / "error.log"), "-c", str(conf),
                                          "-g", "daemon off;"], stdout=log, stderr=subprocess.STDOUT)
            log.close()

            def up() -> bool:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError("nginx exited")
                return _port_open(self.http_port) and _port_open(self.grpc_port)

            try:
                wait_for(up, timeout=10, what="nginx ports")
                return self
            except (RuntimeError, TimeoutError):
                last = (self.workdir / "error.log").read_text(errors="replace")[-1000:] if (
                    self.workdir / "error.log").exists() else ""
                self.stop()
                time.sleep(0.2)
        raise RuntimeError(f"nginx did not start after {attempts} attempts:\n{last}")

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None

    def target(self) -> Target:
        assert self.proc is not None
        return Target("nginx", f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}", self.proc.pid)


# ------------------------------------------------------------------------------------------ gateway

REAL_MODELS = ("add_sub", "identity_UINT8", "identity_FP32")


def gateway_routes_config(pool: str, triton_http: str, triton_grpc: str, *, extra_routes: int = 0,
                          models: tuple[str, ...] = REAL_MODELS) -> dict[str, Any]:
    """Every model routed to one Triton pool spoken to over ``pool`` ("http" or "grpc").

    ``extra_routes`` adds exact routes ``model-0`` … ``model-<n-1>`` (the scaling run).
    """
    backend = f"triton-{pool}"
    backends = {backend: {"protocol": pool, "endpoints": [triton_http if pool == "http" else triton_grpc],
                          "timeout_s": 300}}
    routes = [{"model": f"model-{i}", "backend": backend} for i in range(extra_routes)]
    routes += [{"model": m, "backend": backend} for m in models]
    # Health checks every 5 s: their CPU lands in the gateway's figures, and should stay negligible.
    return gateway_config(backends, routes, health={"interval_s": 5.0, "timeout_s": 2.0})


def start_gateway(config: dict[str, Any], workdir: Path, name: str, workers: int) -> tuple[GatewayProcess, Target]:
    workdir.mkdir(parents=True, exist_ok=True)
    gw = GatewayProcess(config, workdir, name=name, workers=workers)
    gw.start(timeout=120)
    assert gw.proc is not None
    return gw, Target(name, gw.http_url, gw.grpc_url, gw.proc.pid)
