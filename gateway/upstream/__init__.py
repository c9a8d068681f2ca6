"""Upstream: one Pool interface (pool.py) with HTTP (keep-alive HTTP/1.1 on httptools) and gRPC
(grpc.aio) pools, background health checks, DNS discovery."""
from .discovery import Discovery
from .endpoints import Endpoint
from .grpc import GrpcPool
from .health import HealthChecker
from .http import HttpPool
from .http_endpoint import UpstreamReply
from .pool import Pool, Refused

__all__ = ["Discovery", "Endpoint", "GrpcPool", "HealthChecker", "HttpPool", "Pool", "Refused", "UpstreamReply"]
