"""A serialized ModelInferRequest read as it passes: where its head ends, and the checks on what
follows it, so a large request can be routed from its head and streamed on. No I/O.

Every protobuf serializer writes fields in field-number order (protobuf's encoding guide:
"serializers write fields in field-number order", unknown fields last), so ModelInferRequest's
routing fields — model_name (1), model_version (2), id (3), parameters (4), inputs (5) and
outputs (6) — come before raw_input_contents (7), which carries nearly all of a large request.
The *head* is the fields before the first raw_input_contents; the gateway routes and checks the
limits on it (codec/grpcscan.py, as for a whole message). A parser takes the last value of a
repeated scalar field and merges repeated messages, so the same fields after the head could
route the backend elsewhere than the gateway decided: :class:`TailWalker` refuses any field
numbered 1–7 other than raw_input_contents after the head, and a field that runs past the
message or ends inside it. Fields numbered 8 and up (unknown to the V2 message) pass as a
parser would keep them.
"""
from __future__ import annotations

from typing import Final

__all__ = ["RAW_INPUTS", "TailWalker", "head_end"]

RAW_INPUTS: Final = 7  # ModelInferRequest.raw_input_contents
_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2
_I32: Final = 5
_HEADER_MAX: Final = 16  # a tag (≤ 5 bytes) and a length or varint value (≤ 10)
_INCOMPLETE: Final = -2
_MALFORMED: Final = -1


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``: next position _INCOMPLETE when ``end``
    comes first, _MALFORMED past 10 bytes."""
    result = 0
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            return 0, _MALFORMED
    return 0, _INCOMPLETE


def _header(buf: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, where its value's remaining bytes begin, how many there are)
    of the field at ``pos``; field number _INCOMPLETE when buf[pos:end] ends inside the tag or
    the length, _MALFORMED for a tag or wire type protobuf refuses. A varint value is read here
    (0 bytes remain of it)."""
    key, at = _varint(buf, pos, end)
    if at < 0:
        return at, 0, 0, 0
    if key < 8 or at - pos > 5 or key >> 3 >= 1 << 29:
        return _MALFORMED, 0, 0, 0
    fnum = key >> 3
    wtype = key & 7
    if wtype == _LEN or wtype == _VARINT:
        value, stop = _varint(buf, at, end)
        if stop < 0:
            return stop, 0, 0, 0
        return fnum, wtype, stop, value if wtype == _LEN else 0
    if wtype == _I64:
        return fnum, wtype, at, 8
    if wtype == _I32:
        return fnum, wtype, at, 4
    return _MALFORMED, 0, 0, 0  # groups (3, 4) and the undefined 6, 7


def head_end(buf: bytes, start: int, end: int) -> int:
    """The offset in ``buf`` of the first raw_input_contents field of the message that begins at
    ``start`` (``buf[start:end]`` is what has arrived of it), when every field before it is whole
    there and well formed; -1 otherwise (no head can be told apart: the message is read whole)."""
    pos = start
    while pos < end:
        fnum, wtype, at, n = _header(buf, pos, end)
        if fnum < 0:
            return -1
        if fnum == RAW_INPUTS:
            return pos if wtype == _LEN else -1
        pos = at + n
    return -1


class TailWalker:
    """Checks the bytes of a message after its head as they pass: ``feed(data)`` returns None
    while they are as a ModelInferRequest's tail must be, else what is wrong. ``size`` is how
    many bytes of the message follow the head."""

    __slots__ = ("left", "pending", "skip")

    def __init__(self, size: int) -> None:
        self.left = size  # bytes of the message not fed yet
        self.skip = 0  # bytes of the current field's value still to pass
        self.pending = b""  # the start of a field header cut by a piece's end

    @property
    def complete(self) -> bool:
        return self.left == 0 and not self.skip and not self.pending

    def feed(self, data: bytes) -> str | None:
        n = len(data)
        if n > self.left:
            return "the request message carries more bytes than its length prefix says"
        self.left -= n
        pos = min(self.skip, n)
        self.skip -= pos
        while pos < n:
            piece = data[pos:pos + _HEADER_MAX]
            buf = self.pending + piece if self.pending else piece
            fnum, wtype, at, size = _header(buf, 0, len(buf))
            if fnum == _INCOMPLETE:
                if pos + len(piece) < n or not self.left:
                    return "a field of the request message is cut short"
                self.pending = buf
                return None
            if fnum == _MALFORMED:
                return "the request message is not a ModelInferRequest (a malformed field after raw_input_contents)"
            if fnum < RAW_INPUTS or (fnum == RAW_INPUTS and wtype != _LEN):
                return (f"field {fnum} of ModelInferRequest follows raw_input_contents: the gateway streams a large "
                        "request on from its head, so its fields must come in field-number order (as every "
                        "protobuf serializer writes them)")
            pos += at - len(self.pending)
            self.pending = b""
            if size > n - pos + self.left:
                return "a field of the request message runs past its end"
            k = min(size, n - pos)
            pos += k
            self.skip = size - k
        if not self.left and (self.skip or self.pending):
            return "a field of the request message is cut short"
        return None
