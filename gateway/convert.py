"""Cross-protocol inference: HTTP client → gRPC pool and gRPC client → HTTP pool.

Filled in by the cross-protocol issue; the shape is fixed here so the proxy's
pass-through paths do not change when it lands.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .dataplane import HttpReply
from .errors import Unsupported

if TYPE_CHECKING:
    from .proxy import Proxy
    from .upstream.grpc import GrpcPool
    from .upstream.http import HttpPool

__all__ = ["http_to_grpc", "grpc_to_http"]


async def http_to_grpc(
    proxy: "Proxy", pool: "GrpcPool", model: str, version: str, body: bytes, headers: Mapping[str, str]
) -> HttpReply:
    raise Unsupported(f"backend '{pool.name}' speaks gRPC; HTTP→gRPC conversion is not enabled yet")


async def grpc_to_http(
    proxy: "Proxy", pool: "HttpPool", model: str, version: str, message: bytes, timeout: float | None
) -> bytes:
    raise Unsupported(f"backend '{pool.name}' speaks HTTP; gRPC→HTTP conversion is not enabled yet")
