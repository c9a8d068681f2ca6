"""An http placement backend's loads and unloads sent over its servers' gRPC port
(``placement.grpc_port``): Triton holds its other HTTP traffic while an HTTP repository call runs
(0.8 s seen, docs/placement.md), where over gRPC nothing waits. The calls, their errors and the
backend's TLS and ``check_headers`` are the grpc backend's own (``GrpcBackend.control``)."""
from __future__ import annotations

import dataclasses

from ..config.backends import BackendSpec
from ..config.network import HostPort
from .grpc import GrpcBackend
from .grpc_endpoint import GrpcEndpoint

__all__ = ["GrpcControl"]


class GrpcControl:
    """Repository calls to ``port`` on each endpoint's host; one channel per endpoint, made at
    its first call and closed with the endpoint (``HttpEndpoint.control``)."""

    def __init__(self, spec: BackendSpec, port: int) -> None:
        self.port = port
        # Never started: only its calls (timeouts, metadata, error mapping) are used.
        self._grpc = GrpcBackend(dataclasses.replace(spec, protocol="grpc", placement=None))

    def endpoint(self, address: HostPort) -> GrpcEndpoint:
        return GrpcEndpoint(HostPort(address.host, self.port), self._grpc.spec)

    async def send(self, ep: GrpcEndpoint, action: str, model: str, timeout: float) -> None:
        await self._grpc.control(ep, action, model, timeout)
