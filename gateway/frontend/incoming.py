"""A request body still arriving, as the data plane reads it (:class:`gateway.dataplane.IncomingBody`):
checked against its declared length, the JSON nesting limit and the per-request limits as it comes.

Its own module because its iterators are async generators, which mypyc does not compile:
setup.py compiles frontend/h1direct.py (whose ``chunks()`` is :func:`body_chunks`) and
frontend/infer.py (which reads bodies through this module).
"""
from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from ..budget import ByteBudget
from ..codec.jsondepth import InflatingScanner
from ..codec.jsonscan import JsonScanner
from ..dataplane import ClientDisconnected
from ..errors import InvalidRequest

if TYPE_CHECKING:
    from .h1direct import DirectExchange

__all__ = ["IncomingBody", "body_chunks", "too_deep_message"]


class IncomingBody:
    """:class:`gateway.dataplane.IncomingBody` over the body's chunks as they arrive."""

    __slots__ = ("_budget", "_chunks", "_prefix", "_taken", "consumed", "length")

    def __init__(self, chunks: AsyncIterator[bytes | memoryview], length: int, budget: ByteBudget,
                 scan: JsonScanner | InflatingScanner | None = None, json_length: int | None = None,
                 check: Callable[[bytes], None] | None = None) -> None:
        self.length = length
        self.consumed = False
        self._chunks = _checked(chunks, length, scan, json_length, check)
        self._prefix: list[bytes | memoryview] = []  # chunks read by prefix(), replayed by every iteration
        self._budget = budget
        self._taken = 0

    async def read(self) -> bytes | bytearray:
        if not self._budget.take(self.length):
            parts = [chunk async for chunk in self]
            return b"".join(parts)
        self._taken = self.length
        buf = bytearray(self.length)  # one buffer of the declared size: no list beside a joined copy
        view = memoryview(buf)
        pos = 0
        async for chunk in self:
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        return buf

    def release(self) -> None:
        """The request is over: its preallocation no longer counts against the budget."""
        self._budget.give(self._taken)
        self._taken = 0

    async def prefix(self, n: int) -> bytes:
        have = sum(map(len, self._prefix))
        async for chunk in self._chunks:
            self._prefix.append(chunk)
            have += len(chunk)
            if have >= n:
                break
        return b"".join(self._prefix)[:n]

    async def __aiter__(self) -> AsyncIterator[bytes | memoryview]:
        for chunk in self._prefix:
            yield chunk
        async for chunk in self._chunks:
            self.consumed = True
            yield chunk


async def _checked(chunks: AsyncIterator[bytes | memoryview], size: int,
                   scan: JsonScanner | InflatingScanner | None = None,
                   json_length: int | None = None,
                   check: Callable[[bytes], None] | None = None) -> AsyncIterator[bytes | memoryview]:
    """The body's chunks, checked against its declared size — and, with ``scan``, its JSON
    part (the first ``json_length`` bytes, or all; a compressed body's inflated) against
    the nesting limit as it arrives, and, with ``check`` too, the part's skeleton against the
    per-request limits (codec/limits.py) before the chunk that ends the part goes on: a body
    streamed to a backend never carries more than the limits allow, and one that does is cut
    short there (the backend never has the whole of it)."""
    pos = 0
    json_end = size if json_length is None else json_length
    unchecked = check is not None
    async for chunk in chunks:
        end = pos + len(chunk)
        if isinstance(scan, InflatingScanner):
            try:
                if scan.feed(chunk):
                    raise InvalidRequest(too_deep_message(scan.scanner.limit))
            except zlib.error as exc:
                raise InvalidRequest(f"cannot decompress the body: {exc}") from exc
            if check is not None and unchecked and (scan.done or end >= size):
                unchecked = False
                check(scan.scanner.skeleton())
        elif scan is not None and pos < json_end:
            part = chunk[: json_end - pos]
            if scan.feed(part if type(part) is bytes else bytes(part)):
                raise InvalidRequest(too_deep_message(scan.limit))
            if check is not None and unchecked and end >= json_end:
                unchecked = False
                check(scan.skeleton())
        pos = end
        if pos > size:
            raise InvalidRequest("request body is longer than its Content-Length")
        yield chunk
    if pos != size:
        raise InvalidRequest("request body is shorter than its Content-Length")


def too_deep_message(limit: int) -> str:
    return (f"request JSON nests deeper than {limit} levels (max_json_depth): a V2 request nests no deeper "
            "than its tensors have dimensions")


async def body_chunks(ex: DirectExchange) -> AsyncIterator[bytes | memoryview]:
    """:meth:`DirectExchange.chunks` (an async generator: mypyc compiles h1direct.py, not these)."""
    while True:
        while ex._chunks:
            chunk = ex._chunks.popleft()
            if not ex._chunks:
                ex._taken()
            yield chunk
        if not ex.more_body:
            return
        if ex.disconnected:
            raise ClientDisconnected
        await ex._wait()
