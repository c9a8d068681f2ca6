"""gateway/_fill.c and the HTTP/1.1 client's whole answers written into it (backends/h1/framing.py):
every byte as the backend sent it, however it was cut, the answer held once, and a Content-Length
that lies costing only what was sent."""
from __future__ import annotations

import asyncio
import random
import tracemalloc

import pytest

from gateway.backends.h1 import ConnectionDropped, H1ConnectionPool

_fill = pytest.importorskip("gateway._fill", reason="built without a C compiler")

MIB = 1 << 20


def test_reserve_and_put():
    whole = _fill.reserve(10)
    assert type(whole) is bytes and len(whole) == 10
    assert _fill.put(whole, 0, b"abc") == 3
    assert _fill.put(whole, 3, memoryview(b"defg")) == 7
    assert _fill.put(whole, 7, bytearray(b"hij")) == 10
    assert _fill.put(whole, 10, b"") == 10
    assert whole == b"abcdefghij"


@pytest.mark.parametrize("at, data", [(8, b"abc"), (11, b""), (-1, b"a"), (0, b"x" * 11)])
def test_put_never_writes_past_the_reserved_bytes(at, data):
    whole = _fill.reserve(10)
    _fill.put(whole, 0, b"0123456789")
    with pytest.raises(ValueError):
        _fill.put(whole, at, data)
    assert whole == b"0123456789"


def test_put_takes_only_a_reserved_bytes_object():
    with pytest.raises(TypeError):
        _fill.put(bytearray(10), 0, b"a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _fill.put(_fill.reserve(10), 0, "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _fill.reserve(1)  # (CPython shares the empty and one-byte objects)


async def _answer_server(body: bytes, pieces: list[int]):
    """A server answering every request with ``body``, written in pieces of the given sizes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert b"content-length" not in head.lower()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                at = 0
                for n in pieces:
                    writer.write(body[at:at + n])
                    at += n
                    await writer.drain()
                writer.write(body[at:])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("size", [64 * 1024 + 1, MIB + 7, 5 * MIB])
async def test_whole_answers_are_every_byte_as_sent(size):
    rng = random.Random(size)
    body = rng.randbytes(size)
    pieces = [rng.randint(1, 300_000) for _ in range(12)]
    server, port = await _answer_server(body, pieces)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    try:
        for _ in range(2):  # (and again on the kept-alive connection)
            r = await pool.request("GET", "/x", timeout=10)
            assert type(r.body) is bytes and r.body == body
    finally:
        pool.close()
        server.close()


async def test_a_whole_answer_is_held_once():
    """8 MiB in pieces: the answer's own bytes object is filled as they arrive — not the pieces
    and then their join (twice the answer), nor a buffer grown and copied."""
    body = random.Random(8).randbytes(8 * MIB)
    server, port = await _answer_server(body, [256 * 1024] * 31)
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=2)
    try:
        await pool.request("GET", "/warm", timeout=10)
        tracemalloc.start()
        try:
            r = await pool.request("GET", "/x", timeout=10)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert r.body == body
        # (The server is in this process: its writes count too. Joined, the client alone held 16 MiB.)
        assert peak < 12 * MIB, peak
    finally:
        pool.close()
        server.close()


def _status(field: str) -> int | None:
    """A kB figure of /proc/self/status in bytes (None where there is no /proc)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """VmHWM back to the current RSS (False where the kernel refuses)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


async def test_a_lying_content_length_costs_what_was_sent():
    """A backend announcing 96 MiB and sending 1 KiB before it closes: the client's peak memory
    is what came (the reserved bytes object's pages are taken as they are written), and the
    exchange fails as a dropped connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (96 * MIB) + bytes(1024))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    pool = H1ConnectionPool("127.0.0.1", server.sockets[0].getsockname()[1], connect_timeout=2)
    try:
        measured = _reset_peak()
        base = _status("VmRSS")
        with pytest.raises(ConnectionDropped):
            await asyncio.wait_for(pool.request("GET", "/x", timeout=10), 10)
        peak = _status("VmHWM")
        if measured and base is not None and peak is not None:
            assert peak - base < 32 * MIB, (base, peak)
    finally:
        pool.close()
        server.close()
