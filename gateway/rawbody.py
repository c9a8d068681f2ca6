"""The rest of an HTTP/1.1 body of known length, read past the parser: straight from the socket
into buffers of the connection's own. httptools hands every body chunk over as a new bytes object
(one copy of every byte of every large body); once the body's remaining length is known exactly
(the parser took every byte read so far), the rest needs counting, not parsing.

Both sides use it: the listener for large request bodies (frontend/h1listen.py ``go_raw``) and the
backend client for large answers (upstream/h1.py ``buffer_updated``). No I/O: the event loop asks
for a buffer (``get_buffer``), reads into it and says how much it read (``buffer_updated``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["RAW_MIN", "READ_SIZE", "RawBody"]

READ_SIZE = 256 * 1024
# A new buffer when less than this of the current one is free (reads stay large).
RAW_MIN = 64 * 1024


class RawBody:
    """``left`` bytes of a body still to come. Each read's bytes become one chunk (a view) that
    nothing writes over again: the consumer may keep it as long as it likes."""

    __slots__ = ("_free", "left")

    def __init__(self, left: int) -> None:
        self.left = left
        self._free: memoryview | None = None

    def buffer(self) -> memoryview:
        """Where the next read goes: the free rest of a buffer of its own (uninitialised:
        numpy.empty, no page-filling), never more than the body still to come — bytes after the
        body (a request pipelined behind it) stay in the socket for the parser."""
        free = self._free
        if free is None or len(free) < RAW_MIN:
            free = self._free = np.empty(READ_SIZE, dtype=np.uint8).data.cast("B")
        return free[: self.left] if self.left < len(free) else free

    def take(self, nbytes: int) -> memoryview:
        """The ``nbytes`` the last read put at the start of :meth:`buffer`, as one chunk."""
        free = self._free
        assert free is not None and 0 < nbytes <= self.left
        self._free = free[nbytes:]
        self.left -= nbytes
        return free[:nbytes]
