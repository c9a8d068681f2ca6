"""Front ends: HTTP (Starlette) and gRPC (grpc.aio) over one DataPlane."""
from .grpc import build_grpc_handler, server_options
from .http import build_http_app

__all__ = ["build_grpc_handler", "build_http_app", "server_options"]
