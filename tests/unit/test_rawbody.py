"""gateway/rawbody.py: the buffers a large body is read into past the parser."""
from __future__ import annotations

from typing import Any

from gateway.rawbody import LARGE, RAW_MIN, READ_SIZE, RawBody


def _read(raw: RawBody, data: bytes) -> memoryview:
    """What the event loop does: fill (part of) the buffer, then say how much."""
    buf = raw.buffer()
    assert len(data) <= len(buf)
    buf[: len(data)] = data
    return raw.take(len(data))


def test_buffer_never_reaches_past_the_body():
    raw = RawBody(1000)
    assert len(raw.buffer()) == 1000  # a request pipelined behind the body stays in the socket
    _read(raw, b"x" * 400)
    assert raw.left == 600 and len(raw.buffer()) == 600


def test_chunks_are_never_written_over():
    total = 3 * READ_SIZE + 12345
    raw = RawBody(total)
    chunks, expected, i = [], [], 0
    while raw.left:
        size = min(len(raw.buffer()), 50_000 + i * 7919 % 40_000)
        data = bytes((i * 31 + k) % 251 for k in range(size))  # different in every read
        chunks.append(_read(raw, data))
        expected.append(data)
        i += 1
    assert [bytes(c) for c in chunks] == expected
    assert sum(len(c) for c in chunks) == total


def test_a_new_buffer_when_little_is_free():
    raw = RawBody(7 * READ_SIZE)
    first = raw.buffer()
    assert len(first) == READ_SIZE
    _read(raw, bytes(READ_SIZE - RAW_MIN + 1))  # less than RAW_MIN left free
    second = raw.buffer()
    assert len(second) == READ_SIZE  # a fresh one, not the small rest
    assert second.obj is not first.obj


def test_a_body_read_whole_fills_the_buffer_it_was_given():
    """``into``: a body read whole (h1sizes.py WHOLE_MAX) goes into one buffer of its size,
    every read right after the last, never into a buffer of RawBody's own — even when less
    than RAW_MIN of it is left."""
    from gateway.rawbody import new_buffer

    whole = new_buffer(3 * RAW_MIN + 10)
    whole[:10] = b"0123456789"  # (what came through the parser with the head)
    raw = RawBody(len(whole) - 10, into=whole[10:])
    expected = bytearray(b"0123456789")
    i = 0
    while raw.left:
        buf = raw.buffer()
        assert buf.obj is whole.obj
        size = min(len(buf), RAW_MIN - 1 + i)  # the last reads leave less than RAW_MIN free
        data = bytes((i + k) % 251 for k in range(size))
        _read(raw, data)
        expected += data
        i += 1
    assert bytes(whole) == bytes(expected)


def test_a_large_body_is_read_in_larger_buffers():
    assert len(RawBody(LARGE - 1).buffer()) == READ_SIZE
    assert len(RawBody(LARGE).buffer()) == 2 * READ_SIZE


def test_the_socket_wakes_for_large_reads_then_for_every_byte_again():
    """SO_RCVLOWAT on a real socket: LOWAT while much of the body is to come, what is left near
    its end (else the last bytes would never wake the loop), 1 once it is over (the next request
    head is small); arrived() sees bytes waiting below the mark."""
    import socket

    from gateway.rawbody import LOWAT

    server = socket.create_server(("127.0.0.1", 0))
    b = socket.create_connection(server.getsockname())
    a, _ = server.accept()
    server.close()
    a.settimeout(10)
    try:
        def lowat() -> int:
            return a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)

        raw = RawBody(LOWAT + 1000, a.fileno())
        assert lowat() == LOWAT
        assert not raw.arrived()
        b.sendall(b"x" * 500)
        assert raw.arrived() and not raw.arrived()  # grew once; unchanged since
        b.sendall(b"y" * 10)
        assert raw.arrived()
        b.sendall(b"w" * (LOWAT - 510))
        got = b""
        while len(got) < LOWAT:  # (a blocking read waits for the mark: LOWAT bytes are there)
            got += a.recv(LOWAT - len(got))
        _read(raw, got)
        assert raw.left == 1000 and lowat() == 1000  # under the mark: the rest wakes the loop when it is all here
        _read(raw, b"z" * raw.left)
        raw.done()
        assert lowat() == 1
        small = RawBody(300, a.fileno())
        assert lowat() == 300
        small.done()
        assert lowat() == 1
        large = RawBody(LARGE, a.fileno())  # a large body: twice the mark
        assert lowat() == 2 * LOWAT
        large.done()
        assert lowat() == 1
        assert RawBody(10).arrived() is False  # no socket: nothing to ask
    finally:
        a.close()
        b.close()


def test_no_low_water_mark_under_tls():
    """Under TLS the mark would count ciphertext while the TLS layer may already hold the body's
    last bytes: the read would never come (tests/integration/test_tls.py hung 2 times in 6)."""
    from gateway.rawbody import plain_socket

    class Transport:
        def __init__(self, **extra):
            self.extra = extra

        def get_extra_info(self, name, default=None):
            return self.extra.get(name, default)

    class Sock:
        def fileno(self) -> int:
            return 42

    assert plain_socket(Transport(socket=Sock())) == 42
    assert plain_socket(Transport(socket=Sock(), ssl_object=object())) == -1
    assert plain_socket(Transport()) == -1
    assert plain_socket(None) == -1


