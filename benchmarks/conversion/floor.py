"""Floors (``--floor``): the gateway's own stack with no gateway logic, moving a 64 MiB body.

What grpc.aio and uvicorn cost by themselves bounds what any code on top of them can
reach: bare servers, each in a fresh process measured like a gateway row (peak growth
over one body, CPU and faults per request):

- ``grpc-echo``: a grpc.aio generic handler returning the request (receive + send);
- ``grpc-sink``: the same server answering ``b""`` (what grpcio's *server* holds to
  receive one message: bounds every path where the gateway's gRPC front receives a tensor);
- ``grpc-fetch``: a grpc.aio server that, per (tiny) request, fetches a 64 MiB message
  over a grpc.aio *channel* from a source in the benchmark process and answers ``b""``
  (what grpcio's *client* holds to receive one answer);
- ``grpc-push``: the same, but per request it builds a fresh 64 MiB message and sends it
  over the channel (the source answers ``b""``): what a gateway holds to send one tensor
  to a gRPC backend — the message it built plus whatever grpcio keeps beside it;
- ``asgi-sink``: a bare uvicorn ASGI app that reads the body and drops it (what uvicorn
  holds to receive one);
- the uvicorn echo three ways: joining the received chunks and sending one bytes object
  (what a straightforward handler does), filling one buffer sized by Content-Length
  instead, and that plus sending the answer as memoryview parts (no copy).

Run the servers with ``python -m benchmarks.conversion.floor MODE PORTFILE``.
"""
from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.procs import terminate, wait_for

from . import proc

__all__ = ["MODES", "measure_floors"]

MODES = ("grpc-echo", "grpc-sink", "grpc-fetch", "grpc-push",
         "asgi-sink", "asgi-join", "asgi-prealloc", "asgi-prealloc-parts")
_OPTIONS = [("grpc.max_send_message_length", 512 * 1024 * 1024),
            ("grpc.max_receive_message_length", 512 * 1024 * 1024)]
_METHOD = "/floor.Echo/Echo"


# ------------------------------------------------------------------------------------ servers
def _asgi_app(prealloc: bool, parts: bool, sink: bool = False):
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if sink:  # read and drop the body: what uvicorn itself holds to receive one
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        size = int(dict(scope["headers"]).get(b"content-length", b"0"))
        body: bytes | bytearray
        if prealloc:
            body = bytearray(size)
            view, pos = memoryview(body), 0
            while True:
                m = await receive()
                chunk = m.get("body", b"")
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
                if not m.get("more_body"):
                    break
        else:
            chunks = []
            while True:
                m = await receive()
                chunks.append(m.get("body", b""))
                if not m.get("more_body"):
                    break
            body = b"".join(chunks)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        if parts:
            view = memoryview(body)
            await send({"type": "http.response.body", "body": view[:1024], "more_body": True})
            await send({"type": "http.response.body", "body": view[1024:]})
        else:
            await send({"type": "http.response.body", "body": bytes(body) if prealloc else body})

    return app


async def _serve(mode: str, port_file: Path) -> None:
    if mode.startswith("grpc-"):
        import gateway as _gateway_package  # noqa: F401  (first: grpc's socket engine as the gateway chooses it)

        # isort: split
        import grpc
        from grpc import aio

        server = aio.server(options=_OPTIONS)
        source = None
        if mode in ("grpc-fetch", "grpc-push"):
            source = aio.insecure_channel(os.environ["FLOOR_SOURCE"], options=_OPTIONS).unary_unary(_METHOD)
        size = int(os.environ.get("FLOOR_SIZE", "0"))

        async def echo(request: bytes, context: Any) -> bytes:
            # For fetch/push a non-empty request is a warm-up: move 1 KiB, not the payload.
            if mode == "grpc-echo":
                return request
            if mode == "grpc-fetch":
                answer = await source(request, timeout=60)
                if len(answer) != (1024 if request else size):
                    raise RuntimeError(f"source answered {len(answer)} bytes")
            elif mode == "grpc-push":
                message = b"\1" * (1024 if request else size)  # fresh, as a gateway builds one
                await source(message, timeout=60)
                del message
            return b""

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "floor.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_file.write_text(str(port))
        await server.wait_for_termination()
        return
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    app = _asgi_app(mode != "asgi-join", mode == "asgi-prealloc-parts", mode == "asgi-sink")
    cfg = uvicorn.Config(app, loop="none", http="httptools", lifespan="off", log_level="warning")
    port_file.write_text(str(sock.getsockname()[1]))
    await uvicorn.Server(cfg).serve(sockets=[sock])


