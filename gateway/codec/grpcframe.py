"""gRPC's framing on HTTP/2, as the gateway's own gRPC listener reads and writes it: the
length-prefixed message, ``grpc-timeout``, ``grpc-message``'s percent-encoding and the
``grpc-encoding`` of a compressed message. Pure: no I/O.

The reference is gRPC's "gRPC over HTTP2" (doc/PROTOCOL-HTTP2.md in grpc/grpc): a message is
``Compressed-Flag`` (1 byte) + ``Message-Length`` (4 bytes, big-endian) + the message; a
request's ``grpc-timeout`` is at most 8 digits and a unit (H, M, S, m, u, n); ``grpc-message``
is the status message, UTF-8 and then percent-encoded outside 0x20–0x7E (and ``%``).
"""
from __future__ import annotations

import zlib
from typing import ClassVar
from urllib.parse import unquote_to_bytes

__all__ = ["ACCEPT_ENCODING", "FrameError", "MessageReader", "decode_message", "encode_message", "frame",
           "parse_timeout"]

# What the listener reads when a client compresses (and says so in grpc-accept-encoding).
ACCEPT_ENCODING = b"identity,deflate,gzip"

_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


class FrameError(Exception):
    """A message that cannot be read. ``kind``: "too_large" (``size``: its declared length, -1 when
    it grew past the limit decompressed), "encoding" or "framing"; ``code``: the gRPC status a
    server ends the call with; ``message``: what is wrong, in words for the sender."""

    TOO_LARGE: ClassVar[str] = "too_large"
    ENCODING: ClassVar[str] = "encoding"
    FRAMING: ClassVar[str] = "framing"

    def __init__(self, kind: str, code: str, message: str, size: int = -1) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.message = message
        self.size = size


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` in seconds; None when it is not the spec's form (TimeoutValue: 1–8
    ASCII digits, then one unit)."""
    if not 2 <= len(value) <= 9:
        return None
    digits = value[:-1]
    unit = _UNITS.get(value[-1])
    if unit is None or not digits.isdigit():
        return None
    return int(digits) * unit


_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}


def encode_message(message: str) -> bytes:
    """``grpc-message``: the UTF-8 bytes, each outside 0x20–0x7E (and ``%``) as ``%XX``."""
    raw = message.encode("utf-8", "replace")
    if all(b in _SAFE for b in raw):
        return raw
    return b"".join(bytes((b,)) if b in _SAFE else b"%%%02X" % b for b in raw)


def decode_message(value: bytes) -> str:
    """``grpc-message`` read back: percent-decoded, then UTF-8 (what cannot be read is kept as
    the replacement character rather than refused: it is only a message)."""
    return unquote_to_bytes(value).decode("utf-8", "replace") if b"%" in value else value.decode("utf-8", "replace")


def frame(message_length: int) -> bytes:
    """The 5-byte prefix of an uncompressed message of ``message_length`` bytes."""
    return b"\x00" + message_length.to_bytes(4, "big")


def _decompress(encoding: bytes, data: bytes, limit: int) -> bytes:
    if encoding == b"gzip":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == b"deflate":
        d = zlib.decompressobj()
    else:
        name = encoding.decode("latin-1") or "identity"
        raise FrameError(FrameError.ENCODING, "INTERNAL" if name == "identity" else "UNIMPLEMENTED",
                         "a compressed message with no encoding: no grpc-encoding, or 'identity' (the "
                         "compressed flag needs one)"
                         if name == "identity" else f"grpc-encoding '{name}' is not supported "
                         f"(supported: {ACCEPT_ENCODING.decode()})")
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise FrameError(FrameError.ENCODING, "INTERNAL",
                         f"a {encoding.decode()} message that does not decompress ({exc})") from exc
    if len(out) > limit:
        raise FrameError(FrameError.TOO_LARGE, "RESOURCE_EXHAUSTED",
                         f"Received message larger than max (> {limit} vs. {limit}) once decompressed")
    if not d.eof or d.unused_data:
        raise FrameError(FrameError.ENCODING, "INTERNAL",
                         f"a {encoding.decode()} message that is truncated or has bytes after its end")
    return out


class MessageReader:
    """Length-prefixed messages out of a stream's DATA, however it is split. ``limit``: the most
    one message may hold (its prefix is checked before anything is kept); ``encoding``: the
    call's ``grpc-encoding`` (b"" when absent), used when a message's compressed flag is set."""

    __slots__ = ("_chunks", "_have", "_need", "_flag", "limit", "encoding", "wire")

    def __init__(self, limit: int, encoding: bytes = b"") -> None:
        self._chunks: list[bytes] = []
        self._have = 0  # bytes in _chunks
        self._need = -1  # the current message's length once its prefix is known
        self._flag = 0
        self.limit = limit
        self.encoding = encoding
        self.wire: bytes | None = None  # the last compressed message as it came (before inflating)

    @property
    def pending(self) -> int:
        """Bytes received of a message not complete yet, its prefix included (0 at a message
        boundary)."""
        return self._have + (5 if self._need >= 0 else 0)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes (often none or one). Raises FrameError."""
        out: list[bytes] = []
        if not self._chunks and self._need < 0 and len(data) >= 5:
            # The common case: whole messages at the start of a chunk, no copy but the slice.
            pos = 0
            end = len(data)
            while end - pos >= 5:
                flag = data[pos]
                n = int.from_bytes(data[pos + 1:pos + 5], "big")
                self._check(flag, n)
                if end - pos - 5 < n:
                    break
                message = data[pos + 5:pos + 5 + n]
                out.append(self._open(flag, message) if flag else message)
                pos += 5 + n
            if pos == end:
                return out
            data = data[pos:]
        if data:
            self._chunks.append(data)
            self._have += len(data)
        while True:
            if self._need < 0:
                if self._have < 5:
                    return out
                head = self._take(5)
                self._flag = head[0]
                self._need = int.from_bytes(head[1:5], "big")
                self._check(self._flag, self._need)
            if self._have < self._need:
                return out
            message = self._take(self._need)
            out.append(self._open(self._flag, message) if self._flag else message)
            self._need = -1

    def _check(self, flag: int, n: int) -> None:
        if flag > 1:
            raise FrameError(FrameError.FRAMING, "INTERNAL",
                             f"a message with compressed flag {flag} (only 0 and 1 are defined)")
        if n > self.limit:
            raise FrameError(FrameError.TOO_LARGE, "RESOURCE_EXHAUSTED",
                             f"Received message larger than max ({n} vs. {self.limit})", n)

    def _open(self, flag: int, message: bytes) -> bytes:
        self.wire = message
        return _decompress(self.encoding, message, self.limit)

    def _take(self, n: int) -> bytes:
        """The first ``n`` held bytes (one join when they span chunks)."""
        if n == 0:
            return b""
        chunks = self._chunks
        first = chunks[0]
        if len(first) >= n:
            if len(first) == n:
                chunks.pop(0)
            else:
                chunks[0] = first[n:]
            self._have -= n
            return first[:n] if len(first) != n else first
        parts: list[bytes] = []
        got = 0
        while got < n:
            c = chunks[0]
            if got + len(c) <= n:
                parts.append(c)
                got += len(c)
                chunks.pop(0)
            else:
                k = n - got
                parts.append(c[:k])
                chunks[0] = c[k:]
                got = n
        self._have -= n
        return b"".join(parts)
