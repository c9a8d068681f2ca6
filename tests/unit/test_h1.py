"""The lean HTTP/1.1 client against real sockets served by scripted asyncio servers."""
from __future__ import annotations

import asyncio
import random
import socket

import pytest

from gateway.backends.h1 import (
    BadAnswer,
    BodyStream,
    ConnectFailed,
    ConnectionDropped,
    H1ConnectionPool,
    SourceStalled,
)
from gateway.backends.h1.connection import Connection as _Connection


async def serve(handler):
    """Start a TCP server on port 0 whose connections are handled by ``handler(reader, writer)``."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def test_keep_alive_reuses_one_connection():
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        while True:
            try:
                _, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    for i in range(5):
        r = await pool.request("POST", "/x", body=b"hello %d" % i, headers={"Content-Type": "a/b"}, timeout=2)
        assert (r.status, r.body, r.headers["content-type"]) == (200, b"hello %d" % i, "application/json")
    assert connections == 1
    pool.close()
    server.close()


async def test_chunked_response_and_large_body():
    big = bytes(range(256)) * 40_000  # ~10 MB

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(big), 1 << 20):
            chunk = big[i:i + (1 << 20)]
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    r = await pool.request("POST", "/x", body=big, timeout=10)
    assert r.body == big
    pool.close()
    server.close()


async def test_stale_keep_alive_connection_is_retried_once():
    """The server closes the idle connection; the next request goes out on a fresh one."""
    served = 0

    async def handler(reader, writer):
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # no keep-alive announced, but closes right after answering

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    for _ in range(3):
        assert (await pool.request("GET", "/", timeout=2)).body == b"ok"
    assert served == 3
    pool.close()
    server.close()


async def test_connection_refused():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    pool = H1ConnectionPool("127.0.0.1", sock.getsockname()[1], connect_timeout=2)
    with pytest.raises(ConnectFailed):
        await pool.request("GET", "/", timeout=2)
    sock.close()


async def test_timeout_closes_the_connection():
    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    with pytest.raises(TimeoutError):
        await pool.request("GET", "/", timeout=0.2)
    assert pool._idle == []
    pool.close()
    server.close()


async def test_each_exchange_is_timed_by_its_own_deadline_on_one_connection():
    """One timer per connection, armed lazily (h1.py _arm): a deadline left behind by an
    earlier exchange neither ends a later, longer one early, nor lets a stalled one run long."""
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        while True:
            try:
                _, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if body == b"hang":
                await asyncio.sleep(10)
            if body == b"slow":
                await asyncio.sleep(0.6)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    loop = asyncio.get_running_loop()
    assert (await pool.request("POST", "/x", body=b"quick", timeout=0.3)).body == b"quick"
    # Answered after the first exchange's deadline has passed: the timer fires then, finds
    # this exchange's later deadline and waits for it.
    assert (await pool.request("POST", "/x", body=b"slow", timeout=5)).body == b"slow"
    assert connections == 1
    start = loop.time()
    with pytest.raises(TimeoutError):
        await pool.request("POST", "/x", body=b"hang", timeout=0.3)
    assert 0.3 - 0.002 <= loop.time() - start < 5  # its own deadline, not the 5 s one armed before
    assert pool._idle == [] and pool.busy == 0
    pool.close()
    server.close()


async def test_dropped_mid_answer_is_not_retried():
    calls = 0

    async def handler(reader, writer):
        nonlocal calls
        calls += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    with pytest.raises(ConnectionDropped) as info:
        await pool.request("POST", "/", body=b"x", timeout=2)
    assert not info.value.before_response and calls == 1
    pool.close()
    server.close()


async def test_malformed_response():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    with pytest.raises(BadAnswer) as caught:
        await pool.request("GET", "/", timeout=2)
    assert caught.value.kind == BadAnswer.FRAMING
    pool.close()
    server.close()


async def test_max_connections_queues_instead_of_opening_more():
    open_now = 0
    most = 0

    async def handler(reader, writer):
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while True:
                try:
                    await read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                await asyncio.sleep(0.01)  # a backend that takes a moment per request
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            open_now -= 1

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=2)
    results = await asyncio.gather(*(pool.request("GET", "/", timeout=10) for _ in range(12)))
    assert [r.body for r in results] == [b"ok"] * 12
    assert most <= 2
    pool.close()
    server.close()


async def test_waiting_for_a_connection_times_out():
    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    first = asyncio.ensure_future(pool.request("GET", "/", timeout=5))
    await asyncio.sleep(0)  # let the first request take the only connection
    with pytest.raises(TimeoutError, match="busy"):
        await pool.request("GET", "/", timeout=0.2)
    first.cancel()
    pool.close()
    server.close()


# -- streamed answers (BodyStream) ------------------------------------------------------------
BIG = bytes(range(256)) * 32_768  # 8 MiB


async def wait_until(cond, what: str, timeout: float = 5.0) -> None:
    """Poll a condition on the running loop, bounded."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def collect(stream) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def big_answers(connections: list[int] | None = None):
    """A server answering every request on a connection with BIG, in 1 MiB writes."""
    async def handler(reader, writer):
        if connections is not None:
            connections.append(1)
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG))
            for i in range(0, len(BIG), 1 << 20):
                writer.write(BIG[i:i + (1 << 20)])
                await writer.drain()

    return await serve(handler)


