"""The rest of an HTTP/1.1 body of known length, read past the parser: straight from the socket
into buffers of the connection's own. httptools hands every body chunk over as a new bytes object
(one copy of every byte of every large body); once the body's remaining length is known exactly
(the parser took every byte read so far), the rest needs counting, not parsing.

Both sides use it: the listener for large request bodies (frontend/h1conn.py ``go_raw``) and the
backend client for large answers (backends/h1/reader.py ``buffer_updated``). It reads nothing itself: the
event loop asks for a buffer (``get_buffer``), reads into it and says how much it read
(``buffer_updated``).

Given the connection's socket descriptor (plain TCP only: :func:`plain_socket`), it also sets the socket's
low-water mark (``SO_RCVLOWAT``) while the body arrives: the loop is woken once ``LOWAT`` bytes (or
all that is left) are waiting, not for every segment, so a 16 MB body is read in pieces of at least
``LOWAT`` instead of whatever trickled in since the last wake-up — under concurrency that was ~1.6 ×
the reads and Python per request. A/B (benchmarks/ab.py, 3 and 4 rounds), a 128 KiB mark against
none: CPU per 16 MB binary pass-through −18 to −25 % at c=16 and c=64, −9 % at c=1; 1 MiB −10 % at
c=1, within ±5 % at c=16/64. A 256 KiB mark with 512 KiB buffers against 128 / 256 KiB (4 rounds):
16 MB −7 / −8 / −11 % at c=1 / 16 / 64, 1 MiB −3 / −3 / −4 %. Bodies of ``LARGE`` or more use twice
both. The mark drops to what is left near the end (else the last bytes would never wake the loop)
and to 1 once the body is over (the next request head is small). Bytes waiting under the mark are
progress a stall check cannot see: ``arrived()`` asks the kernel (``FIONREAD``), and the listener's
``body_timeout_s`` sweep counts them.
"""
from __future__ import annotations

import fcntl
import socket
import struct
import termios
from typing import Any, Final

import numpy as np

try:  # gateway/_rawio.c: the same steps without a socket object or a numpy array per call
    from ._rawio import buffer as _buffer
    from ._rawio import lowat as _lowat
    from ._rawio import release as _release
    from ._rawio import unread as _unread
except ImportError:  # built without a C compiler
    _buffer = None  # type: ignore[assignment]
    _lowat = None  # type: ignore[assignment]
    _release = None  # type: ignore[assignment]
    _unread = None  # type: ignore[assignment]

__all__ = ["HEAD_READ", "LARGE", "LOWAT", "RAW_MIN", "READ_SIZE", "RawBody", "new_buffer", "plain_socket",
           "release_buffers"]

# While a body is read past the parser, the socket wakes the loop only once this much of it
# (or all that is left, or its end) has arrived (SO_RCVLOWAT).
LOWAT: Final = 256 * 1024

READ_SIZE: Final = 512 * 1024
# A body with at least this much still to come is read with twice the mark into buffers twice
# the size: A/B (4 rounds) against LOWAT / READ_SIZE for every body, CPU per 16 MB pass-through
# −6 / −4 / −4 % at c=1 / 16 / 64; for 1 MiB the larger sizes were mixed (−9 / +4 / −1 %).
LARGE: Final = 4 << 20
# A read while a message head is awaited takes at most this much (the head and the first body
# bytes). Whatever body bytes a read brings with the head go through the parser, which hands
# them over as a new bytes object: with the 256 KiB reads of before that was up to 256 KiB per large
# body and direction copied once more — callgrind: half of the gateway's instructions on a 1 MiB
# pass-through.
# Smaller reads leave a large body in the socket for RawBody's buffers; a medium one (read
# through the parser) costs one more read.
HEAD_READ: Final = 16 * 1024
# A new buffer when less than this of the current one is free (reads stay large).
RAW_MIN: Final = 64 * 1024


