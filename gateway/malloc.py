"""glibc allocator tuning for large tensors (process-wide, set once at start-up).

By default glibc serves every allocation above 128 KiB (growing dynamically to
at most 32 MiB) with a fresh ``mmap`` and returns it with ``munmap`` on free,
so each request's tensor buffers are new pages that the kernel must fault in
and zero — measured here, 53–55% of the gateway's CPU at 64 MiB payloads was
page faults (benchmarks/conversion). Raising the mmap threshold to the message
limit and never trimming the heap lets freed buffers be reused: gateway CPU per
64 MiB request fell 446 → 173 ms (HTTP binary → gRPC) and 430 → 185 ms
(gRPC → HTTP). The price is memory held after a burst of large requests: up to
about 2 × ``max_message_bytes`` per in-flight request stays resident.

The memory comes back after the burst: :class:`IdleTrimmer` calls ``malloc_trim(0)``
once large requests have stopped for a moment (``OIP_GATEWAY_MALLOC_TRIM=0`` disables it).

Disable with ``OIP_GATEWAY_MALLOC_TUNING=0``; explicit ``MALLOC_MMAP_THRESHOLD_``
/ ``MALLOC_TRIM_THRESHOLD_`` environment settings are left alone.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from collections.abc import Callable

__all__ = ["IdleTrimmer", "large_answer", "large_answer_at", "tune_malloc"]

log = logging.getLogger("oip_gateway")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# mallopt takes an int; an explicit threshold is not bound by the 32 MiB ceiling
# of glibc's *dynamic* threshold (checked on glibc 2.36: a 64 MiB copy 45 → 9 ms).
_INT_MAX = 2**31 - 1


def tune_malloc(max_message_bytes: int) -> bool:
    """Apply the tuning; return whether it took effect."""
    if os.environ.get("OIP_GATEWAY_MALLOC_TUNING", "1") == "0":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    threshold = min(max_message_bytes, _INT_MAX)
    trim = min(2 * max_message_bytes, _INT_MAX)
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim))
    if "MALLOC_ARENA_MAX" not in os.environ:
        # One arena, shared by the event loop's thread and grpc's. A second arena is where
        # grpc's threads put the tensor-sized buffers of gRPC messages, and malloc_trim cannot
        # empty it: it gives back the free chunks of every arena but shrinks only the main
        # arena's top (glibc 2.36 mtrim; another arena's top shrinks on a free only, past
        # M_TRIM_THRESHOLD, which the tuning above raises). After 16 bursts of 16 MB through a
        # gRPC backend that top kept ~56 MB resident for good (2 arenas; 8 per core, the default,
        # kept more). With one arena the trim gives back all but ~1 MB; A/B (4 rounds) of the
        # contention it could add: grpc_small 0.91 / 0.98 / 0.99, grpc_16m 1.01 / 1.00 / 0.86,
        # JSON → gRPC 1 MiB 1.01 / 1.02 / 0.97 × CPU per request at c=1 / 16 / 64.
        mallopt(_M_ARENA_MAX, 1)
    if not ok:
        log.info("glibc mallopt refused the large-buffer tuning; running with defaults")
    return ok


# The allocator is process-wide, and so is this: when a backend's answer last left a large
# buffer behind (a whole body of MiBs, or one refused part-way: a lying Content-Length, an
# endless chunked answer). The idle trim follows those as it follows large requests: a
# backend's bytes must not stay resident because no client sent anything large.
_large_answer_at = 0.0


def large_answer() -> None:
    global _large_answer_at
    _large_answer_at = time.monotonic()


def large_answer_at() -> float:
    return _large_answer_at


class IdleTrimmer:
    """Gives the allocator's free pages back to the system once large-tensor traffic has
    gone quiet: the tuning above keeps freed buffers for reuse while large requests come
    (their speed), and this returns them after the burst (the pod's memory). ``activity()``
    is the monotonic time of the last large request entering or leaving (admission.Admission);
    ``quiet_s`` after it, with none in flight (``busy()``), ``malloc_trim(0)`` runs once, in a
    thread (it takes the arena locks and walks the heap: milliseconds for a few hundred MiB).
    glibc only; a no-op elsewhere."""

    MOVED = 8 << 20  # RSS given back by a pass, or moved between passes, that means "still freeing"
    MAX_PASSES = 30  # at quiet_s * 2 apart: about two minutes of a slow client's answer

    def __init__(self, activity: Callable[[], float], quiet_s: float = 2.0, period_s: float = 0.5,
                 busy: Callable[[], bool] = lambda: False, release: Callable[[], int] = lambda: 0) -> None:
        self.activity = activity
        # Large requests in flight (admission.Admission.large_inflight): one taking longer than
        # quiet_s (a 16 MB conversion under a burst takes seconds) is not quiet. Trimming then
        # gave back buffers the burst re-faulted at once (four trims inside one 16-client burst).
        self.busy = busy
        # Buffers kept for reuse outside the allocator (rawbody.release_buffers): let go first,
        # so the trim can give their pages back too.
        self.release = release
        self.quiet_s = quiet_s
        self.period_s = period_s
        self.trims = 0
        self._done_for = 0.0
        self._trim = _malloc_trim()

    async def run(self) -> None:
        if self._trim is None:
            return
        while True:
            await asyncio.sleep(self.period_s)
            last = self.activity()
            if last and last != self._done_for and time.monotonic() - last >= self.quiet_s and not self.busy():
                self._done_for = last
                await self._passes(last)

    async def _passes(self, last: float) -> None:
        """Trims a few seconds apart while memory is still being freed. Buffers go late: the
        answers to the last large requests are still being written to clients that read them
        slowly (in one 16-client burst of 16 MB conversions, for 18 s after the last request
        left admission control; three passes then left ~130 MB, under the trim threshold that
        glibc's own trim on free waits for), grpc's and cyclic garbage later still. So: on
        while a pass gives back ``MOVED`` or RSS moved that much since the last one; stop after
        two calm passes in a row, new large activity, or ``MAX_PASSES``."""
        calm = 0
        previous = -1
        for _ in range(self.MAX_PASSES):
            before, after = await self._once()
            if self.activity() != last or self.busy():
                return
            moved = before - after >= self.MOVED or (previous >= 0 and abs(before - previous) >= self.MOVED)
            previous = after
            calm = 0 if moved else calm + 1
            if calm >= 2:
                return
            await asyncio.sleep(self.quiet_s * 2)

    async def _once(self) -> tuple[int, int]:
        """One trim; returns RSS before and after it."""
        assert self._trim is not None
        before = _rss()
        gc.collect()  # buffers held only by reference cycles (tracebacks, futures) go first
        self.release()
        await asyncio.get_running_loop().run_in_executor(None, self._trim, 0)
        self.trims += 1
        after = _rss()
        log.debug("large requests quiet: malloc_trim, RSS %d -> %d MiB", before >> 20, after >> 20)
        return before, after


def _malloc_trim() -> Callable[[int], int] | None:
    if os.environ.get("OIP_GATEWAY_MALLOC_TRIM", "1") == "0":
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def _rss() -> int:
    """This process's resident set size in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
