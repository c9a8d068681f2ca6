"""upstream/grpcdirect.py against a real grpc.aio server on loopback: the direct call gives
what grpc.aio's own multi-callable gives — the answer's bytes; an error's code, details and
trailing metadata; the deadline; the metadata sent — and a cancelled caller resets the
backend's stream, as grpc.aio does. A GrpcEndpoint being closed waits for its direct calls in
flight. And the installed grpcio still has the private objects it uses."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from gateway.config.schema import Backend, HostPort
from gateway.upstream import grpcdirect
from gateway.upstream.grpc import GrpcEndpoint, GrpcPool
from gateway.upstream.grpcdirect import DirectUnary

METHOD = "/inference.GRPCInferenceService/ModelInfer"


class Backend_:
    """A generic ModelInfer handler whose behaviour each test picks by the request's bytes."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.seen_metadata: tuple = ()

    async def infer(self, request: bytes, context: aio.ServicerContext) -> bytes:
        self.seen_metadata = tuple(context.invocation_metadata() or ())
        if request == b"fail":
            context.set_trailing_metadata((("x-why", "because"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unexpected inference input 'X'")
        if request == b"wait":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return b"answer:" + request


@pytest_asyncio.fixture(loop_scope="function")  # (the test's own loop: the server must serve it)
async def backend() -> AsyncIterator[tuple[Backend_, str]]:
    b = Backend_()
    server = aio.server()
    handler = grpc.unary_unary_rpc_method_handler(b.infer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield b, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def until(condition, turns: int = 1000) -> None:
    """Yield to the event loop until ``condition()`` holds (bounded in turns, not time)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_the_installed_grpcio_has_what_it_uses():
    assert grpcdirect._READY


async def test_answers_errors_deadlines_and_metadata_as_grpc_aio(backend):
    b, address = backend
    async with aio.insecure_channel(address) as ch:
        assert grpcdirect.supported(ch)
        direct, public = DirectUnary(ch, METHOD), ch.unary_unary(METHOD)
        assert direct._handle != 0  # registered with the channel
        assert await direct(b"x", timeout=10) == await public(b"x", timeout=10) == b"answer:x"
        assert [k for k, _ in b.seen_metadata] == ["user-agent"]  # grpc's own, as through grpc.aio
        await direct(b"y", metadata=(("traceparent", "00-abc-def-01"), ("x-request-id", "r1")))
        assert ("traceparent", "00-abc-def-01") in b.seen_metadata and ("x-request-id", "r1") in b.seen_metadata
        errors = []
        for call in (direct, public):
            with pytest.raises(aio.AioRpcError) as err:
                await call(b"fail", timeout=10)
            errors.append(err.value)
        for e in errors:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.details() == "unexpected inference input 'X'"
            assert ("x-why", "because") in tuple(e.trailing_metadata())
        for call in (direct, public):
            with pytest.raises(aio.AioRpcError) as err:
                await call(b"wait", timeout=0.2)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_an_unreachable_backend_is_unavailable_as_with_grpc_aio(backend):
    _, address = backend
    port = int(address.rsplit(":", 1)[1])
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))  # a port nobody listens on
    dead = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert port  # (the fixture's server is up: only ``dead`` is refused)
        async with aio.insecure_channel(dead) as ch:
            for call in (DirectUnary(ch, METHOD), ch.unary_unary(METHOD)):
                with pytest.raises(aio.AioRpcError) as err:
                    await call(b"x", timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        sock.close()


async def test_a_cancelled_caller_resets_the_backends_stream(backend):
    b, address = backend
    async with aio.insecure_channel(address) as ch:
        task = asyncio.ensure_future(DirectUnary(ch, METHOD)(b"wait", timeout=30))
        await asyncio.wait_for(b.started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(b.cancelled.wait(), 10)  # the backend's handler saw the reset
        assert await DirectUnary(ch, METHOD)(b"after", timeout=10) == b"answer:after"


async def test_closing_an_endpoint_waits_for_its_calls_in_flight(backend):
    b, address = backend
    host, port = address.rsplit(":", 1)
    backend_cfg = Backend(name="t", protocol="grpc", endpoints=(HostPort(host, int(port)),), timeout_s=20)
    pool = GrpcPool(backend_cfg)
    ep = GrpcEndpoint(HostPort(host, int(port)), backend_cfg)
    assert isinstance(ep.infer, DirectUnary)
    call = asyncio.ensure_future(pool._call(ep, lambda e: e.infer, b"wait", 20))
    await asyncio.wait_for(b.started.wait(), 10)
    assert ep.inflight == 1
    closing = asyncio.ensure_future(ep.close())
    await until(lambda: ep._drained is not None)  # close() is waiting for the call
    assert not closing.done()
    b.release.set()
    assert await asyncio.wait_for(call, 10) == b"answer:wait"
    await asyncio.wait_for(closing, 10)
    assert ep.inflight == 0