def new_buffer(size: int) -> memoryview:
    """``size`` bytes to read into, uninitialised (no page-filling). From 64 KiB to 16 MiB, part of
    a buffer that ``_rawio`` keeps and hands out again once every view of it is gone (a bounded
    pool: a freed buffer left to the heap is split by small allocations before the next one of
    its size is asked for, and the heap grows instead; gateway/_rawio.c)."""
    if _buffer is not None:
        return _buffer(size)
    return np.empty(size, dtype=np.uint8).data.cast("B")


def release_buffers() -> int:
    """The pool's free buffers let go (the idle trim, gateway/malloc.py); the bytes let go."""
    return _release() if _release is not None else 0


def plain_socket(transport: Any) -> int:
    """The file descriptor of the transport's socket, for the low-water mark — -1 under TLS:
    there the mark would count ciphertext while the TLS layer may already hold part of the body,
    decrypted or not, and the last bytes would never wake the loop."""
    if transport is None or transport.get_extra_info("ssl_object") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    if sock is None:
        return -1
    fd: int = sock.fileno()
    return fd


def _set_lowat(fd: int, n: int) -> None:
    if _lowat is not None:
        _lowat(fd, n)
        return
    sock = socket.socket(fileno=fd)  # (the connection's own descriptor: detached, never closed here)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
    finally:
        sock.detach()


def _unread_bytes(fd: int) -> int:
    if _unread is not None:
        return _unread(fd)
    queued: int = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    return queued


class RawBody:
    """``left`` bytes of a body still to come. Each read's bytes become one chunk (a view) that
    nothing writes over again: the consumer may keep it as long as it likes."""

    __slots__ = ("_fd", "_fixed", "_free", "_lowat", "_queued", "_size", "left")

    def __init__(self, left: int, fd: int = -1, into: memoryview | None = None) -> None:
        self.left = left
        # ``into``: where the whole rest goes (at least ``left`` bytes), no buffer of its own.
        self._free: memoryview | None = into
        self._fixed = into is not None
        assert into is None or len(into) >= left
        self._fd = fd  # the socket's descriptor (plain_socket), -1: no mark
        self._lowat = 1
        self._queued = 0  # unread bytes in the socket at the last arrived()
        large = left >= LARGE
        self._size = 2 * READ_SIZE if large else READ_SIZE
        self._wake_at(min(2 * LOWAT if large else LOWAT, left))

    def _wake_at(self, n: int) -> None:
        if self._fd >= 0 and n != self._lowat:
            try:
                _set_lowat(self._fd, n)
                self._lowat = n
            except OSError:
                self._fd = -1

    def done(self) -> None:
        """The body is over (or abandoned): the socket wakes on every byte again."""
        self._wake_at(1)

    def closed(self) -> None:
        """The connection is gone: its descriptor is closed and may already number another
        socket, which must not be touched."""
        self._fd = -1

    def arrived(self) -> bool:
        """Whether bytes have reached the socket, unread, since the last call: under the
        low-water mark a slow client's progress waits in the kernel, and a stall check
        (the listener's ``body_timeout_s``) must not take it for a pause."""
        if self._fd < 0 or self._lowat <= 1:
            return False
        try:
            queued = _unread_bytes(self._fd)
        except OSError:
            return False
        grew = queued > self._queued
        self._queued = queued
        return grew

    def buffer(self) -> memoryview:
        """Where the next read goes: the free rest of a buffer of its own (uninitialised:
        numpy.empty, no page-filling), never more than the body still to come — bytes after the
        body (a request pipelined behind it) stay in the socket for the parser."""
        free = self._free
        if free is None or (len(free) < RAW_MIN and not self._fixed):
            free = self._free = new_buffer(self._size)
        return free[: self.left] if self.left < len(free) else free

    def take(self, nbytes: int) -> memoryview:
        """The ``nbytes`` the last read put at the start of :meth:`buffer`, as one chunk."""
        free = self._free
        assert free is not None and 0 < nbytes <= self.left
        self._free = free[nbytes:]
        self.left -= nbytes
        self._queued = 0
        if self.left < self._lowat:
            self._wake_at(max(self.left, 1))
        return free[:nbytes]
