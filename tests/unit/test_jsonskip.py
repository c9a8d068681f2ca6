"""gateway/codec/_jsonskip.c: the data skip of codec/jsonscan.py, against a plain reading in
Python — any bytes, any bounds, any buffer kind, on both sides of its 16-byte steps."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_jsonskip = pytest.importorskip("gateway.codec._jsonskip", reason="built without a C compiler")


def reference(buf: bytes, start: int, end: int, in_string: bool) -> int:
    stops = b'"\\' if in_string else b'"[]{}'
    end = min(end, len(buf))
    for i in range(start, end):
        if buf[i] in stops:
            return i
    return max(end, start)


# Bytes that matter, their neighbours in the ASCII table (0x20 apart, or one off), and others.
alphabet = st.sampled_from(list(b'"\\[]{}' + b"{};=?_\x7b\x7d\x5b\x5d\x3b\x3d\x7f\xdb\xdd\xfb\xfd\x00 0a,.e-"))


@settings(max_examples=800)
@given(st.lists(alphabet, max_size=300).map(bytes), st.integers(0, 310), st.integers(0, 320), st.booleans(),
       st.sampled_from(["bytes", "bytearray", "view", "numpy"]))
def test_agrees_with_a_plain_reading(data, start, end, in_string, kind):
    buf = {"bytes": lambda: data, "bytearray": lambda: bytearray(data),
           "view": lambda: memoryview(b"xx" + data)[2:],
           "numpy": lambda: np.frombuffer(data, dtype=np.uint8).data.cast("B") if data else data}[kind]()
    if start > len(data):
        start = len(data)
    assert _jsonskip.special(buf, start, end, in_string) == reference(data, start, end, in_string)


def test_every_byte_value_at_every_lane():
    """Every byte at every position of a 64-byte step (both 32-byte halves), of a 16-byte one,
    and of the tail the plain loop takes."""
    for lane in range(140):
        for value in range(256):
            data = b"1" * lane + bytes([value]) + b"2" * 40
            for in_string in (False, True):
                want = lane if value in (b'"\\' if in_string else b'"[]{}') else len(data)
                assert _jsonskip.special(data, 0, len(data), in_string) == want, (lane, value, in_string)


def test_refuses_what_is_not_a_buffer_and_a_negative_start():
    with pytest.raises(TypeError):
        _jsonskip.special("text", 0, 4, False)
    with pytest.raises(ValueError):
        _jsonskip.special(b"abc", -1, 3, False)