def test_the_listener_reads_heads_in_small_reads_and_bodies_in_large_ones():
    """frontend/h1conn.py.s connection: HEAD_READ while a request head is awaited (body bytes
    read with a head go through the parser, a copy), READ_SIZE while a body is under way, the
    body's own buffer once it is read raw."""
    import asyncio

    from gateway.config.security import Limits
    from gateway.frontend.h1conn import Connection
    from gateway.frontend.h1listen import HttpListener
    from gateway.rawbody import HEAD_READ

    async def app(scope, receive, send):  # pragma: no cover - never called
        raise AssertionError

    loop = asyncio.new_event_loop()
    try:
        conn = Connection(HttpListener(app, limits=Limits()), loop)
        assert len(conn.get_buffer(-1)) == HEAD_READ < READ_SIZE
        conn._body_at = 1.0
        assert len(conn.get_buffer(-1)) == READ_SIZE
        conn.raw = RawBody(1000)
        assert len(conn.get_buffer(-1)) == 1000
    finally:
        loop.close()


def _pair():
    import socket

    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def _mark(sock) -> int:
    import socket

    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


def test_a_closed_connection_leaves_its_old_descriptor_alone():
    """After ``closed()`` the number may belong to another socket: nothing is set on it."""
    import socket

    from gateway.rawbody import LOWAT

    a, b = _pair()
    with a, b:
        raw = RawBody(LOWAT + 1000, a.fileno())
        a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 7)  # (now someone else's)
        raw.closed()
        raw.done()
        assert _mark(a) == 7


def test_a_descriptor_that_is_no_socket_turns_the_mark_off():
    import os

    r, w = os.pipe()
    try:
        raw = RawBody(1 << 20, r)  # setsockopt fails (ENOTSOCK): read on without a mark
        assert not raw.arrived()
        assert len(_read(raw, b"abc")) == 3
    finally:
        os.close(r)
        os.close(w)


def test_rawio_against_the_python_steps():
    """gateway/_rawio.c does what the Python fallback does (socket.setsockopt, ioctl FIONREAD,
    a writable buffer of the size asked)."""
    import pytest

    from gateway import rawbody

    rawio = pytest.importorskip("gateway._rawio", reason="built without a C compiler")
    view = rawio.buffer(4096)
    assert len(view) == 4096 and not view.readonly and view.format == "B"
    view[:3] = b"abc"
    assert bytes(view[:3]) == b"abc"
    with pytest.raises(ValueError):
        rawio.buffer(0)
    a, b = _pair()
    with a, b:
        rawio.lowat(a.fileno(), 12345)
        assert _mark(a) == 12345
        b.sendall(b"z" * 77)
        assert rawio.unread(a.fileno()) == 77 == rawbody._unread_bytes(a.fileno())
    import os

    r, w = os.pipe()
    try:
        with pytest.raises(OSError):
            rawio.lowat(r, 1)  # not a socket
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(ValueError):
        rawio.lowat(-1, 1)


def _pool() -> tuple[Any, tuple[int, int, int]]:
    """_rawio and a function giving its pool's stats less what earlier tests left in use."""
    import gc

    import pytest

    rawio = pytest.importorskip("gateway._rawio", reason="built without a C compiler")
    gc.collect()
    rawio.release()
    return rawio, rawio.pool_stats()


def test_large_buffers_are_reused_only_once_every_view_is_gone():
    """_rawio's pool: a large buffer comes back for a later one of about its size only when no
    view of it is left — while one is, a new buffer is made and the old bytes stay as they were."""
    rawio, (b0, _, h0) = _pool()

    def stats() -> tuple[int, int, int]:
        b, idle, h = rawio.pool_stats()
        return b - b0, idle, h - h0

    n = 1 << 20
    first = rawio.buffer(n)
    first[:4] = b"keep"
    part = first[:4]  # a slice keeps the buffer as the view does
    del first
    second = rawio.buffer(n)
    second[:4] = b"next"
    assert bytes(part) == b"keep" and len(second) == n
    assert stats() == (2, 0, 2 * n)
    del part
    assert stats()[1] == 1
    third = rawio.buffer(n - 100)  # the freed one, cut to the size asked
    assert len(third) == n - 100 and stats()[:2] == (2, 0)
    small = rawio.buffer(4096)  # below 64 KiB: never pooled
    assert stats()[0] == 2 and len(small) == 4096
    del second
    huge = rawio.buffer(n // 4)  # a free one over twice the size: not handed out
    assert stats()[:2] == (3, 1)
    del third, huge
    assert rawio.release() == 2 * n + n // 4 and stats() == (0, 0, 0)


def test_the_pool_stays_within_its_limit():
    """Past pool_limit a buffer is made outside the pool (and goes back to the heap when freed);
    free pooled buffers are let go to make room first."""
    import pytest

    rawio, (b0, _, h0) = _pool()

    def stats() -> tuple[int, int, int]:
        b, idle, h = rawio.pool_stats()
        return b - b0, idle, h - h0

    mib = 1 << 20
    bigger = None
    try:
        rawio.pool_limit(h0 + 3 * mib)
        held = [rawio.buffer(mib) for _ in range(5)]
        assert stats() == (3, 0, 3 * mib)
        del held
        assert stats() == (3, 3, 3 * mib)
        bigger = rawio.buffer(2 * mib)  # none fits: two free ones go for room
        assert stats() == (2, 1, 3 * mib) and len(bigger) == 2 * mib
        rawio.pool_limit(h0 + mib)  # lowered: free ones go at once
        assert stats() == (1, 0, 2 * mib)
        with pytest.raises(ValueError):
            rawio.pool_limit(-1)
    finally:
        rawio.pool_limit(128 * mib)
        del bigger
        rawio.release()
