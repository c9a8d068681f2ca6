"""A request body still arriving, as the data plane reads it (:class:`gateway.dataplane.IncomingBody`):
checked against its declared length, the JSON nesting limit and the per-request limits as it comes.

Compiled with mypyc (setup.py), as are the exchange's chunks it reads (h1direct.py ``BodyChunks``):
its iterators are classes, not async generators, which mypyc does not compile — three of those
per body ran interpreted once per chunk.
"""
from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable

from ..budget import ByteBudget
from ..codec.jsondepth import InflatingScanner
from ..codec.jsonscan import JsonScanner
from ..errors import InvalidRequest
from ..rawbody import new_buffer

__all__ = ["Chunks", "IncomingBody", "too_deep_message"]


class IncomingBody:
    """:class:`gateway.dataplane.IncomingBody` over the body's chunks as they arrive, each
    checked (:meth:`_checked`) before it is handed on."""

    __slots__ = ("_budget", "_check", "_checked_json", "_chunks", "_json_end", "_pos", "_prefix", "_scan",
                 "_taken", "consumed", "length")

    def __init__(self, chunks: AsyncIterator[bytes | memoryview], length: int, budget: ByteBudget,
                 scan: JsonScanner | InflatingScanner | None = None, json_length: int | None = None,
                 check: Callable[[bytes], None] | None = None) -> None:
        self.length = length
        self.consumed = False
        self._chunks = chunks
        self._scan = scan
        self._json_end = length if json_length is None else json_length
        self._check = check
        self._checked_json = check is None
        self._pos = 0
        self._prefix: list[bytes | memoryview] = []  # chunks read by prefix(), replayed by every iteration
        self._budget = budget
        self._taken = 0

    async def read(self) -> bytes | bytearray:
        if not self._budget.take(self.length):
            parts: list[bytes | memoryview] = []
            async for piece in self:
                parts.append(piece)
            return b"".join(parts)
        self._taken = self.length
        buf = bytearray(self.length)  # one buffer of the declared size: no list beside a joined copy
        view = memoryview(buf)
        pos = 0
        async for chunk in self:
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        return buf

    async def read_view(self) -> bytes | bytearray | memoryview:
        """The whole body, as :meth:`read`, for a reader that only converts it (a view is
        enough): a body read whole past the parser (one chunk: h1conn.go_raw) is handed on as it
        is, not copied into one more; one that comes in pieces is copied into one buffer of the
        declared size left uninitialised (rawbody.new_buffer), so its pages are taken as the
        pieces are copied in and let go — a zero-filled one takes them all at once, beside the
        pieces still queued. (A chunk past the declared length is refused by the iteration, so a
        whole first chunk is the body.)"""
        if not self._budget.take(self.length):
            return await self.read()  # (past the budget: the pieces, joined)
        self._taken = self.length
        whole: bytes | memoryview | None = None
        view: memoryview | None = None
        pos = 0
        async for chunk in self:
            n = len(chunk)
            if pos == 0 and n == self.length:
                whole = chunk
            else:
                if view is None:
                    view = new_buffer(self.length)
                view[pos : pos + n] = chunk
            pos += n
        if whole is not None:
            return whole
        return view if view is not None else b""

    def release(self) -> None:
        """The request is over: its preallocation no longer counts against the budget."""
        self._budget.give(self._taken)
        self._taken = 0

    async def prefix(self, n: int) -> bytes:
        have = sum(map(len, self._prefix))
        while have < n:
            chunk = await self._next()
            if chunk is None:
                break
            self._prefix.append(chunk)
            have += len(chunk)
        return b"".join(self._prefix)[:n]

    def __aiter__(self) -> Chunks:
        return Chunks(self)

    async def _next(self) -> bytes | memoryview | None:
        """The body's next chunk, checked; None after the last."""
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            if self._pos != self.length:
                raise InvalidRequest("request body is shorter than its Content-Length") from None
            return None
        self._checked(chunk)
        return chunk

    def _checked(self, chunk: bytes | memoryview) -> None:
        """A chunk checked against the body's declared size — and, with a scanner, its JSON
        part (the first ``json_length`` bytes, or all; a compressed body's inflated) against
        the nesting limit as it arrives, and, with ``check`` too, the part's skeleton against
        the per-request limits (codec/limits.py) before the chunk that ends the part goes on: a
        body streamed to a backend never carries more than the limits allow, and one that does
        is cut short there (the backend never has the whole of it)."""
        pos = self._pos
        end = pos + len(chunk)
        scan = self._scan
        check = self._check
        if isinstance(scan, InflatingScanner):
            try:
                if scan.feed(chunk):
                    raise InvalidRequest(too_deep_message(scan.scanner.limit))
            except zlib.error as exc:
                raise InvalidRequest(f"cannot decompress the body: {exc}") from exc
            if check is not None and not self._checked_json and (scan.done or end >= self.length):
                self._checked_json = True
                check(scan.scanner.skeleton())
        elif scan is not None and pos < self._json_end:
            part = chunk[: self._json_end - pos]
            if scan.feed(part):  # (a view is scanned where it lies)
                raise InvalidRequest(too_deep_message(scan.limit))
            if check is not None and not self._checked_json and end >= self._json_end:
                self._checked_json = True
                check(scan.skeleton())
        self._pos = end
        if end > self.length:
            raise InvalidRequest("request body is longer than its Content-Length")


class Chunks:
    """One iteration of an :class:`IncomingBody`: its prefix again, then the chunks still to
    come. A class, not an async generator, so that mypyc compiles it."""

    __slots__ = ("_body", "_replayed")

    def __init__(self, body: IncomingBody) -> None:
        self._body = body
        self._replayed = 0

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> bytes | memoryview:
        body = self._body
        if self._replayed < len(body._prefix):
            self._replayed += 1
            return body._prefix[self._replayed - 1]
        chunk = await body._next()
        if chunk is None:
            raise StopAsyncIteration
        body.consumed = True
        return chunk


def too_deep_message(limit: int) -> str:
    return (f"request JSON nests deeper than {limit} levels (max_json_depth): a V2 request nests no deeper "
            "than its tensors have dimensions")
