"""The Python HTTP floor: a bare HTTP/1.1 pass-through with no gateway code, the ``http-floor`` target.

    python -m benchmarks.http_floor --upstream 127.0.0.1:8000 --port-file /tmp/port [--mode raw|asgi]

``raw``: an asyncio protocol over httptools' request parser (uvloop), one task per request that
forwards method, path, body and content headers through the gateway's own HTTP/1.1 client
(``gateway.backends.h1``) and writes the answer back — the least a Python HTTP → HTTP proxy
with an async handler does per request. ``asgi``: the same handler behind uvicorn (httptools
protocol) as an ASGI app, which is how the gateway's front end is served; the difference is
uvicorn's share. Neither routes, limits, meters nor logs anything.

The gateway's CPU per request on HTTP workloads divided by ``raw``'s is how much its own
code (and its server layer) costs on top of the bare machinery.
"""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import httptools

from gateway.backends.h1 import H1ConnectionPool

__all__ = ["main"]

_FORWARD = frozenset({b"content-type", b"inference-header-content-length", b"content-encoding"})


class RawServer(asyncio.Protocol):
    """One client connection: httptools parses, a task per request forwards it."""

    def __init__(self, pool: H1ConnectionPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _FORWARD:
            self.headers[name.decode("latin-1")] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        body = b"".join(self.body)
        asyncio.get_running_loop().create_task(self.forward(method, self.url.decode("latin-1"), body, self.headers))

    async def forward(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> None:
        reply = await self.pool.request(method, path, body=body or None, headers=headers, timeout=60)
        data = reply.body
        assert isinstance(data, (bytes, bytearray))
        extra = b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
                         for k, v in reply.headers.items() if k.encode("latin-1") in _FORWARD)
        head = b"HTTP/1.1 %d OK\r\n%scontent-length: %d\r\n\r\n" % (reply.status, extra, len(data))
        assert self.transport is not None
        self.transport.write(head + data if len(data) < 65536 else head)
        if len(data) >= 65536:
            self.transport.write(data)


def asgi_app(pool: H1ConnectionPool) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _FORWARD}
        reply = await pool.request(scope["method"], scope["path"], body=b"".join(chunks) or None, headers=headers,
                                   timeout=60)
        data = reply.body
        assert isinstance(data, (bytes, bytearray))
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()
               if k.encode("latin-1") in _FORWARD]
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [*out, (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return app


async def serve(upstream: str, port: int, port_file: Path, mode: str) -> None:
    host, _, up_port = upstream.rpartition(":")
    pool = H1ConnectionPool(host, int(up_port), connect_timeout=5)
    loop = asyncio.get_running_loop()
    if mode == "raw":
        server = await loop.create_server(lambda: RawServer(pool), "127.0.0.1", port, backlog=2048)
        bound = server.sockets[0].getsockname()[1]
        port_file.write_text(str(bound))
        await server.serve_forever()
    else:
        import socket

        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(2048)
        config = uvicorn.Config(asgi_app(pool), loop="none", http="httptools", lifespan="off", access_log=False,
                                log_level="warning", server_header=False, proxy_headers=False)
        server_ = uvicorn.Server(config)
        port_file.write_text(str(sock.getsockname()[1]))
        await server_.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.http_floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="host:port of the backend's HTTP listener")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--mode", choices=("raw", "asgi"), default="raw")
    args = ap.parse_args(argv)
    import uvloop

    uvloop.install()
    asyncio.run(serve(args.upstream, args.port, args.port_file, args.mode))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
