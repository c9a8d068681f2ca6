"""codec/grpcframe.py: gRPC's length-prefixed messages, grpc-timeout and grpc-message (gRPC's
doc/PROTOCOL-HTTP2.md), as the gateway's own gRPC listener reads and writes them."""
from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.codec.grpcframe import FrameError, MessageReader, decode_message, encode_message, frame, parse_timeout


def framed(m: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(m).to_bytes(4, "big") + m


@given(st.lists(st.binary(max_size=300), max_size=6), st.data())
def test_messages_survive_any_split(messages: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(framed(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = MessageReader(1000)
    got: list[bytes] = []
    last = 0
    for c in [*cuts, len(stream)]:
        got += reader.feed(stream[last:c])
        last = c
    assert got == messages
    assert reader.pending == 0


def test_a_partial_message_is_pending() -> None:
    reader = MessageReader(100)
    assert reader.feed(framed(b"abcdef")[:7]) == []
    assert reader.pending == 7
    assert reader.feed(b"cdef") == [b"abcdef"]
    assert reader.pending == 0


def test_the_limit_is_checked_on_the_prefix_before_anything_is_kept() -> None:
    reader = MessageReader(10)
    with pytest.raises(FrameError) as err:
        reader.feed(b"\x00" + (1 << 31).to_bytes(4, "big"))
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert err.value.message == f"Received message larger than max ({1 << 31} vs. 10)"
    # split inside the prefix: the same
    reader = MessageReader(10)
    assert reader.feed(b"\x00\x00") == []
    with pytest.raises(FrameError):
        reader.feed(b"\x00\x00\x0b")


@pytest.mark.parametrize("encoding,pack", [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_compressed_messages_are_read(encoding: bytes, pack) -> None:
    reader = MessageReader(1000, encoding)
    assert reader.feed(framed(pack(b"x" * 500), 1) + framed(b"plain")) == [b"x" * 500, b"plain"]


def test_compression_is_bounded_by_the_limit() -> None:
    bomb = zlib.compress(b"\x00" * 10_000_000)
    with pytest.raises(FrameError) as err:
        MessageReader(1 << 20, b"deflate").feed(framed(bomb, 1))
    assert err.value.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("encoding,code", [(b"", "INTERNAL"), (b"identity", "INTERNAL"), (b"snappy", "UNIMPLEMENTED")])
def test_a_compressed_flag_without_a_readable_encoding_is_refused_by_name(encoding: bytes, code: str) -> None:
    with pytest.raises(FrameError) as err:
        MessageReader(100, encoding).feed(framed(b"abc", 1))
    assert err.value.code == code
    assert (encoding.decode() or "no encoding") in err.value.message


def test_undefined_flags_and_broken_streams_are_refused() -> None:
    with pytest.raises(FrameError):
        MessageReader(100).feed(framed(b"abc", 2))
    with pytest.raises(FrameError):
        MessageReader(100, b"gzip").feed(framed(b"not gzip", 1))
    with pytest.raises(FrameError):
        MessageReader(100, b"gzip").feed(framed(gzip.compress(b"abc")[:-3], 1))


@pytest.mark.parametrize("value,seconds", [(b"1S", 1.0), (b"100m", 0.1), (b"99999999n", 0.099999999),
                                           (b"2H", 7200.0), (b"3M", 180.0), (b"5u", 5e-6)])
def test_grpc_timeout(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"123456789S", b"1s", b"-1S", b"1.5S", b" 1S", b"1 S"])
def test_grpc_timeout_not_in_the_spec_form(value: bytes) -> None:
    assert parse_timeout(value) is None


@given(st.text(max_size=200))
def test_grpc_message_round_trips_and_stays_printable_ascii(text: str) -> None:
    encoded = encode_message(text)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert decode_message(encoded) == text.encode("utf-8", "replace").decode("utf-8", "replace")


def test_grpc_message_spelling() -> None:
    assert encode_message("a 100% é") == b"a 100%25 %C3%A9"
    assert frame(5) == b"\x00\x00\x00\x00\x05"
