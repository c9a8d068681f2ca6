"""Large JSON inference bodies read without a Python object per tensor element. No I/O.

The plain reading (codec/httpdecode.py) parses the whole text with orjson and converts each
tensor's ``data`` list with numpy: for 1 MiB of FP32 as JSON, 13 ms and ~9 MB of Python floats
on the way to 1 MiB of tensor bytes. Here the text is scanned once (codec/jsonscan.py): its
skeleton — everything but the ``data`` arrays' contents, a few hundred bytes per tensor — is
parsed, and each ``data`` array is read from the text in place into the tensor's bytes
(``_jsondata.numbers``, C).

It is an accelerator, never a second opinion: it decides only what it reads exactly as the plain
reading does, and :class:`Fallback` sends the whole body back to the plain reading otherwise
(escapes in the structure, a datatype or token the C reader leaves out, an irregular nesting, any
refusal — so every error is worded once, there). tests/unit/test_jsondata_fast.py holds it to
the plain reading.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .datatypes import DatatypeInfo
from .jsonscan import JsonScanner

__all__ = ["DataSpan", "Fallback", "available", "load", "read_all", "tensor_bytes"]

_numbers: Callable[[bytes | bytearray | memoryview, int, int, int, int], tuple[bytearray, tuple[int, ...]] | None] | None
try:
    from ._jsondata import numbers as _numbers
except ImportError:  # built without a C compiler (setup.py): the plain reading only
    _numbers = None

_ORJSON_DEPTH = 1024  # the deepest nesting orjson.loads takes (measured: 1,025 is refused)
_C_DEPTH = 32  # the deepest the C reader reads (_jsondata.c, MAX_DEPTH)

# The C reader's datatype codes (_jsondata.c, CODE_*); FP16, BF16 and BYTES are read plainly.
_CODES = {"BOOL": 0, "INT8": 1, "INT16": 2, "INT32": 3, "INT64": 4, "UINT8": 5, "UINT16": 6,
          "UINT32": 7, "UINT64": 8, "FP32": 9, "FP64": 10}


def available() -> bool:
    return _numbers is not None


class Fallback(Exception):
    """This body is read the plain way (the fast reading does not decide it)."""


class DataSpan:
    """A ``data`` array left in the text: its contents are ``text[start:end]``."""

    __slots__ = ("depth", "end", "read", "start", "text")

    def __init__(self, text: memoryview, start: int, depth: int, end: int) -> None:
        self.text = text
        self.start = start
        self.depth = depth  # of the array's place in the whole text (0: the top level)
        self.end = end
        self.read = False  # its text was read (and so checked) as JSON

    def value(self) -> Any:
        """The array parsed on its own, as the plain reading would have it. Raises Fallback."""
        self.read = True
        text = bytes(self.text[self.start - 1:self.end + 1])
        # Whole, the text nests this array's depth deeper: past orjson's limit there, the plain
        # reading refuses what parses here (each bracket counted as a level: a bound).
        if self.depth + text.count(b"[") + text.count(b"{") > _ORJSON_DEPTH:
            raise Fallback
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:  # (NaN / Infinity tokens, or malformed: the plain reading)
            raise Fallback from None


def load(text: memoryview) -> tuple[dict[str, Any], bytes, list[DataSpan]]:
    """(the JSON object with every ``data`` array a :class:`DataSpan`, the skeleton it was parsed
    from — for the repeated-names check —, those spans). Raises Fallback."""
    scanner = JsonScanner(-1, True)
    scanner.feed(text)
    spans = scanner.spans
    skeleton = scanner.skeleton()
    # A backslash in the structure: a member may be spelled with escapes ("d\u0061ta"), which the
    # scanner does not take for "data" and the parser does. (Not three per array: one not closed.)
    if len(spans) % 3 or (spans and b"\\" in skeleton):
        raise Fallback
    try:
        doc = orjson.loads(skeleton)
    except orjson.JSONDecodeError:
        raise Fallback from None
    placed: list[DataSpan] = []
    if type(doc) is not dict or (spans and _attach(doc, text, spans, placed) != len(spans) // 3):
        raise Fallback
    return doc, skeleton, placed


def read_all(spans: list[DataSpan]) -> None:
    """The plain reading parses the whole text, so a ``data`` array nobody reads (a member the
    decoder ignores) still has to be JSON: those are parsed here. Raises Fallback."""
    for span in spans:
        if not span.read:
            span.value()


def _attach(node: Any, text: memoryview, spans: list[int], placed: list[DataSpan]) -> int:
    """Puts the next span, in text order, where the skeleton's next ``data`` array is (appended to
    ``placed``); returns how many are placed. Object members keep the text's order (orjson), so
    the orders agree."""
    if type(node) is dict:
        for key, value in node.items():
            if type(value) is list:
                if key == "data":
                    k = 3 * len(placed)
                    if value or k + 2 >= len(spans):
                        raise Fallback
                    span = DataSpan(text, spans[k], spans[k + 1], spans[k + 2])
                    node[key] = span
                    placed.append(span)
                else:
                    _attach(value, text, spans, placed)
            elif type(value) is dict:
                _attach(value, text, spans, placed)
    elif type(node) is list:
        for value in node:
            if type(value) is list or type(value) is dict:
                _attach(value, text, spans, placed)
    return len(placed)


def tensor_bytes(info: DatatypeInfo, shape: tuple[int, ...], count: int, data: DataSpan) -> memoryview | None:
    """A numeric tensor's raw little-endian bytes from its ``data`` text, nested as the shape or
    flat (spec "Tensor Data"); None where the C reader leaves it to the plain one
    (:meth:`DataSpan.value`)."""
    code = _CODES.get(info.name)
    if code is None or count < 1 or _numbers is None or data.depth + _C_DEPTH > _ORJSON_DEPTH:
        return None
    data.read = True
    got = _numbers(data.text, data.start, data.end, code, count)
    if got is None:
        return None
    raw, dims = got
    if dims != shape and not (len(dims) == 1 and dims[0] == count):
        return None
    return memoryview(raw)
