"""One pass over an inference request's JSON text, whole or in chunks, that measures its
nesting depth and keeps its *skeleton*: the text with the contents of every ``"data"``
array left out (``"data": [1, 2, 3]`` becomes ``"data": []``). No I/O.

Why: the per-request limits (codec/limits.py) read the id, the parameters, the tensors'
names and shapes — everything but their data. A request of any size is checked on its
skeleton, which is a few hundred bytes per tensor however much data the tensors carry; so a
large JSON body (or one padded to look large) is held to the same limits as a small one, and
a streamed pass-through body is checked as it goes by without being kept.

How it stays cheap: a tensor's data is mostly numbers. Inside a ``"data"`` array the scan
jumps from one bracket or quote to the next with ``_jsonskip.special`` (C: one pass, 64 bytes a
step with AVX2 or 16 with SSE2, over the chunk where it lies — a view of the listener's read
buffer is not copied), then
steps through the bytes around it one at a time for a short stretch — dense text (a BYTES
tensor's strings, rows of a nested array) is stepped through at the speed of that loop, never
searched again and again. Outside ``"data"`` (the request's own structure, small) every byte is
stepped through. A view is stepped through in bytes copies of those stretches (a structure's
stretch grows from 256 bytes while it lasts), never copied whole. Compiled with mypyc
(setup.py): about 1 ns per stepped byte, well under 0.1 ns per byte of a flat numeric array.
Built without a C compiler, the skip is ``bytes.find`` on a copy of each chunk (the next
position of each byte kind remembered until it is passed, so each byte is searched once per
kind).

The skeleton of valid JSON is valid JSON with the same members everywhere outside ``data``
arrays; malformed JSON gives some skeleton, which the limits check leaves to the parser
that reads the body (its own error). A member spelled with escapes (``"d\\u0061ta"``) is not
recognised as ``data``: its contents stay in the skeleton, which is then larger, never wrong.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Final

__all__ = ["JsonScanner", "skeleton"]

_special: Callable[[bytes | bytearray | memoryview, int, int, bool], int] | None
try:
    from ._jsonskip import special as _special
except ImportError:  # built without a C compiler (setup.py): the finds below, on a copy
    _special = None

_QUOTE: Final = 34  # "
_BACKSLASH: Final = 92
_COLON: Final = 58
_OPEN_ARRAY: Final = 91  # [
_OPEN_OBJECT: Final = 123  # {
_CLOSE_ARRAY: Final = 93  # ]
_CLOSE_OBJECT: Final = 125  # }

_STRUCTURE: Final = 0
_DATA: Final = 1

# After a special byte inside "data", the bytes up to this many further are stepped through
# rather than searched for: dense text costs the byte loop, not a find per byte.
_STRETCH: Final = 256
# A view's structure is stepped through in copies this long at first, twice as long for each
# further stretch while it lasts (structure between tensors is tens of bytes; a body of nothing
# else is copied in pieces of at most _WINDOW_MAX).
_WINDOW_MIN: Final = 256
_WINDOW_MAX: Final = 64 * 1024


class JsonScanner:
    """``feed`` the text in order (any chunking gives the same result); ``exceeded`` says
    whether it nested deeper than ``limit`` (negative: no limit; the scan stops there),
    ``skeleton()`` (with ``keep``) is the text without its ``data`` arrays' contents, and
    ``spans`` where those contents were: per array, in order, its contents' start offset in the
    text, the depth around the array, and the end offset (codec/jsonfast.py reads them in
    place)."""

    def __init__(self, limit: int, keep: bool) -> None:
        self.limit = limit
        self.keep = keep
        self.exceeded = False
        self.depth = 0
        self.mode = _STRUCTURE
        self.data_base = 0  # the depth outside the "data" array being skipped
        self.in_string = False
        self.escape = False  # the previous byte was a backslash inside a string
        # 0: nothing; 1: the last token was the string "data"; 2: ... followed by its colon.
        self.key = 0
        # The structure string being read: where it began in this chunk (-1: an earlier one),
        # its length before this chunk, and its first bytes then (to recognise "data").
        self.str_start = -1
        self.str_carry_len = 0
        self.str_carry = b""
        self.keep_from = 0  # where the skeleton's next piece of this chunk begins
        self.parts: list[bytes] = []
        self.spans: list[int] = []
        self.offset = 0  # the text's bytes fed before this chunk
        # The next position at or after the scan of each byte the data skip looks for
        # (len(chunk): none in this chunk).
        self.next_quote = 0
        self.next_backslash = 0
        self.next_open_array = 0
        self.next_close_array = 0
        self.next_open_object = 0
        self.next_close_object = 0

    def skeleton(self) -> bytes:
        return b"".join(self.parts)

    def feed(self, chunk: bytes | bytearray | memoryview) -> bool:
        """Scan the next part of the text (bytes, or a view read in place); returns (and keeps)
        ``exceeded``."""
        n = len(chunk)
        if self.exceeded or n == 0:
            return self.exceeded
        if _special is None and not isinstance(chunk, bytes):
            chunk = bytes(chunk)  # (the finds of the fallback read bytes)
        self.keep_from = 0
        self.next_quote = self.next_backslash = -1
        self.next_open_array = self.next_close_array = self.next_open_object = self.next_close_object = -1
        i = 0
        window = _WINDOW_MIN
        while i < n:
            if self.mode == _DATA:
                if not self.escape:  # (a backslash ended the last chunk: its next byte is stepped over)
                    i = self._skip(chunk, i, n)
                    if i >= n:
                        break
                stop = min(n, i + _STRETCH)
            else:
                stop = n if isinstance(chunk, bytes) else min(n, i + window)
                window = min(2 * window, _WINDOW_MAX)
            if isinstance(chunk, bytes):
                i = self._step(chunk, 0, chunk, i, stop)
            else:
                i = self._step(bytes(chunk[i:stop]), i, chunk, i, stop)
            if self.exceeded:
                return True
            if self.mode == _DATA:
                window = _WINDOW_MIN
        self.offset += n
        if self.mode == _STRUCTURE:
            if self.keep and self.keep_from < n:
                self.parts.append(_piece(chunk, self.keep_from, n))
            if self.in_string:  # a structure string continues in the next chunk
                start = self.str_start
                if start >= 0:
                    self.str_carry = _piece(chunk, start + 1, min(n, start + 6))
                    self.str_carry_len = n - start - 1
                else:
                    self.str_carry = (self.str_carry + _piece(chunk, 0, min(n, 5)))[:5]
                    self.str_carry_len += n
                self.str_start = -1
        return False

    def _skip(self, chunk: bytes | bytearray | memoryview, i: int, n: int) -> int:
        """Inside a "data" array (not just after a backslash): the position of the next byte
        that may matter — a quote or backslash inside a string, else a quote or a bracket."""
        if _special is not None:
            return _special(chunk, i, n, self.in_string)
        assert isinstance(chunk, bytes)
        if self.in_string:
            if self.next_quote < i:
                self.next_quote = _find(chunk, b'"', i, n)
            if self.next_backslash < i:
                self.next_backslash = _find(chunk, b"\\", i, n)
            return min(self.next_quote, self.next_backslash)
        if self.next_quote < i:
            self.next_quote = _find(chunk, b'"', i, n)
        if self.next_open_array < i:
            self.next_open_array = _find(chunk, b"[", i, n)
        if self.next_close_array < i:
            self.next_close_array = _find(chunk, b"]", i, n)
        if self.next_open_object < i:
            self.next_open_object = _find(chunk, b"{", i, n)
        if self.next_close_object < i:
            self.next_close_object = _find(chunk, b"}", i, n)
        return min(self.next_quote, self.next_open_array, self.next_close_array, self.next_open_object,
                   self.next_close_object)

    def _step(self, text: bytes, base: int, chunk: bytes | bytearray | memoryview, i: int, stop: int) -> int:
        """Byte by byte from ``i`` up to ``stop`` of ``chunk``, read from ``text`` (the chunk's
        bytes from ``base`` on: the chunk itself, or a copy of the stretch); returns where it
        stopped — early when a "data" array opens (the skip takes over) or the depth passes
        the limit."""
        depth = self.depth
        limit = self.limit
        mode = self.mode
        in_string = self.in_string
        escape = self.escape
        key = self.key
        while i < stop:
            c = text[i - base]
            if in_string:
                if escape:
                    escape = False
                elif c == _BACKSLASH:
                    escape = True
                elif c == _QUOTE:
                    in_string = False
                    if mode == _STRUCTURE:
                        key = 1 if self._is_data(chunk, i) else 0
            elif c == _QUOTE:
                in_string = True
                if mode == _STRUCTURE:
                    self.str_start = i
                    self.str_carry_len = 0
                    key = 0
            elif c == _OPEN_ARRAY or c == _OPEN_OBJECT:
                depth += 1
                if depth > limit >= 0:
                    self.exceeded = True
                    break
                if mode == _STRUCTURE and key == 2 and c == _OPEN_ARRAY:
                    # "data": [ — its contents are skipped, the brackets kept.
                    if self.keep:
                        self.parts.append(_piece(chunk, self.keep_from, i + 1))
                        self.spans.append(self.offset + i + 1)
                        self.spans.append(depth - 1)
                    mode = _DATA
                    self.data_base = depth - 1
                    key = 0
                    i += 1
                    break
                key = 0
            elif c == _CLOSE_ARRAY or c == _CLOSE_OBJECT:
                depth -= 1
                if mode == _DATA:
                    if depth <= self.data_base:
                        mode = _STRUCTURE
                        self.keep_from = i
                        if self.keep:
                            self.spans.append(self.offset + i)
                else:
                    key = 0
            elif mode == _STRUCTURE and not (c == 32 or c == 10 or c == 13 or c == 9):
                key = 2 if c == _COLON and key == 1 else 0
            i += 1
        self.depth = depth
        self.mode = mode
        self.in_string = in_string
        self.escape = escape
        self.key = key
        return i

    def _is_data(self, chunk: bytes | bytearray | memoryview, end: int) -> bool:
        """Whether the structure string closing at ``end`` is ``"data"``."""
        start = self.str_start
        if start >= 0:
            return end - start == 5 and _piece(chunk, start + 1, end) == b"data"
        return self.str_carry_len + end == 4 and self.str_carry + _piece(chunk, 0, end) == b"data"


def _piece(chunk: bytes | bytearray | memoryview, start: int, end: int) -> bytes:
    """``chunk[start:end]`` as bytes (of a view: a copy, so the skeleton holds no read buffer)."""
    return chunk[start:end] if isinstance(chunk, bytes) else bytes(chunk[start:end])


def _find(chunk: bytes, what: bytes, i: int, n: int) -> int:
    at = chunk.find(what, i)
    return n if at < 0 else at


def skeleton(text: bytes) -> bytes:
    """The skeleton of a whole JSON text."""
    scanner = JsonScanner(-1, True)
    scanner.feed(text)
    return scanner.skeleton()
