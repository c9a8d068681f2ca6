"""Placement's replicas (docs/placement.md "Replicas"): which process decides where a placement
pool's models go, and asking it.

Every replica knows the same peers — the ``listen.peers`` address of each (config ``peers``:
static addresses, or DNS names such as the gateway's own headless Service, re-resolved every
``dns.refresh_s``). A pool's decider is the first of them in the pool's rendezvous order
(``routing/rendezvous.py``) that answers: every replica computes the same one, so one process
makes every load and eviction of a pool, one endpoint at a time, and capacity holds however many
replicas there are. The others ask it (``POST /placement/v1/backends/{b}/models/{m}``) and hold
their requests until it answers. A peer that does not answer is passed over for
``_DOWN_S``; when the decider goes, the next in order decides (its state is what the Tritons'
indexes say, so nothing is handed over). Without ``peers`` a process decides alone.

The peers port is plain HTTP for the gateway's own pods: what it can make happen is what any
client's request for a routed model makes happen (a load of that model).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .backends.base import Backend
from .backends.dns import DnsFailure, DnsResolver
from .backends.h1 import BodyStream, H1ConnectionPool
from .backends.h1.errors import BadAnswer, ConnectFailed, ConnectionDropped
from .backends.holds import not_ready
from .config.schema import Dns, HostPort, Peers
from .errors import GRPC_TO_HTTP, BadUpstreamResponse, GatewayError, UpstreamError
from .routing.rendezvous import rank

__all__ = ["PeerSet", "peers_app"]

log = logging.getLogger("oip_gateway.peers")

# A peer that did not answer is passed over this long.
_DOWN_S = 5.0
_PATH = "/placement/v1/backends/{backend}/models/{model}"
# gRPC status code names a relayed error may carry (anything else is UNKNOWN).
_CODES = frozenset(GRPC_TO_HTTP)


def _text(hp: HostPort) -> str:
    return f"[{hp.host}]:{hp.port}" if ":" in hp.host else f"{hp.host}:{hp.port}"


class PeerSet:
    """The replicas that may decide placement, and which one does for a pool."""

    def __init__(self, peers: Peers, own: HostPort | None, dns: Dns) -> None:
        self.spec = peers
        self.own_port = own.port if own is not None else None
        self._static = [_text(hp) for hp in peers.addresses]
        self._resolved: list[str] = []
        self._down: dict[str, float] = {}
        self._local: dict[str, bool] = {}
        self._pools: dict[str, H1ConnectionPool] = {}
        self._resolver = DnsResolver([(ns.host, ns.port) for ns in dns.nameservers] or None, dns.timeout_s)
        self._refresh_s = dns.refresh_s
        self._task: asyncio.Task[None] | None = None

    # -- who they are ------------------------------------------------------------------------
    def addresses(self) -> list[str]:
        return sorted({*self._static, *self._resolved})

    def is_self(self, address: str) -> bool:
        """``address`` is this process's own listen.peers: its port, on an address of this host
        (one it can bind)."""
        host, _, port = address.rpartition(":")
        if self.own_port is None or not port.isdigit() or int(port) != self.own_port:
            return False
        known = self._local.get(host)
        if known is None:
            try:
                with socket.socket(socket.AF_INET6 if host.startswith("[") else socket.AF_INET) as s:
                    s.bind((host.strip("[]"), 0))
                known = True
            except OSError:
                known = False
            self._local[host] = known
        return known

    def decider(self, pool: str) -> str | None:
        """The peer that decides for ``pool`` now; None: this process. A process without a peers
        port of its own (a follower: ``--workers``' others) never decides: when no peer answers,
        it asks the first again (and its requests get 503 until one does)."""
        now = time.monotonic()
        ranked = rank(pool, self.addresses())
        for address in ranked:
            if self.is_self(address):
                return None
            if self._down.get(address, 0.0) <= now:
                return address
        if self.own_port is not None or not ranked:
            return None  # every other peer is down: this one decides
        return ranked[0]

    # -- asking the decider ----------------------------------------------------------------------
    async def ask(self, pool: str, model: str, copies: int, timeout: float) -> list[str] | None:
        """Have the decider place ``model`` on ``copies`` endpoints: the addresses it is ready
        on, or None when this process is the decider after all (the others did not answer).
        Raises the decider's answer as an error when it could not place it."""
        while True:
            address = self.decider(pool)
            if address is None:
                return None
            path = _PATH.format(backend=quote(pool, safe=""), model=quote(model, safe="")) + f"?copies={copies}"
            try:
                reply = await self._pool(address).request("POST", path, body=b"", timeout=timeout,
                                                          max_body=1 << 20)
            except TimeoutError:  # (before OSError, its base: a slow decider is not a gone one)
                raise not_ready(f"model '{model}': the replica that places backend '{pool}''s models ({address}) "
                                 f"did not answer within {timeout:g} s; retry later", 2) from None
            except (ConnectFailed, ConnectionDropped, BadAnswer, OSError) as exc:
                log.warning("peer %s did not answer (%s): passed over for %.0f s", address, exc, _DOWN_S)
                again = self._down.get(address, 0.0) > time.monotonic()
                self._down[address] = time.monotonic() + _DOWN_S
                if again:  # asked again with none answering (a follower): no decider now
                    raise not_ready(f"model '{model}': no replica that places backend '{pool}''s models answers "
                                     f"({address}: {exc}); retry later", int(_DOWN_S)) from None
                continue
            body = reply.body
            if isinstance(body, BodyStream):
                body.close()
                raise BadUpstreamResponse(f"peer {address} answered a stream")
            return _answer(reply.status, bytes(body), reply.headers, address)

    def _pool(self, address: str) -> H1ConnectionPool:
        pool = self._pools.get(address)
        if pool is None:
            host, _, port = address.rpartition(":")
            pool = self._pools[address] = H1ConnectionPool(host.strip("[]"), int(port), connect_timeout=2.0,
                                                           max_idle=4, max_connections=64)
        return pool

    # -- DNS ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.spec.dns and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            found: list[str] = []
            for hp in self.spec.dns:
                try:
                    found += [_text(HostPort(ip, hp.port)) for ip in await self._resolver.resolve(hp.host)]
                except DnsFailure as exc:
                    log.warning("peers: %s did not resolve (%s); keeping what was known", hp.host, exc)
                    found = self._resolved
                    break
            self._resolved = found
            await asyncio.sleep(self._refresh_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pool in self._pools.values():
            pool.close()


def _answer(status: int, body: bytes, headers: Mapping[str, str], address: str) -> list[str]:
    try:
        doc = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise BadUpstreamResponse(f"peer {address} answered {status} without a JSON object")
    if status == 200:
        endpoints = doc.get("endpoints")
        if not isinstance(endpoints, list) or not all(isinstance(e, str) for e in endpoints):
            raise BadUpstreamResponse(f"peer {address} answered 200 without its endpoints")
        return endpoints
    error = doc.get("error")
    message = error if isinstance(error, str) else f"peer {address} answered {status}"
    if doc.get("kind") == "ModelNotReady" or status == 503:
        raise not_ready(message, _small_int(headers.get("retry-after", ""), 2))
    code = doc.get("code")
    raise UpstreamError(message, http_status=status if 400 <= status < 600 else 502,
                        grpc_code=code if isinstance(code, str) and code in _CODES else "UNKNOWN")


def _small_int(text: str, default: int) -> int:
    """A count a peer or client sent: ASCII digits, at most 4 of them (``str.isdigit`` takes "²")."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 4 else default


def peers_app(backends: Callable[[], Mapping[str, Backend[Any]]]) -> Starlette:
    """The peers port: a replica asks this one to place a model of one of its placement pools."""

    async def place(request: Request) -> Response:
        name = request.path_params["backend"]
        model = request.path_params["model"]
        backend = backends().get(name)
        placer = backend.placer if backend is not None else None
        if placer is None:
            return _error(404, "NOT_FOUND", "ModelNotFound", f"no placement pool named '{name}' here")
        copies = _small_int(request.query_params.get("copies", ""), placer.spec.copies)
        try:
            endpoints = await placer.place_here(model, copies)
        except GatewayError as err:
            return _error(err.http_status, err.grpc_code, type(err).__name__, err.message, err.retry_after)
        return Response(orjson.dumps({"endpoints": endpoints}), media_type="application/json")

    return Starlette(routes=[Route(_PATH, place, methods=["POST"])])


def _error(status: int, code: str, kind: str, message: str, retry_after: int | None = None) -> Response:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else None
    return Response(orjson.dumps({"error": message, "code": code, "kind": kind}), status_code=status,
                    media_type="application/json", headers=headers)
