"""Upstream clients: HTTP (keep-alive HTTP/1.1 on httptools) and gRPC (grpc.aio) pools, health checks."""
from .grpc import GrpcPool
from .health import HealthChecker
from .http import HttpPool, UpstreamReply

__all__ = ["GrpcPool", "HealthChecker", "HttpPool", "UpstreamReply"]
