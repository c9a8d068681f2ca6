"""Minimal protobuf wire-format scanning (no I/O, no protobuf runtime).

The gateway routes a gRPC ModelInfer request by ``model_name`` (field 1) and
``model_version`` (field 2) of ``inference.ModelInferRequest`` without parsing
the rest (DESIGN.md "The hot path"). Protobuf encodes fields in any order, so
the scan walks the top-level fields and skips the others by their wire type;
a 64 MB message is walked in microseconds because tensors are length-delimited
and skipped in one step.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..errors import InvalidRequest

__all__ = [
    "encode_len_field",
    "encode_varint",
    "iter_fields",
    "read_varint",
    "scan_infer_routing",
    "scan_name_version",
]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def read_varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """Decode a base-128 varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise InvalidRequest("malformed protobuf message: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise InvalidRequest("malformed protobuf message: varint too long")


def iter_fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield (field number, wire type, value) for each top-level field.

    Length-delimited values are memoryview slices of ``buf`` (no copy);
    varints are ints; fixed-width values are memoryview slices.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        fnum, wtype = key >> 3, key & 7
        if fnum == 0:
            raise InvalidRequest("malformed protobuf message: field number 0")
        if wtype == _VARINT:
            value, pos = read_varint(buf, pos)
            yield fnum, wtype, value
        elif wtype == _LEN:
            length, pos = read_varint(buf, pos)
            if pos + length > end:
                raise InvalidRequest("malformed protobuf message: field overruns the message")
            yield fnum, wtype, buf[pos : pos + length]
            pos += length
        elif wtype == _I64:
            if pos + 8 > end:
                raise InvalidRequest("malformed protobuf message: truncated fixed64")
            yield fnum, wtype, buf[pos : pos + 8]
            pos += 8
        elif wtype == _I32:
            if pos + 4 > end:
                raise InvalidRequest("malformed protobuf message: truncated fixed32")
            yield fnum, wtype, buf[pos : pos + 4]
            pos += 4
        else:
            raise InvalidRequest(f"malformed protobuf message: wire type {wtype}")


def scan_name_version(buf: bytes | memoryview) -> tuple[str, str]:
    """Return fields 1 and 2 (both ``string``) of a message; "" when absent.

    Used on ModelInferRequest (model_name, model_version) and on
    ModelReadyRequest / ModelMetadataRequest (name, version). Per protobuf
    semantics the last occurrence of a field wins, so the whole message is walked.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    name = version = b""
    for fnum, wtype, value in iter_fields(view):
        if wtype == _LEN and fnum in (1, 2):
            if fnum == 1:
                name = bytes(value)
            else:
                version = bytes(value)
    try:
        return name.decode("utf-8"), version.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest("model name or version is not valid UTF-8") from exc


def _sequence_of_entry(entry: memoryview) -> tuple[bool, str | None]:
    """(whether its key is ``sequence_id``, the value) of a ``parameters`` map entry (key 1,
    InferParameter 2): int64 (2), string (3) or uint64 (5) as Triton's sequence batcher takes
    it; None for 0, "" or another kind. Protobuf's rules: a value given twice in an entry is
    merged, and of InferParameter's oneof the last field set wins."""
    key = b""
    params: list[memoryview] = []
    for fnum, wtype, value in iter_fields(entry):
        if wtype == _LEN and fnum == 1:
            key = bytes(value)
        elif wtype == _LEN and fnum == 2:
            params.append(value)  # type: ignore[arg-type]
    if key != b"sequence_id":
        return False, None
    found: str | None = None
    for param in params:
        for fnum, wtype, value in iter_fields(param):
            if wtype == _VARINT and fnum in (2, 5):
                # A varint is read as 64 bits: protobuf drops what a 10th byte carries past bit 63.
                number = int(value) & 0xFFFF_FFFF_FFFF_FFFF
                if fnum == 2 and number >= 1 << 63:  # int64 is two's complement on the wire
                    number -= 1 << 64
                found = str(number) if number else None
            elif wtype == _LEN and fnum == 3:
                found = bytes(value).decode("utf-8", "replace") or None
            elif (fnum, wtype) in ((1, _VARINT), (4, _I64)):  # bool_param, double_param
                found = None
    return True, found


def scan_infer_routing(buf: bytes | memoryview) -> tuple[str, str, str | None]:
    """(model_name, model_version, sequence_id) of a serialized ModelInferRequest, in one walk.

    ``sequence_id`` (request parameter, field 4 map entries) is None when absent or 0
    (Triton: 0 means "not part of a sequence"); it pins a sequence to one endpoint.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    name = version = b""
    sequence: str | None = None
    for fnum, wtype, value in iter_fields(view):
        if wtype != _LEN:
            continue
        if fnum == 1:
            name = bytes(value)
        elif fnum == 2:
            version = bytes(value)
        elif fnum == 4:
            is_sequence, found = _sequence_of_entry(value)  # type: ignore[arg-type]
            if is_sequence:  # a map's last entry for a key wins
                sequence = found
    try:
        return name.decode("utf-8"), version.decode("utf-8"), sequence
    except UnicodeDecodeError as exc:
        raise InvalidRequest("model name or version is not valid UTF-8") from exc


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_len_field(fnum: int, length: int) -> bytes:
    """The key and length prefix of a length-delimited field; the payload follows it."""
    return encode_varint((fnum << 3) | _LEN) + encode_varint(length)


def settings_change(buf: bytes | memoryview) -> bool:
    """Whether a TraceSettingRequest / LogSettingsRequest sets anything: its ``settings``
    map (field 1) has an entry. Without one it reads the settings, as an HTTP GET does."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    return any(fnum == 1 for fnum, _, _ in iter_fields(view))