async def test_large_answer_is_streamed_and_the_connection_reused():
    connections: list[int] = []
    server, port = await big_answers(connections)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    for _ in range(3):
        r = await pool.request("POST", "/", body=b"x", timeout=10, stream_min=1 << 20)
        assert isinstance(r.body, BodyStream) and r.body.length == len(BIG)
        assert await collect(r.body) == BIG
        r.body.close()
    # Small answers below stream_min stay plain bytes; the one connection was reused throughout
    # (max_connections=1 also proves each stream gave its slot back).
    assert len(connections) == 1 and pool.busy == 0
    pool.close()
    server.close()


async def test_small_answer_is_not_streamed():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    r = await pool.request("GET", "/", timeout=2, stream_min=1 << 20)
    assert r.body == b"ok"
    pool.close()
    server.close()


async def paused_stream(big: bytes):
    """A server answering ``big`` in 1 MiB writes to a request nobody reads the answer of, until
    the stream has paused reading at its high mark: (server, pool, stream)."""
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for i in range(0, len(big), 1 << 20):
            writer.write(big[i:i + (1 << 20)])
            await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    r = await pool.request("GET", "/", timeout=20, stream_min=1 << 20)
    stream = r.body
    await wait_until(lambda: stream._paused, "the stream to pause reading")
    return server, pool, stream


async def test_slow_reader_pauses_the_backend():
    """Nobody reads the stream: the client stops reading the socket at the high mark
    instead of queueing the whole 32 MiB answer, and resumes when it is drained."""
    big = BIG * 4
    server, pool, stream = await paused_stream(big)
    assert stream._queued <= BodyStream._HIGH + (1 << 20)
    assert await collect(stream) == big
    pool.close()
    server.close()


async def test_ready_takes_every_queued_chunk_and_resumes_a_paused_stream():
    """``ready()``: what is queued now, in order, all of it — the stream that paused reading at
    the high mark reads again; chunks still to come arrive through the iteration."""
    big = BIG * 4
    server, pool, stream = await paused_stream(big)
    got = [bytes(await stream.__anext__())]
    queued = stream.ready()
    assert queued and not stream._paused and stream._queued == 0 and stream.ready() == []
    got += [bytes(c) for c in queued]
    got.append(await collect(stream))
    assert b"".join(got) == big
    pool.close()
    server.close()


async def test_backend_dies_mid_stream():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG))
        writer.write(BIG[: 2 << 20])
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    r = await pool.request("GET", "/", timeout=5, stream_min=1 << 20)
    got = 0
    with pytest.raises(ConnectionDropped) as info:
        async for chunk in r.body:
            got += len(chunk)
    assert not info.value.before_response and got <= 2 << 20
    assert pool._idle == [] and pool.busy == 0
    pool.close()
    server.close()


async def test_stalled_stream_times_out_and_frees_the_slot():
    release = asyncio.Event()

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG))
        writer.write(BIG[: 1 << 20])
        await writer.drain()
        await release.wait()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    r = await pool.request("GET", "/", timeout=0.3, stream_min=1 << 20)
    with pytest.raises(TimeoutError):
        await collect(r.body)
    assert pool._idle == [] and pool.busy == 0
    release.set()
    pool.close()
    server.close()


