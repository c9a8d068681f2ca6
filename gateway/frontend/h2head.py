"""A gRPC call's head as the gateway's own HTTP/2 listener reads it (``read_head``: path,
content-type, ``grpc-encoding``, ``grpc-timeout``, metadata), what grpc's handler lookup is asked
with (``Details``), the part of ``aio.ServicerContext`` the handlers use (``Context``), and a
call's status as trailers (``status_trailers``). Framing per gRPC's "gRPC over HTTP2"
(doc/PROTOCOL-HTTP2.md)."""
from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence

import grpc
from grpc import aio

from ..codec.grpcframe import encode_message, parse_timeout

__all__ = ["Context", "Details", "read_head", "status_trailers"]

# Request headers that are HTTP/2's or gRPC's own, not the call's metadata (grpc.aio leaves
# them out of invocation_metadata() too).
_NOT_METADATA = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                           b"content-length"})

class Details(grpc.HandlerCallDetails):
    """What grpc's ``GenericRpcHandler.service`` is asked with: the method and the metadata."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


def status_trailers(code: grpc.StatusCode, message: str,
                    extra: Sequence[tuple[str, str | bytes]] = ()) -> list[tuple[bytes, bytes]]:
    """``grpc-status`` (the code's number), ``grpc-message`` (percent-encoded) and the abort's
    trailing metadata."""
    out = [(b"grpc-status", str(code.value[0]).encode())]
    if message:
        out.append((b"grpc-message", encode_message(message)))
    for k, v in extra:
        key = k.lower().encode("ascii")
        if key.endswith(b"-bin"):
            out.append((key, base64.b64encode(v if isinstance(v, bytes) else v.encode()).rstrip(b"=")))
        else:
            out.append((key, v.encode("latin-1") if isinstance(v, str) else v))
    return out


class Context:
    """The part of ``aio.ServicerContext`` the gateway's handlers use."""

    __slots__ = ("_deadline", "_loop", "_metadata", "code", "details", "method", "trailing")

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], deadline: float | None,
                 loop: asyncio.AbstractEventLoop, method: str = "") -> None:
        self.method = method  # the call's :path, for the log
        self._metadata = metadata
        self._deadline = deadline
        self._loop = loop
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: Sequence[tuple[str, str | bytes]] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """Ends the call with ``code``: raises ``aio.AbortError``, as grpc.aio's does."""
        self.code = code
        self.details = details
        self.trailing = tuple(trailing_metadata)
        raise aio.AbortError()


def read_head(headers: list[tuple[bytes, bytes]]) -> tuple[str, bytes, bytes, float | None,
                                                           tuple[tuple[str, str | bytes], ...], str | None]:
    """(path, content-type, grpc-encoding, timeout seconds, metadata, refusal) of a request head."""
    path = content_type = encoding = b""
    timeout: float | None = None
    method = b""
    metadata: list[tuple[str, str | bytes]] = []
    refusal: str | None = None
    for name, value in headers:
        if name[0] == 58:  # b":"
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
        elif name in _NOT_METADATA:
            if name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = parse_timeout(value)
                if timeout is None:
                    refusal = f"grpc-timeout {value[:32]!r} is not 1-8 digits and a unit (H, M, S, m, u, n)"
            elif name == b"grpc-encoding":
                encoding = value
        elif name.endswith(b"-bin"):
            try:
                metadata.append((name.decode("ascii"), base64.b64decode(value + b"=" * (-len(value) % 4))))
            except (binascii.Error, ValueError):
                refusal = f"metadata {name.decode('ascii', 'replace')} is not base64"
        else:
            metadata.append((name.decode("ascii", "replace"), value.decode("latin-1")))
    if method != b"POST":
        refusal = f"gRPC calls are POST requests (got {method.decode('latin-1')})"
    return path.decode("latin-1"), content_type, encoding, timeout, tuple(metadata), refusal
