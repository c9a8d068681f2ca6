"""gateway/rawbody.py: the buffers a large body is read into past the parser."""
from __future__ import annotations

from gateway.rawbody import RAW_MIN, READ_SIZE, RawBody


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
    raw = RawBody(10 * READ_SIZE)
    first = raw.buffer()
    assert len(first) == READ_SIZE
    _read(raw, bytes(READ_SIZE - RAW_MIN + 1))  # less than RAW_MIN left free
    second = raw.buffer()
    assert len(second) == READ_SIZE  # a fresh one, not the small rest
    assert second.obj is not first.obj
