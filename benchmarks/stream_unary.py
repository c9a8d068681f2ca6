"""Gateway CPU per ModelInfer sent unary against the same requests sent on ModelStreamInfer streams
(issue: a streamed request should cost no more than a unary one).

    .venv/bin/python -m benchmarks.stream_unary [--requests 4000] [--concurrency 16] [--rounds 3]

The gateway (one process, a gRPC backend) fronts the built-in reference server (``oip-gateway
reference``); the client is grpc.aio in this process: ``--concurrency`` unary callers, or as many
streams each writing a request and reading its answer in turn. CPU is the gateway process's
(utime + stime from /proc); the order of the two alternates per round. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.support.gateway import GatewayProcess, ReferenceServer, gateway_config
from tests.support.procs import wait_for

METHOD = "/inference.GRPCInferenceService/"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request() -> bytes:
    r = pb.ModelInferRequest(model_name="identity_FP32")
    t = r.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend([1, 16])
    r.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return r.SerializeToString()


async def unary(url: str, msg: bytes, n: int, c: int) -> None:
    async with grpc.aio.insecure_channel(url) as ch:
        call = ch.unary_unary(METHOD + "ModelInfer")

        async def caller() -> None:
            for _ in range(n // c):
                await call(msg, timeout=30)

        await asyncio.gather(*(caller() for _ in range(c)))


async def streamed(url: str, msg: bytes, n: int, c: int) -> None:
    async with grpc.aio.insecure_channel(url) as ch:
        call = ch.stream_stream(METHOD + "ModelStreamInfer")

        async def stream() -> None:
            s = call(timeout=120)
            for _ in range(n // c):
                await s.write(msg)
                await s.read()
            await s.done_writing()
            await s.code()

        await asyncio.gather(*(stream() for _ in range(c)))


async def answered(url: str, msg: bytes) -> bool:
    async with grpc.aio.insecure_channel(url) as ch:
        try:
            await ch.unary_unary(METHOD + "ModelInfer")(msg, timeout=5)
        except grpc.RpcError:
            return False
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stream-unary-"))
    msg = request()
    with ReferenceServer(work) as ref:
        cfg = gateway_config({"g": {"protocol": "grpc", "endpoints": [ref.grpc_url]}},
                             [{"model": "identity_FP32", "backend": "g"}])
        with GatewayProcess(cfg, work, "gw") as gw:
            wait_for(lambda: asyncio.run(answered(gw.grpc_url, msg)), timeout=30, what="the gateway answering")
            pid = gw.proc.pid
            print("| round | kind | gateway CPU µs/request | req/s |\n|--:|---|--:|--:|")
            for rnd in range(args.rounds):
                kinds = [("unary", unary), ("stream", streamed)]
                for name, run in kinds if rnd % 2 == 0 else kinds[::-1]:
                    c0, t0 = cpu_seconds(pid), time.perf_counter()
                    asyncio.run(run(gw.grpc_url, msg, args.requests, args.concurrency))
                    took, used = time.perf_counter() - t0, cpu_seconds(pid) - c0
                    print(f"| {rnd} | {name} | {used / args.requests * 1e6:.1f} | {args.requests / took:.0f} |",
                          flush=True)


if __name__ == "__main__":
    main()
