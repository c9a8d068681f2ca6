"""The benchmark's clients: pre-built bodies sent as they are, answers read as bytes.

No tritonclient on the hot path: it would serialise every tensor per request and parse
every answer, and that cost lands on the same 2 vCPUs the gateway and Triton share.
HTTP goes through one aiohttp session (keep-alive, one connection per in-flight
request); gRPC through one grpc.aio channel with a generic ModelInfer call (bytes in,
bytes out). An answer is checked by its size and tail (the output is the input tensor),
which costs a memcmp, not a parse.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from grpc import aio

from .payloads import MODEL, Bodies

__all__ = ["Client", "GrpcClient", "HttpClient", "check_answer", "run_requests"]

_MAX = 512 * 1024 * 1024
INFER = "/inference.GRPCInferenceService/ModelInfer"


class Client:
    async def infer(self, bodies: Bodies, timeout: float) -> bytes:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class HttpClient(Client):
    def __init__(self, address: str, form: str) -> None:
        self.url = f"http://{address}/v2/models/{MODEL}/infer"
        self.form = form
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            read_bufsize=4 * 1024 * 1024,
        )

    async def infer(self, bodies: Bodies, timeout: float) -> bytes:
        async with self.session.post(
            self.url, data=bodies.http_body(self.form), headers=bodies.http_headers(self.form),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
            return data

    async def close(self) -> None:
        await self.session.close()


class GrpcClient(Client):
    def __init__(self, address: str) -> None:
        self.channel = aio.insecure_channel(
            address, options=[("grpc.max_send_message_length", _MAX), ("grpc.max_receive_message_length", _MAX)]
        )
        self.call = self.channel.unary_unary(INFER)

    async def infer(self, bodies: Bodies, timeout: float) -> bytes:
        try:
            return await self.call(bodies.grpc, timeout=timeout)
        except aio.AioRpcError as exc:
            raise RuntimeError(f"gRPC {exc.code().name}: {exc.details()}") from None

    async def close(self) -> None:
        await self.channel.close()


def check_answer(answer: bytes, bodies: Bodies, form: str) -> None:
    """The identity model returns INPUT0: binary and gRPC answers end with its raw bytes."""
    if form == "json":
        if b'"OUTPUT0"' not in answer[:1024] or len(answer) < bodies.nbytes:
            raise RuntimeError(f"unexpected JSON answer of {len(answer)} bytes: {answer[:200]!r}")
        return
    if len(answer) < bodies.nbytes or answer[-bodies.nbytes :] != bodies.raw:
        raise RuntimeError(f"answer of {len(answer)} bytes does not end with the {bodies.nbytes} input bytes")


async def run_requests(
    call: Callable[[], Awaitable[bytes]], n: int, concurrency: int
) -> list[float]:
    """``n`` calls, ``concurrency`` at a time (each worker sends its next as soon as one returns);
    per-call wall seconds."""
    latencies: list[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies

