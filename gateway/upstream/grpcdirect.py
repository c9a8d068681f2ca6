"""A unary gRPC call on a ``grpc.aio`` channel without grpc.aio's per-call Python objects:
the ModelInfer of every gRPC pool (upstream/grpc.py).

Why: grpc.aio wraps each call in a ``UnaryUnaryCall`` (its ``Metadata``, a debug log line, an
observability context, a registration with the channel) and runs it in an ``asyncio.Task`` of
its own, which the caller then awaits — a second task and an extra turn of the event loop for
every call. The work is done by grpc's Cython call object (``cygrpc._AioCall``); awaited in the
caller's own task, the gateway's own instructions per small proxied ModelInfer fell from ~77k
to ~45k over the bare grpc.aio pass-through (benchmarks/instructions.py, docs/design-notes.md).
The method is registered with the channel (as generated stubs do: ``_registered_method``), so
grpc-core does not look the path up per call.

What it keeps of grpc.aio's behaviour: the deadline (``time.time() + timeout``, as grpc.aio),
the metadata sent as given, an error answer raised as ``aio.AioRpcError`` with the code,
details, metadata and debug string grpc.aio would give it, and cancellation: when the caller's
task is cancelled (or its coroutine closed), the call is cancelled at grpc-core, which resets
the stream to the backend, as grpc.aio does. What it does not: the channel does not know the
call, so ``Channel.close(grace)`` would not wait for it — :class:`GrpcEndpoint` drains its own
count of calls in flight before closing its channel.

These are grpc's private objects: :func:`supported` checks them on the installed grpcio when an
endpoint is made, and without them the endpoint uses the public multi-callable (same results,
the per-call cost above); tests/unit/test_grpcdirect.py fails if the installed grpcio stops
providing them.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from grpc import StatusCode, aio

__all__ = ["DirectUnary", "supported"]

try:  # grpc's private modules: absent or changed in some grpcio, then the public API is used
    from grpc import _common as _grpc_common
    from grpc._cython import cygrpc as _cygrpc
    from grpc.aio._metadata import Metadata as _Metadata

    _CODES: dict[Any, StatusCode] = dict(_grpc_common.CYGRPC_STATUS_CODE_TO_STATUS_CODE)
    _READY = all(hasattr(_cygrpc.AioChannel, a) for a in ("call", "get_registered_call_handle")) and \
        all(hasattr(_cygrpc._AioCall, a) for a in ("unary_unary", "is_ok", "status", "cancel", "done",
                                                   "initial_metadata"))
except (ImportError, AttributeError):  # pragma: no cover - depends on the grpcio installed
    _READY = False

# grpc.aio's own words for a call its application cancelled (grpc/aio/_call.py).
_CANCELLED = "Locally cancelled by application!"


def supported(channel: aio.Channel) -> bool:
    """Whether this grpcio and ``channel`` have what :class:`DirectUnary` uses."""
    return _READY and isinstance(getattr(channel, "_channel", None), _cygrpc.AioChannel) and \
        callable(getattr(channel, "_get_registered_call_handle", None))


class DirectUnary:
    """``await call(request, timeout=..., metadata=...)``: the answer's bytes (no serializers:
    bytes out, bytes back), or ``aio.AioRpcError``; a stand-in for
    ``channel.unary_unary(method)`` on the paths the gateway uses."""

    __slots__ = ("_channel", "_handle", "_method")

    def __init__(self, channel: aio.Channel, method: str) -> None:
        self._channel = channel._channel
        self._method = method.encode()
        self._handle: int = channel._get_registered_call_handle(method, True)

    async def __call__(self, request: bytes, timeout: float | None = None,
                       metadata: Sequence[tuple[str, str]] | None = None) -> bytes:
        call = self._channel.call(self._method, None if timeout is None else time.time() + timeout, None, None,
                                  self._handle)
        try:
            answer: bytes = await call.unary_unary(request, tuple(metadata) if metadata else (), None)
        except BaseException:  # cancelled, or the coroutine closed: the backend's stream is reset
            if not call.done():
                call.cancel(_CANCELLED)
            raise
        if call.is_ok():
            return answer
        status = await call.status()
        raise aio.AioRpcError(
            _CODES.get(status.code(), StatusCode.UNKNOWN),
            _Metadata.from_tuple(await call.initial_metadata()),
            _Metadata.from_tuple(status.trailing_metadata()),
            details=status.details(),
            debug_error_string=status.debug_error_string(),
        )