async def test_abandoned_stream_closes_its_connection():
    async def handler(reader, writer):
        try:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG))
            for i in range(0, len(BIG), 1 << 20):
                writer.write(BIG[i:i + (1 << 20)])
                await writer.drain()
        except ConnectionError:
            pass

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    r = await pool.request("GET", "/", timeout=5, stream_min=1 << 20)
    await anext(aiter(r.body))
    r.body.close()
    assert pool._idle == [] and pool.busy == 0
    # The next request gets a fresh connection and a whole answer.
    r = await pool.request("GET", "/", timeout=5, stream_min=1 << 20)
    assert await collect(r.body) == BIG
    pool.close()
    server.close()


# -- streamed request bodies (sources) ------------------------------------------------------
class Source:
    """A request-body source as the front end's IncomingBody behaves: chunks handed out
    once, ``consumed`` once any has been; it can wait between chunks."""

    def __init__(self, data: bytes, chunk: int = 1 << 20, gate: asyncio.Event | None = None) -> None:
        self.data, self.chunk, self.gate = data, chunk, gate
        self.length = len(data)
        self.consumed = False
        self.handed = 0

    async def __aiter__(self):
        for i in range(0, len(self.data), self.chunk):
            if i and self.gate is not None:
                await self.gate.wait()
            self.consumed = True
            self.handed += 1
            yield self.data[i:i + self.chunk]


async def echo_handler(reader, writer):
    while True:
        try:
            _, body = await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


async def test_source_body_is_streamed_with_backpressure():
    """A server that reads slowly makes the client wait (write buffer full) instead of
    taking the whole 32 MiB source into memory; the bytes arrive intact."""
    big = BIG * 4
    reading = asyncio.Event()
    seen: list[bool] = []

    async def handler(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        await reading.wait()
        body = await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body[-16:].ljust(len(body), b"-"))
        await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    conns = []
    # The pool's connections, recorded as the loop makes them (the pool's own methods cannot be
    # replaced: setup.py may compile it).
    loop = asyncio.get_running_loop()
    create_connection = loop.create_connection

    async def recording(*args, **kwargs):
        transport, protocol = await create_connection(*args, **kwargs)
        conns.append(protocol)
        return transport, protocol

    loop.create_connection = recording  # type: ignore[method-assign]
    try:
        source = Source(big)
        call = asyncio.ensure_future(pool.request("POST", "/", body=source, timeout=20))
        await wait_until(lambda: conns and conns[0].write_paused, "the socket's write buffer to fill")
        seen.append(source.handed < len(big) >> 20 and not call.done())
        reading.set()
        r = await call
    finally:
        del loop.create_connection
    assert seen == [True] and r.body[:16] == big[-16:] and len(r.body) == len(big)
    pool.close()
    server.close()


async def test_source_goes_out_on_a_fresh_connection_after_idling():
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        await echo_handler(reader, writer)

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    assert (await pool.request("POST", "/", body=b"a", timeout=2)).body == b"a"
    assert (await pool.request("POST", "/", body=Source(b"b" * 100), timeout=2)).body == b"b" * 100
    assert connections == 1  # idle for microseconds: reused
    pool._idle[-1].idle_since -= 60  # as if idle for a minute
    assert (await pool.request("POST", "/", body=Source(b"c" * 100), timeout=2)).body == b"c" * 100
    assert connections == 2  # not risked on a connection the server may be closing
    assert (await pool.request("POST", "/", body=b"d", timeout=2)).body == b"d"  # bytes may reuse any
    pool.close()
    server.close()


async def test_consumed_source_is_not_retried():
    calls = 0

    async def handler(reader, writer):
        nonlocal calls
        calls += 1
        await reader.readexactly(1 << 20)  # head and part of the body, then drop the connection
        writer.transport.abort()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    with pytest.raises(ConnectionDropped) as info:
        await pool.request("POST", "/", body=Source(BIG), timeout=5)
    assert not info.value.before_response and calls == 1
    pool.close()
    server.close()


async def test_early_answer_stops_the_upload_and_retires_the_connection():
    gate = asyncio.Event()
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nbig!")
        await writer.drain()
        gate.set()  # the source goes on only after the answer is out
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    source = Source(BIG, gate=gate)
    r = await pool.request("POST", "/", body=source, timeout=5)
    assert (r.status, r.body) == (413, b"big!")
    assert source.handed < len(BIG) >> 20 and pool._idle == []  # stopped early; connection not reused
    pool.close()
    server.close()


