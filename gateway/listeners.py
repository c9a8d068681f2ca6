"""The listeners: :class:`Listeners` serves any DataPlane on HTTP, gRPC and (optionally) metrics and
peers ports — the gateway's Proxy, or the demo's local models. Sockets are created here with
SO_REUSEPORT when several worker processes share a port (``gateway/supervisor.py``); a port of 0
is bound by the kernel and read back. TLS files are watched here and a rotation reaches new
handshakes.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpc import aio
from prometheus_client import CollectorRegistry, make_asgi_app

from .certs import CertFiles
from .config.schema import HostPort, Tls
from .config.security import Limits
from .dataplane import DataPlane
from .errors import ListenError
from .frontend.grpc import STREAMED_METHODS, build_grpc_handler, server_options
from .frontend.h1asgi import AsgiApp
from .frontend.h1listen import HttpListener, Router, server_context
from .frontend.http import build_http_app
from .frontend.v1_grpc import build_v1_grpc_handler
from .h2 import native
from .observability.metrics import Metrics
from .security.guard import Gate

if TYPE_CHECKING:
    from .frontend.h2listen import H2Listener

__all__ = ["Listeners", "Ports", "bind_socket"]

log = logging.getLogger("oip_gateway")


def bind_socket(addr: HostPort, *, listen: bool = True, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``addr``. ``reuse_port`` (SO_REUSEPORT) lets the workers of one
    gateway share a port; a single process leaves it off, so a port already taken — say by
    another gateway — is an error instead of a silent share."""
    family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((addr.host, addr.port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {addr}: {exc.strerror or exc}") from exc
    if listen:
        sock.listen(2048)
        sock.setblocking(False)
    return sock


@dataclass
class Ports:
    http: int | None = None
    grpc: int | None = None
    metrics: int | None = None
    peers: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics, "peers": self.peers}


@dataclass
class Listeners:
    """HTTP + gRPC (+ metrics) front ends over one DataPlane, in the running loop."""

    plane: DataPlane
    max_message_bytes: int
    gate: Gate  # who may call what: the guard the front ends ask before a request is read
    metrics: Metrics | None = None
    reuse_port: bool = False
    tls: Tls | None = None  # for the HTTP and gRPC listeners; metrics stay plain
    max_json_depth: int = 64  # HTTP request JSON nesting limit (0: off)
    max_header_count: int = 100
    max_header_bytes: int = 32768
    limits: Limits = field(default_factory=Limits)  # hard limits (config ``limits``)
    ports: Ports = field(default_factory=Ports)
    _servers: list[HttpListener] = field(default_factory=list)
    _grpc: aio.Server | None = None  # grpc.aio's server: the fallback engine
    _h2: H2Listener | None = None  # the gateway's own gRPC listener
    _certs: CertFiles | None = None
    _cert_watch: asyncio.Task[None] | None = None
    # Listeners' TLS contexts and how to make each afresh from the files (ALPN differs).
    _tls_contexts: list[tuple[ssl.SSLContext, Any]] = field(default_factory=list)

    def _watch(self, context: ssl.SSLContext, alpn: str) -> None:
        """Have the TLS files watched for ``context`` (the HTTP or the gRPC listener's)."""
        assert self.tls is not None
        tls = self.tls
        self._certs = self._certs or CertFiles(tls)
        self._tls_contexts.append((context, functools.partial(server_context, tls, alpn)))
        if self._cert_watch is None:
            self._cert_watch = asyncio.get_running_loop().create_task(self._watch_certs())

    async def _watch_certs(self) -> None:
        """Poll the TLS files once a second; a change goes to the new handshakes of the
        listeners (grpc.aio asks CertFiles itself at each handshake)."""
        assert self._certs is not None
        while True:
            await asyncio.sleep(1.0)
            try:
                self._certs.reload(self._tls_contexts)
            except Exception:  # a bad rotation must not end the watch
                log.exception("reloading the TLS certificate failed")

    async def _serve_http(self, app: AsgiApp, sock: socket.socket, tls: Tls | None = None,
                          limits: Limits | None = None, direct: Router | None = None) -> HttpListener:
        refused = self.metrics.connection_refused if self.metrics is not None else None
        try:
            context = server_context(tls) if tls is not None else None
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ListenError(f"cannot use the TLS files {tls.cert}, {tls.key}: {exc}") from exc  # type: ignore[union-attr]
        listener = HttpListener(app, limits=limits or Limits(), direct=direct, on_refusal=refused, context=context,
                                head_limit=4 * self.max_header_bytes + 65536)
        await listener.start(sock)
        self._servers.append(listener)
        return listener

    async def start(
        self,
        *,
        http: HostPort | None,
        grpc: HostPort | None,
        metrics_addr: HostPort | None = None,
        metrics_registry: CollectorRegistry | None = None,
        peers_addr: HostPort | None = None,
        peers: AsgiApp | None = None,
    ) -> Ports:
        if http is not None:
            app = build_http_app(self.plane, self.metrics, self.gate, max_message_bytes=self.max_message_bytes,
                                 max_json_depth=self.max_json_depth, max_header_count=self.max_header_count,
                                 max_header_bytes=self.max_header_bytes, limits=self.limits)
            sock = bind_socket(http, reuse_port=self.reuse_port)
            listener = await self._serve_http(app.asgi, sock, self.tls, self.limits, app.direct)
            self.ports.http = sock.getsockname()[1]
            if self.tls is not None and listener.context is not None:
                self._watch(listener.context, "http/1.1")
        if grpc is not None and native("server"):
            await self._serve_grpc(grpc)
        elif grpc is not None:
            self._grpc = aio.server(options=server_options(self.max_message_bytes, reuse_port=self.reuse_port,
                                                           max_metadata_bytes=self.max_header_bytes,
                                                           limits=self.limits))
            self._grpc.add_generic_rpc_handlers((build_grpc_handler(self.plane, self.metrics, self.gate, self.limits),
                                                 build_v1_grpc_handler(self.plane, self.metrics, self.gate,
                                                                       limits=self.limits)))
            target = f"[{grpc.host}]:{grpc.port}" if ":" in grpc.host else f"{grpc.host}:{grpc.port}"
            if self.tls is None:
                port = self._grpc.add_insecure_port(target)
            else:
                self._certs = self._certs or CertFiles(self.tls)
                port = self._grpc.add_secure_port(target, self._certs.grpc_credentials())
            if port == 0:
                raise ListenError(f"cannot listen on {target} (gRPC)")
            await self._grpc.start()
            self.ports.grpc = port
        if metrics_addr is not None and metrics_registry is not None:
            sock = bind_socket(metrics_addr)
            await self._serve_http(make_asgi_app(metrics_registry), sock)
            self.ports.metrics = sock.getsockname()[1]
        if peers_addr is not None and peers is not None:
            sock = bind_socket(peers_addr, reuse_port=self.reuse_port)
            await self._serve_http(peers, sock)
            self.ports.peers = sock.getsockname()[1]
        return self.ports

    async def _serve_grpc(self, where: HostPort) -> None:
        """gRPC on the gateway's own HTTP/2 (frontend/h2listen.py)."""
        from .frontend.h2listen import H2Listener  # (built only where libnghttp2 is: gateway.h2.native)

        context = None
        if self.tls is not None:
            try:
                context = server_context(self.tls, "h2")
            except (OSError, ssl.SSLError) as exc:
                raise ListenError(f"cannot use the TLS files {self.tls.cert}, {self.tls.key}: {exc}") from exc
        sock = bind_socket(where, reuse_port=self.reuse_port)
        service = build_grpc_handler(self.plane, self.metrics, self.gate, self.limits)
        handlers = (service, build_v1_grpc_handler(self.plane, self.metrics, self.gate, limits=self.limits))
        listener = H2Listener(handlers, limits=self.limits, max_message_bytes=self.max_message_bytes,
                              max_metadata_bytes=self.max_header_bytes, max_header_count=self.max_header_count,
                              context=context,
                              on_refusal=functools.partial(self.metrics.connection_refused, protocol="grpc")
                              if self.metrics is not None else None, streamed=STREAMED_METHODS, now=service.now)
        await listener.start(sock)
        self._h2 = listener
        self.ports.grpc = sock.getsockname()[1]
        if context is not None:
            self._watch(context, "h2")

    async def stop(self, grace: float = 5.0) -> None:
        if self._cert_watch is not None:
            self._cert_watch.cancel()
            self._cert_watch = None
        if self._h2 is not None:
            await self._h2.stop(grace)
            self._h2 = None
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        # Busy HTTP connections finish their answers (up to 10 s) and close.
        await asyncio.gather(*(listener.stop(10.0) for listener in self._servers))
        self._servers.clear()
