"""Backends: one Backend interface (base.py) with HTTP (keep-alive HTTP/1.1 on httptools) and gRPC
(grpc.aio) backends, background health checks, DNS discovery."""
from .base import Backend
from .discovery import Discovery
from .endpoints import Endpoint
from .grpc import GrpcBackend
from .health import HealthChecker
from .http import HttpBackend
from .http_endpoint import UpstreamReply
from .refusal import Refused

__all__ = ["Backend", "Discovery", "Endpoint", "GrpcBackend", "HealthChecker", "HttpBackend", "Refused",
           "UpstreamReply"]
