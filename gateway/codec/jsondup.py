"""Repeated member names in inference JSON, refused. No I/O.

RFC 8259 section 4: "The names within an object SHOULD be unique" — and when they are not,
"the behavior of software that receives such an object is unpredictable". It is: orjson,
msgspec and Python's json keep the *last* of a repeated name; RapidJSON's ``FindMember``,
which Triton's HTTP front end reads requests with, finds the *first*. So
``{"inputs": [A], "inputs": [B]}`` is checked against the limits as B while Triton runs A, and
converted to gRPC it would carry B where Triton over HTTP answers from A: one request, two
meanings. The gateway refuses it instead, naming the member.

Proof without a second parse, in the common case: outside strings, JSON has exactly one ``:``
per object member (the name separator, RFC 8259 section 4). So the colons of the text are at
least the members of all its objects, and more when a string holds a colon. A parser that
keeps one value per name returns objects whose sizes add up to *at most* the members
written, less by one per repeat. Hence: when the text's colons equal the members the parsed
objects hold, no object repeats a name (and no other object has members). Only when they
differ — a string with a colon in it (an id like ``urn:x``, a BYTES element), a ``null``
member the counter skipped, an object where none is expected, or a real repeat — is the text
read again by a parser that sees every pair (:func:`_strict`), which decides.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import GatewayError, InvalidRequest

Fault = Callable[[str], GatewayError]

__all__ = ["check_unique", "colons", "members", "refuse_repeats"]

_COLON = 58


def colons(text: bytes | bytearray | memoryview) -> int:
    """The ``:`` bytes of ``text``."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) <= 4096:
            return text.count(b":")
    elif len(text) <= 4096:
        return bytes(text).count(b":")
    # numpy's vectorised compare is ~4 x bytes.count on large text (codec/jsondepth.py measures
    # the same for brackets), and reads a memoryview without copying it.
    return int(np.count_nonzero(np.frombuffer(text, dtype=np.uint8) == _COLON))


def members(doc: dict[str, Any]) -> int:
    """The members of an inference request or response object (spec "Inference Request JSON
    Object" / "Inference Response JSON Object") and of the objects it holds by the spec: its
    ``parameters``, each input and output object and their ``parameters``."""
    n = len(doc)
    params = doc.get("parameters")
    if type(params) is dict:
        n += len(params)
    for key in ("inputs", "outputs"):
        tensors = doc.get(key)
        if type(tensors) is list:
            for t in tensors:
                if type(t) is dict:
                    n += len(t)
                    tp = t.get("parameters")
                    if type(tp) is dict:
                        n += len(tp)
    return n


def check_unique(text: bytes | bytearray | memoryview, counted: int, what: str) -> None:
    """Refuse ``text`` (InvalidRequest) when one of its objects repeats a member name.

    ``counted`` is at most the members ``text`` holds — the sizes of the objects its parse
    returned (:func:`members`), or fewer — never more, or a repeat could pass unseen."""
    if colons(text) != counted:
        _strict(text, what, InvalidRequest)


def refuse_repeats(text: bytes | bytearray | memoryview, what: str, fault: Fault = InvalidRequest) -> None:
    """Refuse ``text`` (``fault``) when one of its objects repeats a member name, read by the
    strict parser at once: for small control-plane bodies (settings, model control, model
    configuration), which are not counted."""
    _strict(text, what, fault)


class _Repeated(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique(pairs: list[tuple[str, Any]]) -> None:
    # (None, not a dict: the values are not kept, only their names judged.)
    if len(pairs) > 1:
        names = {name for name, _ in pairs}
        if len(names) != len(pairs):
            seen: set[str] = set()
            for name, _ in pairs:
                if name in seen:
                    raise _Repeated(name)
                seen.add(name)


def _strict(text: bytes | bytearray | memoryview, what: str, fault: Fault) -> None:
    """Every (name, value) pair of every object, read by the standard library's parser."""
    try:
        json.loads(bytes(text) if isinstance(text, memoryview) else text, object_pairs_hook=_unique)
    except _Repeated as rep:
        shown = rep.name if len(rep.name) <= 64 else rep.name[:64] + "…"
        raise fault(
            f"{what} JSON repeats the member name {shown!r} within one object; names must be unique "
            "(RFC 8259 section 4: parsers disagree on which of the repeats counts)") from None
    except (ValueError, RecursionError):
        return  # not JSON this parser reads: the path that reads it says so in its own words
