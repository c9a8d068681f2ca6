"""HTTP backend pools: the only aiohttp code of the gateway.

One keep-alive ``ClientSession`` per pool. Bodies go out and come back as
bytes, untouched: ``auto_decompress`` is off so a compressed answer reaches a
client that asked for it byte for byte. Foreign errors are mapped to the
gateway's error tree here, once (``raise ... from exc``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import orjson

from ..config.schema import Backend, HostPort
from ..errors import NoEndpointAvailable, UpstreamError, UpstreamTimeout
from ..routing.balancer import RoundRobin

__all__ = ["HttpEndpoint", "HttpPool", "UpstreamReply", "error_from_reply", "model_path"]


@dataclass(slots=True)
class HttpEndpoint:
    address: HostPort
    base_url: str
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    status: int
    body: bytes
    headers: Mapping[str, str]


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
        self.endpoints = [HttpEndpoint(ep, f"http://{ep}") for ep in backend.endpoints]
        self.balancer: RoundRobin[HttpEndpoint] = RoundRobin(self.endpoints)
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=backend.timeout_s, sock_connect=backend.connect_timeout_s)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=False)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
            timeout=self._timeout,
            read_bufsize=2**20,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        endpoint: HttpEndpoint | None = None,
    ) -> UpstreamReply:
        """Send to the pool (or to one ``endpoint``); fail over to the next endpoint
        only when the connection could not be made, so no request runs twice."""
        assert self._session is not None, "pool not started"
        order = [endpoint] if endpoint is not None else self.balancer.order()
        tmo = self._timeout if timeout is None else aiohttp.ClientTimeout(
            total=timeout, sock_connect=self.backend.connect_timeout_s
        )
        failures: list[str] = []
        for ep in order:
            try:
                async with self._session.request(
                    method, ep.base_url + path, data=body, headers=headers, timeout=tmo
                ) as resp:
                    data = await resp.read()
                    relayed = {k: v for k in _RELAYED if (v := resp.headers.get(k)) is not None}
                    return UpstreamReply(resp.status, data, relayed)
            except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
                raise UpstreamTimeout(
                    f"backend '{self.name}' endpoint {ep.address} did not answer within "
                    f"{tmo.total}s"
                ) from exc
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                # Refused / unreachable / closed before answering: mark it and try the next one.
                ep.healthy = False
                failures.append(f"{ep.address}: {exc.__class__.__name__}")
            except aiohttp.ClientError as exc:
                ep.healthy = False
                failures.append(f"{ep.address}: {exc.__class__.__name__}: {exc}")
        raise NoEndpointAvailable(
            f"no endpoint of backend '{self.name}' is reachable ({'; '.join(failures)})"
        )
