"""An HTTP backend endpoint (its pool of keep-alive HTTP/1.1 connections, ``h1``), what an
exchange on it hands back (:class:`UpstreamReply`), and the helpers the HTTP backend builds
requests and reads answers with: paths, relayed headers, a backend's error answer as the
gateway's error."""
from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from ..config.schema import BackendTls, HostPort
from ..dataplane import IncomingBody
from ..errors import GatewayError, UpstreamError, UpstreamFraming, UpstreamTooLarge
from .endpoints import Endpoint
from .h1 import BadAnswer, BodyStream, H1ConnectionPool

__all__ = ["Body", "HttpEndpoint", "UpstreamReply", "error_from_reply", "family_of", "model_path", "ssl_context"]

# Response headers worth relaying to the client; hop-by-hop and framing
# headers (content-length, transfer-encoding, connection) are the server's own.
_RELAYED = ("content-type", "inference-header-content-length", "content-encoding")

# Error answers that may mean "model not (yet) here": read as such only from an
# endpoint the checker thought ready (Backend.refusal).
_NOT_READY_STATUS = frozenset({400, 404, 503})


def _picked(headers: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """The headers named in ``names`` that ``headers`` has. (A loop, not a comprehension: twice
    on every HTTP request, and a comprehension is a function call of its own.)"""
    picked: dict[str, str] = {}
    get = headers.get
    for k in names:
        v = get(k)
        if v is not None:
            picked[k] = v
    return picked


def _relayed(headers: Mapping[str, str]) -> dict[str, str]:
    """The backend answer's headers the gateway relays."""
    return _picked(headers, _RELAYED)


class HttpEndpoint(Endpoint):
    __slots__ = ("connections", "control", "family")

    def __init__(self, address: HostPort, connections: H1ConnectionPool) -> None:
        super().__init__(address)
        self.connections = connections
        # The server family (config FAMILIES) from its metadata's name, once read (check_live).
        self.family: str | None = None
        # Where a placement backend's loads and unloads go instead (its servers' gRPC port,
        # backends/grpc_control.py): made at the first one, closed with this endpoint.
        self.control: Endpoint | None = None

    @property
    def inflight(self) -> int:
        """Exchanges in progress on this endpoint (a streamed answer counts until its end)."""
        return self.connections.busy

    async def close(self) -> None:
        self.connections.close()  # idle connections now; busy ones when their exchange ends
        if self.control is not None:
            await self.control.close()


# Not frozen: made for every answer, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~3 x the cost). Nothing writes to one after it is made.
@dataclass(slots=True)
class UpstreamReply:
    status: int
    body: bytes | bytearray | BodyStream  # a BodyStream only when the caller passed ``stream_min``
    headers: Mapping[str, str]
    endpoint: HttpEndpoint | None = None  # the one that answered


def ssl_context(tls: BackendTls | None) -> ssl.SSLContext | None:
    """The client TLS context of a backend (None: plain text)."""
    if tls is None:
        return None
    ctx = ssl.create_default_context(cafile=tls.ca)
    if tls.cert is not None:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


def model_path(model: str, version: str) -> str:
    """``/v2/models/{m}[/versions/{v}]`` with both segments percent-encoded."""
    path = "/v2/models/" + quote(model, safe="")
    if version:
        path += "/versions/" + quote(version, safe="")
    return path


def _refused(where: str, exc: BadAnswer) -> GatewayError:
    """The h1 client's refusal of an answer as the gateway's error (502 / INTERNAL)."""
    cls = UpstreamTooLarge if exc.kind == BadAnswer.TOO_LARGE else UpstreamFraming
    return cls(f"{where}: {exc}")


def family_of(name: Any) -> str:
    """A server family (config FAMILIES) from a server metadata ``name``."""
    text = name.lower() if isinstance(name, str) else ""
    for family in ("triton", "mlserver", "kserve"):
        if family in text:
            return family
    return "other"


def error_from_reply(reply: UpstreamReply) -> UpstreamError:
    """A backend's HTTP error, relayed: status and body unchanged; the message is
    the body's ``error`` string (spec "Inference Response JSON Error Object")."""
    body = bytes(reply.body) if isinstance(reply.body, (bytes, bytearray)) else b""
    message = body.decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except orjson.JSONDecodeError:
        pass
    return UpstreamError(
        message or f"backend answered HTTP {reply.status}",
        http_status=reply.status,
        body=body,
        content_type=reply.headers.get("content-type"),
    )


Body = bytes | bytearray | list[bytes | memoryview] | IncomingBody | None
