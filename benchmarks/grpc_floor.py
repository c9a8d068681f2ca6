"""The grpcio floor: a bare grpc.aio pass-through with no gateway code, the ``grpc-floor`` target.

    python -m benchmarks.grpc_floor --upstream 127.0.0.1:8001 --port-file /tmp/port [--port 0]

A grpc.aio server whose one generic handler takes every ``/inference.GRPCInferenceService/*``
call as raw bytes (no deserializer) and forwards those bytes over one grpc.aio channel to the
upstream (no serializer either), handing the answer's bytes back: exactly the gRPC machinery a
gRPC → gRPC gateway cannot avoid (receive a message, one client call, send the answer) and
nothing else — no routing, no parsing, no metrics, no access log, no metadata forwarding.
``ModelStreamInfer`` is passed through as a bidirectional stream, every other method as unary.

Same server options (``gateway.frontend.grpc.server_options``) and channel options
(``gateway.backends.grpc.channel_options``) as the gateway with its default limits, one
process, uvloop as ``gateway.cli`` installs it, and grpc's socket engine as the gateway chooses
it (gateway/grpcengine.py: the ``gateway`` package is imported before ``grpc``). The gateway's CPU per request on gRPC
workloads divided by this one's is how much its own code costs on top of grpcio.

Binds ``--port`` (default 0) on 127.0.0.1 and writes the bound port to ``--port-file``.
"""
from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gateway as _gateway_package  # noqa: F401  (first: it chooses grpc's socket engine before grpc loads)

# isort: split
import grpc
from grpc import aio

from gateway.backends.grpc import channel_options
from gateway.config.schema import DEFAULT_MAX_MESSAGE_BYTES
from gateway.config.security import Limits
from gateway.frontend.grpc import server_options

__all__ = ["PassThrough", "main", "serve"]

SERVICE_PREFIX = "/inference.GRPCInferenceService/"
STREAMING = frozenset({SERVICE_PREFIX + "ModelStreamInfer"})


class PassThrough(grpc.GenericRpcHandler):
    """Every method of the service, request bytes → channel → answer bytes; one handler per method, cached."""

    def __init__(self, channel: aio.Channel) -> None:
        self.channel = channel
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = self.handlers.get(method)
        if handler is None:
            if not method.startswith(SERVICE_PREFIX):
                return None
            handler = self.handlers[method] = self._make(method)
        return handler

    def _make(self, method: str) -> grpc.RpcMethodHandler:
        if method in STREAMING:
            stream = self.channel.stream_stream(method)

            async def forward_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
                try:
                    async for answer in stream(requests):
                        yield answer
                except aio.AioRpcError as exc:
                    await context.abort(exc.code(), exc.details() or "")

            return grpc.stream_stream_rpc_method_handler(forward_stream)

        call = self.channel.unary_unary(method)

        async def forward(request: bytes, context: Any) -> bytes:
            try:
                return await call(request)
            except aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
                raise  # not reached: abort raises

        return grpc.unary_unary_rpc_method_handler(forward)


async def serve(upstream: str, port: int, port_file: Path | None) -> None:
    # The gateway's defaults: max_message_bytes 256 MiB, max_header_bytes 32 KiB, default limits.
    channel = aio.insecure_channel(upstream, options=channel_options(DEFAULT_MAX_MESSAGE_BYTES))
    server = aio.server(options=server_options(DEFAULT_MAX_MESSAGE_BYTES, max_metadata_bytes=32768,
                                               limits=Limits()))
    server.add_generic_rpc_handlers((PassThrough(channel),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{port}")
    await server.start()
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file)
    print(f"grpc floor on 127.0.0.1:{bound} → {upstream}", flush=True)
    try:
        await server.wait_for_termination()
    finally:
        await channel.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grpc_floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="host:port of the gRPC server to pass calls to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default 0: any free one)")
    ap.add_argument("--port-file", type=Path, help="write the bound port here")
    args = ap.parse_args(argv)
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as gateway.cli does
    try:
        asyncio.run(serve(args.upstream, args.port, args.port_file))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