async def test_stream_ending_while_paused_leaves_the_connection_readable():
    """The chunk that crosses the high mark also ends the answer (it is HIGH + 1 bytes):
    reading was paused and must be resumed for the connection's next exchange."""
    body = b"y" * (BodyStream._HIGH + 1)

    async def handler(reader, writer):
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    for _ in range(3):
        r = await pool.request("GET", "/", timeout=5, stream_min=1 << 20)
        stream = r.body
        await wait_until(lambda s=stream: s._finished, "the whole answer to arrive unread")
        assert await collect(r.body) == body
    pool.close()
    server.close()


class SlowSource(Source):
    """A client uploading steadily but slowly: ``gap`` seconds between chunks (the
    behaviour under test, not synchronisation)."""

    def __init__(self, data: bytes, chunk: int, gap: float, stall_after: int | None = None) -> None:
        super().__init__(data, chunk)
        self.gap, self.stall_after = gap, stall_after

    async def __aiter__(self):
        for n, i in enumerate(range(0, len(self.data), self.chunk)):
            if self.stall_after is not None and n == self.stall_after:
                await asyncio.Event().wait()  # the client goes silent, connection open
            if i:
                await asyncio.sleep(self.gap)
            self.consumed = True
            self.handed += 1
            yield self.data[i:i + self.chunk]


