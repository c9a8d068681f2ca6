"""Upstream clients: HTTP (aiohttp) and gRPC (grpc.aio) pools and health checks."""
from .grpc import GrpcPool
from .health import HealthChecker
from .http import HttpPool, UpstreamReply

__all__ = ["GrpcPool", "HealthChecker", "HttpPool", "UpstreamReply"]
