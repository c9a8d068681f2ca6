"""HTTP backend pools: the only HTTP client code of the gateway.

Each endpoint has a pool of keep-alive HTTP/1.1 connections (``h1.py``).
Bodies go out and come back as bytes, untouched — a compressed answer reaches
a client that asked for it byte for byte. Foreign errors are mapped to the
gateway's error tree here, once (``raise ... from exc``).
"""
from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

import orjson

from ..config.schema import Backend, BackendTls, HostPort
from ..dataplane import IncomingBody
from ..errors import BadUpstreamResponse, NoEndpointAvailable, RequestTimeout, UpstreamError, UpstreamTimeout
from ..routing.balancer import RoundRobin, balancer
from .h1 import BodyStream, ConnectFailed, ConnectionDropped, H1ConnectionPool, SourceStalled

__all__ = ["BodyStream", "HttpEndpoint", "HttpPool", "UpstreamReply", "error_from_reply", "model_path"]


@dataclass(slots=True)
class HttpEndpoint:
    address: HostPort
    connections: H1ConnectionPool = field(repr=False)
    healthy: bool = True

    @property
    def inflight(self) -> int:
        """Exchanges in progress on this endpoint (a streamed answer counts until its end)."""
        return self.connections.busy


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    status: int
    body: bytes | BodyStream  # a BodyStream only when the caller passed ``stream_min``
    headers: Mapping[str, str]


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


def error_from_reply(reply: UpstreamReply) -> UpstreamError:
    """A backend's HTTP error, relayed: status and body unchanged; the message is
    the body's ``error`` string (spec "Inference Response JSON Error Object")."""
    message = reply.body.decode("utf-8", "replace")
    try:
        parsed = orjson.loads(reply.body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except orjson.JSONDecodeError:
        pass
    return UpstreamError(
        message or f"backend answered HTTP {reply.status}",
        http_status=reply.status,
        body=reply.body,
        content_type=reply.headers.get("content-type"),
    )


# Response headers worth relaying to the client; hop-by-hop and framing
# headers (content-length, transfer-encoding, connection) are the server's own.
_RELAYED = ("content-type", "inference-header-content-length", "content-encoding")


class HttpPool:
    protocol = "http"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name
        self.endpoints = [
            HttpEndpoint(ep, H1ConnectionPool(ep.host, ep.port, connect_timeout=backend.connect_timeout_s,
                                              ssl=ssl_context(backend.tls),
                                              server_name=backend.tls.server_name if backend.tls else None,
                                              max_connections=backend.max_connections))
            for ep in backend.endpoints
        ]
        self.balancer: RoundRobin[HttpEndpoint] = balancer(backend.balance, self.endpoints)

    async def start(self) -> None:
        """Connections are opened on first use."""

    async def close(self) -> None:
        for ep in self.endpoints:
            ep.connections.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | bytearray | list[bytes | memoryview] | IncomingBody | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        endpoint: HttpEndpoint | None = None,
        affinity: str | None = None,
        stream_min: int | None = None,
    ) -> UpstreamReply:
        """Send to the pool (or to one ``endpoint``); fail over to the next endpoint
        only when no answer could have been produced (connection refused, or closed
        before a byte of the answer), so a request that a backend answered never runs twice.
        Answers of at least ``stream_min`` bytes come back as a BodyStream whose
        errors are this module's (BadUpstreamResponse, UpstreamTimeout)."""
        order = [endpoint] if endpoint is not None else self.balancer.order(affinity)
        tmo = self.backend.timeout_s if timeout is None else min(timeout, self.backend.timeout_s)
        failures: list[str] = []
        for ep in order:
            try:
                resp = await ep.connections.request(method, path, body=body, headers=headers, timeout=tmo,
                                                    stream_min=stream_min)
            except SourceStalled as exc:
                raise RequestTimeout(str(exc)) from exc
            except TimeoutError as exc:
                detail = str(exc) or f"did not answer within {tmo}s"
                raise UpstreamTimeout(f"backend '{self.name}' endpoint {ep.address}: {detail}") from exc
            except ConnectFailed as exc:
                ep.healthy = False
                failures.append(f"{ep.address}: {exc}")
                continue
            except ConnectionDropped as exc:
                if exc.before_response:
                    ep.healthy = False
                    failures.append(f"{ep.address}: {exc}")
                    continue
                raise BadUpstreamResponse(f"backend '{self.name}' endpoint {ep.address}: {exc}") from exc
            relayed = {k: v for k in _RELAYED if (v := resp.headers.get(k)) is not None}
            if isinstance(resp.body, BodyStream):
                resp.body.map_error = self._stream_error(ep, tmo)
            return UpstreamReply(resp.status, resp.body, relayed)
        raise NoEndpointAvailable(
            f"no endpoint of backend '{self.name}' is reachable ({'; '.join(failures)})"
        )

    def _stream_error(self, ep: HttpEndpoint, tmo: float):
        def mapped(exc: Exception) -> Exception:
            if isinstance(exc, TimeoutError):
                return UpstreamTimeout(f"backend '{self.name}' endpoint {ep.address}: "
                                       f"answer not complete within {tmo}s")
            return BadUpstreamResponse(f"backend '{self.name}' endpoint {ep.address}: {exc}")

        return mapped
