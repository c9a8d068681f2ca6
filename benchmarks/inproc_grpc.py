"""The gateway's own cost per small gRPC inference, measured in one process.

    python -m benchmarks.inproc_grpc [--requests 2000] [--batches 4] [--concurrency 16]
        [--only via|floor|direct]

The gRPC counterpart of benchmarks/inproc.py: a real gateway (``gateway.server.Gateway``, its
gRPC listener, backend and health checks), a canned gRPC backend (a grpc.aio server answering
every ModelInfer with add_sub's answer, bytes in and out) and a grpc.aio client (raw bytes, no
serializer) run on one uvloop event loop over loopback. Three paths are measured:

* ``direct``: the client against the backend (the client's and the backend's cost);
* ``floor``: through benchmarks/grpc_floor.py's bare pass-through (grpcio's own cost of a
  proxied call, with the gateway's server and channel options);
* ``via``: through the gateway.

``via − direct`` is the gateway; ``via − floor`` is the gateway's own code on top of grpcio —
what the load benchmark's "× floor" column prices. Under callgrind (benchmarks/instructions.py
``--body grpc_small``) the counts do not move with the machine's noise; grpc's core threads run
serialised there, so take the absolute numbers loosely and the differences between trees as
the signal.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import time

import gateway as _gateway_package  # noqa: F401  (first: it chooses grpc's socket engine before grpc loads)

# isort: split
import grpc
import uvloop
from grpc import aio

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.backends.grpc import channel_options
from gateway.config.loader import parse_config
from gateway.config.schema import DEFAULT_MAX_MESSAGE_BYTES
from gateway.config.security import Limits
from gateway.frontend.grpc import server_options
from gateway.malloc import tune_malloc
from gateway.server import Gateway

from .grpc_floor import PassThrough
from .workloads import _grpc_small

__all__ = ["main", "measure"]

INFER = "/inference.GRPCInferenceService/ModelInfer"
SIDES = ("via", "floor", "direct")


def _answer() -> bytes:
    """What Triton answers to add_sub's small request: two FP32 [16] outputs as raw contents."""
    answer = pb.ModelInferResponse(model_name="add_sub", model_version="1", id="bench")
    for name in ("OUTPUT0", "OUTPUT1"):
        t = answer.outputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(16)
    answer.raw_output_contents.extend([bytes(64), bytes(64)])
    return answer.SerializeToString()


class _Backend(grpc.GenericRpcHandler):
    """Every inference answered with the canned bytes; readiness for the gateway's health checks."""

    def __init__(self) -> None:
        answer = _answer()
        live = pb.ServerLiveResponse(live=True).SerializeToString()
        ready = pb.ModelReadyResponse(ready=True).SerializeToString()

        async def infer(request: bytes, context: aio.ServicerContext) -> bytes:
            return answer

        async def server_live(request: bytes, context: aio.ServicerContext) -> bytes:
            return live

        async def model_ready(request: bytes, context: aio.ServicerContext) -> bytes:
            return ready

        self.handlers = {
            INFER: grpc.unary_unary_rpc_method_handler(infer),
            "/inference.GRPCInferenceService/ServerLive": grpc.unary_unary_rpc_method_handler(server_live),
            "/inference.GRPCInferenceService/ServerReady": grpc.unary_unary_rpc_method_handler(server_live),
            "/inference.GRPCInferenceService/ModelReady": grpc.unary_unary_rpc_method_handler(model_ready),
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)


async def _server(handler: grpc.GenericRpcHandler) -> tuple[aio.Server, int]:
    server = aio.server(options=server_options(DEFAULT_MAX_MESSAGE_BYTES, limits=Limits()))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _run(port: int, request: bytes, requests: int, concurrency: int) -> tuple[float, float]:
    """``requests`` calls over one channel, ``concurrency`` at a time: (user, system) CPU seconds."""
    async with aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options(DEFAULT_MAX_MESSAGE_BYTES)) as ch:
        call = ch.unary_unary(INFER)
        await call(request)  # the connection, before the clock starts
        left = requests

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await call(request)

        before, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        after, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time() - cpu
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    share = user / (user + system) if user + system else 1.0
    return cpu * share, cpu * (1 - share)


async def measure(requests: int, batches: int, concurrency: int, only: str | None = None) -> dict[str, float]:
    """CPU µs per request on each side (best of ``batches``). ``only``: run just that side after a
    fixed warm-up of 50 requests (benchmarks/instructions.py counts one side at two request counts)."""
    backend, backend_port = await _server(_Backend())
    upstream = aio.insecure_channel(f"127.0.0.1:{backend_port}", options=channel_options(DEFAULT_MAX_MESSAGE_BYTES))
    floor, floor_port = await _server(PassThrough(upstream))
    config = parse_config({
        "listen": {"http": None, "grpc": "127.0.0.1:0", "metrics": None},
        "backends": {"triton": {"protocol": "grpc", "endpoints": [f"127.0.0.1:{backend_port}"], "timeout_s": 300}},
        "routes": [{"model": "add_sub", "backend": "triton"}],
        "health": {"interval_s": 5.0, "timeout_s": 30.0},
    })
    gateway = Gateway(config)
    ports = await gateway.start()
    assert ports.grpc is not None
    request = _grpc_small()[5:]  # the message without its gRPC frame header
    port = {"via": ports.grpc, "floor": floor_port, "direct": backend_port}
    sides = SIDES if only is None else (only,)
    for side in sides:  # warm: connections, caches, metric children
        await _run(port[side], request, max(4, requests // 20) if only is None else 50, concurrency)
    if only is not None:
        gc.collect()
        gc.freeze()  # (benchmarks/inproc.py: a full collection of the start-up heap is not per request)
    best = {side: (float("inf"), 0.0) for side in sides}
    for _ in range(batches):
        for side in sides:
            best[side] = min(best[side], await _run(port[side], request, requests, concurrency), key=sum)
    await gateway.stop()
    await floor.stop(None)
    await upstream.close()
    await backend.stop(None)
    per = 1e6 / requests
    return {f"{side}_us": sum(best[side]) * per for side in sides}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--only", choices=SIDES, help="run only this side, after a fixed warm-up")
    args = parser.parse_args(argv)
    tune_malloc(DEFAULT_MAX_MESSAGE_BYTES)  # the allocator as `oip-gateway serve` sets it up (gateway/malloc.py)
    result = uvloop.run(measure(args.requests, args.batches, args.concurrency, args.only))
    text = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in result.items())
    if args.only is None:
        text += (f" µs/req: gateway {result['via_us'] - result['direct_us']:.1f}, floor "
                 f"{result['floor_us'] - result['direct_us']:.1f}, gateway ÷ floor "
                 f"{(result['via_us'] - result['direct_us']) / (result['floor_us'] - result['direct_us']):.2f}")
    print(f"grpc_small c={args.concurrency}: {text}")


if __name__ == "__main__":
    main()
