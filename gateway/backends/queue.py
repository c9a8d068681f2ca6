"""least_queue: each endpoint's Triton queue depth, read in the background.

For a backend with ``balance: least_queue``, every ``queue_metrics.interval_s`` each endpoint's
Triton metrics page (``http://<host>:<metrics port>/metrics``, plain HTTP on its own port)
is read over a kept-alive connection and its pending request counts stored on the endpoint
(``Endpoint.queue``), where the balancer reads them. A page that cannot be read (port
closed, not Triton, too slow) sets ``queue`` to None: that endpoint is then balanced by its
in-flight requests alone, and nothing fails (logged once per endpoint). Counted: scrapes
by result, and the CPU spent reading pages (``oip_gateway_queue_scrape_seconds_total``:
parsing only — the HTTP exchange around it cost ~10 × more in benchmarks/least_queue.py,
~0.33 ms of CPU per scrape in all).

At fleet size the pages are the cost (Triton's page for 10,000 models is ~1 MB; 300 such
endpoints every 0.5 s would be ~600 MB/s to read): a pass reads at most ``CONCURRENCY`` pages at
once, and the next one begins ``interval_s`` after it ended — or later, so that a pass's work is
at most ``SHARE`` of a core over the pass and the wait together; never back to back. A small
fleet is read every ``interval_s``; a large one as often as that share allows
(benchmarks/control_plane.py). Two readers take the endpoints in turn and pause ``PACE_S``
after each page: pages read together would be read in one turn of the loop, which requests then
wait behind (benchmarks/tail.py). Endpoints the health checks have down are not read.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..codec.queue_metrics import parse_pending
from ..codec.queue_page import pending_lines
from ..config.schema import HostPort
from .base import Backend
from .endpoints import Endpoint
from .h1 import H1ConnectionPool

__all__ = ["QueueScraper"]

log = logging.getLogger("oip_gateway.queue")

# A metrics page larger than this is not read whole (Triton's with thousands of models is a
# few MiB); the endpoint then falls back to least-request.
_MAX_PAGE = 32 << 20
# Pages read at once by one backend's pass. Few: pages that arrive together are read in one turn
# of the event loop, which requests then wait behind (8 at once at 100 endpoints × 1,000 models
# put a light load's p99 at 1.8 × a one-endpoint backend's: benchmarks/tail.py).
CONCURRENCY = 2
# A reader's pause after each page: a pass's pages spread out, so that a request meets at most
# about one page being read on its way (back to back, each of its turns met one).
PACE_S = 0.002
# Passes whose CPU the wait after a pass is computed from (the least of them).
_WORKS = 3
# The share of a core one backend's scraping may take, averaged over a pass and the wait after it:
# 100 endpoints × 1,000 models are read every ~1.4 s, 300 × 10,000 every ~24 s — then 0.045 of a
# core idle with the health checks, which take ~0.035 (benchmarks/control_plane.py; at 1.5 % it was
# 0.055: the share counts only the reads, not the loop's turns around them).
SHARE = 0.01
# Good reads in a row after which an unreadable page is logged as readable again.
_READABLE_AGAIN = 3


class QueueScraper:
    def __init__(self, backend: Backend[Any], on_scrape: Callable[[str, bool, float], None] | None = None) -> None:
        self.backend = backend
        self._conns: dict[HostPort, H1ConnectionPool] = {}
        self._task: asyncio.Task[None] | None = None
        self._ports = dict(backend.spec.metrics_ports)
        # Endpoints whose page could not be read (logged once) -> good reads since.
        self._unreadable: dict[HostPort, int] = {}
        # This thread's CPU in the current pass's reads (thread_time), the reads under way, and
        # the thread_time when the first of them began.
        self._work = 0.0
        self._reading = 0
        self._since = 0.0
        # (backend name, read ok, seconds of work): for the metrics.
        self.on_scrape = on_scrape or (lambda name, ok, seconds: None)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for conns in self._conns.values():
            conns.close()
        self._conns.clear()

    async def _run(self) -> None:
        interval = self.backend.spec.queue_metrics.interval_s
        works: deque[float] = deque(maxlen=_WORKS)
        while True:
            self._work = 0.0
            await self.scrape_once()
            # The pass's CPU, from its reads (_scrape; an upper bound: what else the loop ran while
            # a page was on its way counts too). The least of the last few passes is the estimate:
            # the first ran beside start-up, and any may meet a health round.
            works.append(self._work)
            work = min(works) if len(works) > 1 else 0.0
            await asyncio.sleep(max(interval, work / SHARE - work))

    async def scrape_once(self) -> None:
        eps = list(self.backend.endpoints.values())
        for addr in [a for a in self._conns if a not in self.backend.endpoints]:
            self._conns.pop(addr).close()  # the endpoint left (DNS, reload)
        # CONCURRENCY readers taking endpoints in turn: not a task per endpoint, whose first steps,
        # all in one turn of the loop, would hold it (as fanout.py's gather_in_slices says).
        todo = iter(eps)

        async def reader() -> None:
            for ep in todo:
                if ep.health.live is False:
                    # Down (health checks): it takes no traffic, and a pod that is gone would hold
                    # a reader for a whole connect timeout every pass.
                    ep.queue = None
                    continue
                await self._scrape(ep)
                await asyncio.sleep(PACE_S)

        await asyncio.gather(*(reader() for _ in range(CONCURRENCY)))

    async def _scrape(self, ep: Endpoint) -> None:
        # CPU counted while some read is under way (the readers' windows overlap: each counted
        # alone would count the other's work twice), not during the pauses between pages.
        if not self._reading:
            self._since = time.thread_time()
        self._reading += 1
        try:
            await self._read(ep)
        finally:
            self._reading -= 1
            if not self._reading:
                self._work += time.thread_time() - self._since

    async def _read(self, ep: Endpoint) -> None:
        spec = self.backend.spec
        timeout = min(spec.queue_metrics.interval_s * 4, spec.timeout_s, 2.0)
        conns = self._conns.get(ep.address)
        if conns is None:
            port = self._ports.get(ep.address, spec.queue_metrics.port)
            conns = self._conns[ep.address] = H1ConnectionPool(
                ep.address.host, port, connect_timeout=min(timeout, spec.connect_timeout_s), max_connections=1,
                max_idle=1)
        try:
            reply = await conns.request("GET", "/metrics", timeout=timeout, stream_min=_MAX_PAGE)
            body = reply.body
            if not isinstance(body, (bytes, bytearray)):
                body.close()  # a page too large to read whole: not read at all
                raise ValueError(f"metrics page over {_MAX_PAGE} bytes")
            if reply.status != 200:
                raise ValueError(f"metrics answered {reply.status}")
        except Exception as exc:  # any failure only means "no queue known here"
            if ep.address not in self._unreadable:
                self._unreadable[ep.address] = 0
                log.warning("backend '%s' endpoint %s: queue metrics unreadable (%s); balanced by its requests "
                            "in flight until they can be read", self.backend.name, ep.address, _reason(exc, timeout))
            else:
                self._unreadable[ep.address] = 0
            ep.queue = None
            self.on_scrape(self.backend.name, False, 0.0)
            return
        if ep.address in self._unreadable:
            # Said once it stays readable (a page that comes every other time is no flapping log).
            self._unreadable[ep.address] += 1
            if self._unreadable[ep.address] >= _READABLE_AGAIN:
                del self._unreadable[ep.address]
                log.info("backend '%s' endpoint %s: queue metrics readable again", self.backend.name, ep.address)
        t0 = time.perf_counter()
        # (Only the lines that can count: a 10,000-model page read whole held the loop 3 ms.)
        ep.queue = parse_pending(pending_lines(bytes(body)))
        self.on_scrape(self.backend.name, True, time.perf_counter() - t0)


def _reason(exc: BaseException, timeout: float) -> str:
    """What a failed read says in the log: its message, else what it was."""
    if isinstance(exc, TimeoutError):
        return str(exc) or f"no answer within {timeout:g}s"
    return str(exc) or type(exc).__name__
