"""The lines of a Triton metrics page that can hold a queue depth. No I/O.

A page of 10,000 models has 10,000 ``nv_inference_pending_request_count`` lines, nearly all
``... 0``. :func:`~gateway.codec.queue_metrics.parse_pending` looks at each of them: 3.0 ms for
such a page (compiled), one step on the event loop per endpoint scraped. :func:`pending_lines`
hands it only the pending lines that do not end in `` 0``, found by the regex engine in one pass
in C (0.3 ms for that page): the scraper parses ``parse_pending(pending_lines(page))``, which is
``parse_pending(page)`` (a line ending in `` 0`` is one parse_pending reads as zero and skips).
Not part of queue_metrics.py: that module is compiled with mypyc, and here the work is the
regex engine's either way.
"""
from __future__ import annotations

import re

from .queue_metrics import PENDING

__all__ = ["pending_lines"]

# The end of a line that does not end in " 0" (a zero count ends so: parse_pending skips it).
_NOT_ZERO_END = re.compile(rb"\n(?<! 0\n)")


def pending_lines(text: bytes) -> bytes:
    """The pending lines of ``text`` that parse_pending might count, each from its first
    ``PENDING`` on as parse_pending reads it, with their newlines: ``parse_pending(
    pending_lines(text)) == parse_pending(text)``."""
    first = text.find(PENDING)
    if first == -1:
        return b""
    last = text.find(b"\n", text.rfind(PENDING))
    end = len(text) if last == -1 else last + 1
    out: list[bytes] = []
    for match in _NOT_ZERO_END.finditer(text, first, end):
        newline = match.start()
        at = text.find(PENDING, text.rfind(b"\n", 0, newline) + 1, newline)
        if at != -1:
            out.append(text[at : newline + 1])
    if last == -1:  # the page's last line is a pending one without a newline: read as it is
        out.append(text[text.find(PENDING, text.rfind(b"\n") + 1) :])
    return b"".join(out)