async def test_slow_upload_is_bounded_per_wait_not_in_total():
    """The exchange timeout starts once the body is out (as Envoy's route timeout): an
    upload that takes longer than the timeout but never pauses as long succeeds."""
    server, port = await serve(echo_handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    data = bytes(range(256)) * 64  # 8 chunks of 2 KiB: 7 gaps of 0.1 s = 0.7 s in all
    r = await pool.request("POST", "/", body=SlowSource(data, 2048, gap=0.1), timeout=0.5)
    assert r.body == data
    pool.close()
    server.close()


async def test_streamed_uploads_leave_no_reference_cycles():
    """A streamed body's pump leaves nothing for the cyclic collector: at 64 concurrent large
    requests the collections that garbage brings cost ~2 % of the gateway's CPU (gcpolicy.py).
    (Compiled by mypyc, a nested timer callback that re-arms itself and its enclosing
    environment referred to each other: a cycle per request.)"""
    import gc

    server, port = await serve(echo_handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    data = bytes(range(256)) * 1024
    r = await pool.request("POST", "/", body=Source(data, 64 * 1024), timeout=5)  # (a warm connection)
    assert r.body == data
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            r = await pool.request("POST", "/", body=Source(data, 64 * 1024), timeout=5)
            assert r.body == data
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    pool.close()
    server.close()


async def test_stalled_upload_raises_source_stalled():
    server, port = await serve(echo_handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    with pytest.raises(SourceStalled):
        await pool.request("POST", "/", body=SlowSource(BIG, 1 << 20, gap=0, stall_after=2), timeout=0.3)
    assert pool._idle == [] and pool.busy == 0
    pool.close()
    server.close()


async def test_backend_not_reading_the_upload_times_out():
    async def handler(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(30)  # reads nothing more: the socket's buffers fill up

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    with pytest.raises(TimeoutError, match="took no request body"):
        await pool.request("POST", "/", body=Source(BIG * 8), timeout=0.3)
    pool.close()
    server.close()


# -- request_now: the exchange started without a coroutine (frontend/infer.py infer_now) ---------
def outcome_of(pool: H1ConnectionPool, body: bytes, timeout: float = 5.0, stream_min: int | None = None):
    """request_now's callback outcome as a future; None if it declined."""
    fut = asyncio.get_running_loop().create_future()
    started = pool.request_now("POST", "/x", body, {"content-type": "a/b"}, timeout, stream_min,
                               lambda result: fut.done() or fut.set_result(result))
    return fut if started else None


async def echo_server(counter: list[int]):
    async def handler(reader, writer):
        counter.append(1)
        while True:
            try:
                _, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    return await serve(handler)


async def test_request_now_needs_a_kept_alive_connection_then_reuses_it():
    connections: list[int] = []
    server, port = await echo_server(connections)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    assert outcome_of(pool, b"a") is None  # no connection yet: declined, nothing sent
    await pool.request("POST", "/x", body=b"warm", timeout=5)
    for i in range(5):
        fut = outcome_of(pool, b"now %d" % i)
        assert fut is not None and pool.busy == 1
        assert outcome_of(pool, b"second") is None  # the only slot is taken
        r = await fut
        assert (r.status, r.body) == (200, b"now %d" % i)
        assert pool.busy == 0
    assert len(connections) == 1
    pool.close()
    server.close()


async def test_request_now_timeout_closes_the_connection_and_frees_the_slot():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)
        await asyncio.sleep(10)  # the second request is never answered

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    await pool.request("POST", "/x", body=b"warm", timeout=5)
    fut = outcome_of(pool, b"slow", timeout=0.2)
    assert fut is not None
    assert isinstance(await fut, TimeoutError)
    assert pool.busy == 0 and pool._idle == []
    pool.close()
    server.close()


@pytest.mark.parametrize("fresh_answers", [True, False])
async def test_request_now_sends_again_after_the_keep_alive_race(fresh_answers):
    """The backend drops the kept-alive connection as the request reaches it, without a byte
    of answer: as request() does, it goes out again on a fresh connection; if that one fails
    the same way, the callback gets ConnectionDropped(before_response=True)."""
    connections: list[int] = []

    async def handler(reader, writer):
        connections.append(1)
        await read_request(reader)
        if len(connections) == 1 or fresh_answers:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        if len(connections) == 1:
            await read_request(reader)
        writer.transport.abort()  # read, then dropped without a byte of answer

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    await pool.request("POST", "/x", body=b"warm", timeout=5)
    fut = outcome_of(pool, b"lost")
    assert fut is not None
    result = await fut
    if fresh_answers:
        assert (result.status, result.body) == (200, b"ok")
    else:
        assert isinstance(result, ConnectionDropped) and result.before_response
    assert len(connections) == 2
    await wait_until(lambda: pool.busy == 0, "the slot to come back")
    pool.close()
    server.close()


async def test_request_now_streams_a_large_answer_and_gives_the_slot_back_at_its_end():
    server, port = await big_answers()
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    first = await pool.request("POST", "/x", body=b"warm", timeout=10, stream_min=1 << 20)
    assert await collect(first.body) == BIG
    for _ in range(2):
        fut = outcome_of(pool, b"x", timeout=10, stream_min=1 << 20)
        assert fut is not None
        r = await fut
        assert isinstance(r.body, BodyStream) and r.body.length == len(BIG)
        assert pool.busy == 1  # held until the body has come
        assert await collect(r.body) == BIG
        assert pool.busy == 0
    pool.close()
    server.close()


async def test_request_now_skips_an_idle_connection_the_backend_closed():
    connections: list[int] = []

    async def handler(reader, writer):
        connections.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # one answer per connection

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    await pool.request("POST", "/x", body=b"warm", timeout=5)
    await wait_until(lambda: not pool._idle or pool._idle[0].closed, "the close to be seen")
    assert outcome_of(pool, b"x") is None  # the closed connection is not used; none other idle
    assert pool.busy == 0
    pool.close()
    server.close()


# -- a streamed answer's body read past the parser (h1.connection.Connection.buffer_updated / _raw_read) --

RANDOM = random.Random(7).randbytes(3 << 20)  # no period: a chunk written over would show


def reads_of(monkeypatch) -> asyncio.Event:
    """Set each time a backend connection has taken a read from its socket."""
    seen = asyncio.Event()
    original = _Connection.buffer_updated

    def spy(self, nbytes):
        original(self, nbytes)
        seen.set()

    monkeypatch.setattr(_Connection, "buffer_updated", spy)
    return seen


async def test_streamed_body_is_read_raw_and_exact_wherever_the_head_splits(monkeypatch):
    """The head of a large answer arrives in two reads, split anywhere — inside its blank line
    too, or after part of the body; the rest of the body is read past the parser into the
    connection's own buffers (its chunks are views of them) and every byte is right, also once
    all of them have been kept to the end (none was written over); a new parser then reads the
    connection's next answer."""
    reads = reads_of(monkeypatch)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(RANDOM)
    splits = [1, len(head) - 4, len(head) - 3, len(head) - 2, len(head) - 1, len(head), len(head) + 1,
              len(head) + 70_000]
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        whole = head + RANDOM
        for k in splits:
            await read_request(reader)
            reads.clear()
            writer.write(whole[:k])
            await writer.drain()
            await reads.wait()  # the client has read the first part: the rest comes as another read
            writer.write(whole[k:])
            await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    kept = []
    for _ in splits:
        r = await pool.request("POST", "/", body=b"x", timeout=10, stream_min=1 << 20)
        assert isinstance(r.body, BodyStream) and r.body.length == len(RANDOM)
        chunks = [chunk async for chunk in r.body]
        assert b"".join(chunks) == RANDOM
        assert any(isinstance(c, memoryview) for c in chunks)  # read raw, not through the parser
        kept.append(chunks)
    assert all(b"".join(chunks) == RANDOM for chunks in kept)
    assert (await pool.request("GET", "/", timeout=2, stream_min=1 << 20)).body == b"ok"
    assert connections == 1 and pool.busy == 0
    pool.close()
    server.close()


async def test_a_large_answer_written_at_once_passes_the_parser_only_in_its_head_read():
    """While an answer's head is awaited a read takes at most HEAD_READ bytes (rawbody.py): of a
    large answer that is all in the socket when the client reads, only that first read goes
    through the parser (which hands its body bytes over as new bytes objects: a copy); the rest
    is read raw (views of the connection's own buffers). Before, that first read took up to
    256 KiB — half of the gateway's instructions on a 1 MiB pass-through. A small
    answer after it is read whole as ever."""
    from gateway.rawbody import HEAD_READ, READ_SIZE

    assert HEAD_READ < READ_SIZE // 4

    async def handler(reader, writer):
        for _ in range(3):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM)
            await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    for _ in range(3):
        r = await pool.request("POST", "/", body=b"x", timeout=10, stream_min=1 << 20)
        assert isinstance(r.body, BodyStream)
        chunks = [chunk async for chunk in r.body]
        assert b"".join(chunks) == RANDOM
        parsed = sum(len(c) for c in chunks if not isinstance(c, memoryview))
        assert parsed <= HEAD_READ, f"{parsed} body bytes went through the parser"
    assert (await pool.request("GET", "/", timeout=2, stream_min=1 << 20)).body == b"ok"
    assert pool.busy == 0
    pool.close()
    server.close()


async def test_raw_body_then_connection_close_or_extra_bytes_retires_the_connection():
    """An answer saying Connection: close, or followed by bytes nobody asked for, is delivered
    whole; its connection is not used again."""
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        await read_request(reader)
        if connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM
                         + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    for expected_connections in (1, 2):
        r = await pool.request("POST", "/", body=b"x", timeout=10, stream_min=1 << 20)
        assert await collect(r.body) == RANDOM
        assert connections == expected_connections
        assert pool.busy == 0
    await wait_until(lambda: not pool._idle or pool._idle[0].closed, "the connection to be retired")
    assert all(c.closed for c in pool._idle) or not pool._idle
    pool.close()
    server.close()


async def test_a_whole_answer_is_read_into_its_bytes_past_the_parser_and_the_connection_kept_right():
    """A whole (not streamed) answer's body past the head read goes from the socket straight into
    the answer's bytes (reader.py ``_RAW_WHOLE``): every byte as sent, the connection reused after
    it, retired after one saying Connection: close or followed by bytes nobody asked for."""
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM,
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM,
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM,
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(RANDOM) + RANDOM
        + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ]
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        try:
            while answers:
                await read_request(reader)
                answer = answers.pop(0)
                for at in range(0, len(answer), 100_003):  # (pieces that are no frame of anything)
                    writer.write(answer[at:at + 100_003])
                    await writer.drain()
                if b"close" in answer[:80] or answer.endswith(b"0\r\n\r\n"):
                    break
            await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    try:
        for expected_connections in (1, 1, 1, 2):
            r = await pool.request("POST", "/", body=b"x", timeout=10)
            assert type(r.body) is bytes and r.body == RANDOM
            assert connections == expected_connections
            assert pool.busy == 0
        await wait_until(lambda: not pool._idle or pool._idle[0].closed, "the connection to be retired")
    finally:
        pool.close()
        server.close()


async def test_chunked_answer_that_may_stream_goes_through_the_parser():
    body = RANDOM[: 1 << 20]

    async def handler(reader, writer):
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(body), 300_000):
                part = body[i:i + 300_000]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server, port = await serve(handler)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2, max_connections=1)
    for _ in range(2):
        r = await pool.request("POST", "/", body=b"x", timeout=10, stream_min=1 << 16)
        assert r.body == body  # no length known: not streamed, read whole
    assert pool.busy == 0 and len(pool._idle) == 1
    pool.close()
    server.close()
