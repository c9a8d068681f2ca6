"""JSON nesting depth, measured without parsing. No I/O.

A V2 request is shallow: an object of tensors whose ``data`` nests at most as deep as the
tensor has dimensions. A body of 100,000 nested brackets is not a request, and passed
through it crashes Triton 2.51 (its HTTP front end parses with recursion). The gateway
checks the depth of every JSON body it sends on — including pass-through bodies, which it
otherwise never parses. A body with no more opening brackets than the limit cannot be too
deep and is not scanned at all (two counts), so a small request pays well under a
microsecond; any other is scanned by codec/jsonscan.py (brackets outside strings, strings
found by their unescaped quotes), which a streamed body feeds chunk by chunk.
"""
from __future__ import annotations

import zlib

import numpy as np

from .jsonscan import JsonScanner

__all__ = ["InflatingScanner", "too_deep"]

_OPEN = (91, 123)  # [ {


def too_deep(buf: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether the JSON text ``buf`` nests arrays/objects deeper than ``limit``."""
    if len(buf) <= 4096:
        if not isinstance(buf, (bytes, bytearray)):
            buf = bytes(buf)
        opening = buf.count(b"[") + buf.count(b"{")  # two C scans: ~0.3 µs for a small request
    else:
        a = np.frombuffer(buf, dtype=np.uint8)  # two numpy counts: ~170 µs per MiB, bytes.count ~650
        opening = int(np.count_nonzero(a == _OPEN[0])) + int(np.count_nonzero(a == _OPEN[1]))
    if opening <= limit:
        return False
    return JsonScanner(limit, False).feed(buf)


class InflatingScanner:
    """A :class:`~.jsonscan.JsonScanner` over a gzip / deflate body arriving in compressed
    chunks: each is inflated in bounded pieces (never more than ``_PIECE`` bytes at once)
    only as far as the JSON part goes — ``json_length`` inflated bytes, or all — and the
    pieces scanned; ``done`` once the JSON part (or the stream) has ended. A body that does
    not inflate raises ``zlib.error`` (the caller's 400)."""

    _PIECE = 1 << 16

    __slots__ = ("_d", "_done", "_first", "_head", "_json_end", "_pos", "_raw_ok", "scanner")

    def __init__(self, scanner: JsonScanner, coding: str, json_length: int | None) -> None:
        self.scanner = scanner
        self._json_end = json_length
        self._pos = 0  # inflated bytes seen
        self._done = False
        # gzip and zlib streams both start with a header wbits 32+15 recognises; some clients
        # send raw deflate as "deflate", tried if the first bytes are not a zlib stream.
        self._raw_ok = coding == "deflate"
        self._d = zlib.decompressobj(32 + zlib.MAX_WBITS)
        self._first = True
        self._head = b""

    @property
    def done(self) -> bool:
        return self._done

    @property
    def exceeded(self) -> bool:
        return self.scanner.exceeded

    def feed(self, chunk: bytes | bytearray | memoryview) -> bool:
        if self._done or self.scanner.exceeded:
            return self.scanner.exceeded
        data = bytes(chunk)
        if self._first:
            # The stream's kind shows in its first two bytes (zlib / gzip header): held until then.
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return False
            self._first = False
            if self._raw_ok:
                try:
                    zlib.decompressobj(32 + zlib.MAX_WBITS).decompress(data[:64], 1)
                except zlib.error:
                    self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        while data and not self._done:
            piece = self._d.decompress(data, self._PIECE)
            data = self._d.unconsumed_tail
            if self._json_end is not None and self._pos + len(piece) >= self._json_end:
                piece = piece[: self._json_end - self._pos]
                self._done = True
            self._pos += len(piece)
            if piece and self.scanner.feed(piece):
                return True
            if self._d.eof:
                self._done = True
            elif not piece and not data:
                break
        return self.scanner.exceeded