# ------------------------------------------------------------------------------------ measuring
async def _measure(mode: str, workdir: Path, env: dict[str, str] | None, size: int, n: int) -> dict[str, Any]:
    import aiohttp
    from grpc import aio

    port_file = workdir / f"floor-{mode}.port"
    port_file.unlink(missing_ok=True)
    payload = os.urandom(size)
    extra = dict(env or {})
    source = None
    if mode in ("grpc-fetch", "grpc-push"):
        # fetch: the source answers an empty request with the payload, a warm-up with
        # 1 KiB; push: it takes whatever comes and answers nothing.
        import grpc

        source = aio.server(options=_OPTIONS)
        small = payload[:1024]

        async def give(request: bytes, context: Any) -> bytes:
            if mode == "grpc-push":
                return b""
            return small if request else payload

        source.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "floor.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(give)}),))
        extra["FLOOR_SOURCE"] = f"127.0.0.1:{source.add_insecure_port('127.0.0.1:0')}"
        extra["FLOOR_SIZE"] = str(size)
        await source.start()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.conversion.floor", mode, str(port_file)],
                              env=dict(os.environ, **extra))
    request, expected = ((b"", 0) if mode in ("grpc-fetch", "grpc-push")
                         else (payload, 0 if mode.endswith("-sink") else size))
    try:
        port = int(wait_for(lambda: port_file.exists() and port_file.read_text(), timeout=30, what=mode))
        if mode.startswith("grpc-"):
            channel = aio.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS)
            call = channel.unary_unary(_METHOD)

            async def one(body: bytes) -> bytes:
                return await call(body, timeout=60)
        else:
            session = aiohttp.ClientSession()

            async def one(body: bytes) -> bytes:
                async with session.post(f"http://127.0.0.1:{port}/", data=body,
                                        timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    return await resp.read()
        try:
            for _ in range(2):
                await one(b"x" * 1024)
            reset = proc.reset_peak(server.pid)
            base = proc.memory(server.pid)["rss"]
            for _ in range(3):
                await one(request)
            c0, lat = proc.counters(server.pid), []
            for _ in range(n):
                t = time.perf_counter()
                answer = await one(request)
                lat.append(time.perf_counter() - t)
                if len(answer) != expected:
                    raise RuntimeError(f"{mode}: answer of {len(answer)} bytes, expected {expected}")
            d, mem = proc.counters(server.pid) - c0, proc.memory(server.pid)
        finally:
            await (channel.close() if mode.startswith("grpc-") else session.close())
        return {"mode": mode, "malloc_env": env is not None, "size_mib": size >> 20, "n": n, "peak_reset": reset,
                "x_payload": (mem["hwm"] - base) / size, "cpu_ms_per_req": d.cpu_s * 1e3 / n,
                "sys_ms_per_req": d.sys_s * 1e3 / n, "minflt_per_req": d.minflt / n,
                "median_ms": statistics.median(lat) * 1e3}
    finally:
        terminate(server)
        if source is not None:
            await source.stop(None)


async def measure_floors(workdir: Path, malloc_env: dict[str, str], size: int = 64 << 20,
                         n: int = 5, modes: tuple[str, ...] | list[str] = MODES) -> list[dict[str, Any]]:
    rows = []
    for mode in modes:
        for env in (None, malloc_env):
            rows.append(await _measure(mode, workdir, env, size, n))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| bare server (no gateway logic) | allocator | peak growth ÷ payload | CPU ms/req (sys) "
             "| minflt/req | median ms |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {'tuned' if r['malloc_env'] else 'default'} | {r['x_payload']:.2f} "
                     f"| {r['cpu_ms_per_req']:.0f} ({r['sys_ms_per_req']:.0f}) | {r['minflt_per_req']:.0f} "
                     f"| {r['median_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def _main() -> None:
    import uvloop

    uvloop.install()
    if sys.argv[1] == "measure":
        # python -m benchmarks.conversion.floor measure [MiB] [mode,...]: the floors alone.
        import tempfile

        from .cases import MALLOC_ENV

        size = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 64 << 20
        modes = sys.argv[3].split(",") if len(sys.argv) > 3 else MODES
        with tempfile.TemporaryDirectory() as tmp:
            rows = asyncio.run(measure_floors(Path(tmp), MALLOC_ENV, size, modes=modes))
        print(markdown(rows))
        return
    asyncio.run(_serve(sys.argv[1], Path(sys.argv[2])))


if __name__ == "__main__":
    _main()
