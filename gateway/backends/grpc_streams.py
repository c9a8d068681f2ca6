"""ModelStreamInfer passed through to one endpoint of a gRPC backend (``GrpcBackend.infer_stream``).

An async generator: mypyc, which compiles backends/grpc.py, cannot compile one, so it lives here.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from grpc import aio

from .h2frames import CallError

if TYPE_CHECKING:
    from .grpc import GrpcBackend

__all__ = ["stream_answers"]


async def stream_answers(backend: GrpcBackend, requests: AsyncIterator[bytes], model: str, version: str,
                         timeout: float | None, affinity: str | None,
                         metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
    """Serialized ModelInferRequests out, serialized ModelStreamInferResponses back, as they
    come, on one endpoint (a stream's requests may depend on each other, so there is no retry
    once it is open). ``timeout`` is the client's deadline, if any: a stream carries many
    requests, so the backend's ``timeout_s`` does not bound it."""
    ep = backend.first(model, version, affinity)
    call = ep.stream(requests, timeout=timeout, metadata=metadata or None)
    ep.entered()
    try:
        async for answer in call:
            yield answer
    except (aio.AioRpcError, CallError) as exc:
        raise backend.stream_failed(ep, exc, timeout) from exc
    finally:
        ep.left()
        call.cancel()  # a no-op once the stream ended; stops it if the client went away
