"""Shadow traffic: copies of a share of a route's inference requests sent to another backend
in the background, their answers and failures discarded.

The client's request never waits for its copy: the copy is a task of its own, started
after the primary backend was chosen, and the share is exact (a running credit of
``percent`` per request, so 10 % is every tenth request, not about a tenth). Copies in
flight per route are bounded by ``max_inflight``: past it a copy is dropped, not queued,
so a slow or dead shadow backend holds at most that many requests' memory and never builds
a backlog. Outcomes are counted (``oip_gateway_mirror_requests_total``).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..dataplane import HttpReply, is_streamed
from ..routing.table import Match
from .base import Backend

__all__ = ["Mirrors"]

log = logging.getLogger("oip_gateway.mirror")


class _State:
    __slots__ = ("credit", "inflight")

    def __init__(self) -> None:
        self.credit = 0.0
        self.inflight = 0


class Mirrors:
    def __init__(self, backends: Callable[[], Mapping[str, Backend[Any]]], counter: Any, gauge: Any) -> None:
        self._backends = backends
        self._counter = counter
        self._gauge = gauge
        self._state: dict[tuple[str, str], _State] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _take(self, match: Match) -> tuple[tuple[str, str], Backend[Any]] | None:
        mirror = match.mirror
        assert mirror is not None
        key = (match.label, mirror.backend)
        state = self._state.get(key)
        if state is None:
            if len(self._state) >= 4096:  # reloads may rename routes: keep it bounded
                self._state.clear()
            state = self._state[key] = _State()
        state.credit += mirror.percent
        if state.credit < 100.0:
            return None
        state.credit -= 100.0
        backend = self._backends().get(mirror.backend)
        if backend is None:
            return None
        if state.inflight >= mirror.max_inflight:
            self._counter.labels(*key, "dropped").inc()
            return None
        state.inflight += 1
        self._gauge.labels(*key).inc()
        return key, backend

    def _start(self, key: tuple[str, str], call: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(key, call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: tuple[str, str], call: Awaitable[Any]) -> None:
        outcome = "failed"
        try:
            answer = await call
            if isinstance(answer, HttpReply):
                if is_streamed(answer.body):
                    answer.body.close()  # nobody reads a shadow's answer: let its connection go
                outcome = "answered" if answer.status == 200 else "failed"
            else:
                outcome = "answered"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a shadow's failure is never the client's
            log.debug("mirror to %s failed: %s", key[1], exc)
        finally:
            self._counter.labels(*key, outcome).inc()
            self._gauge.labels(*key).dec()
            state = self._state.get(key)
            if state is not None:
                state.inflight -= 1

    def http(self, match: Match, model: str, version: str, body: bytes, headers: Mapping[str, str],
             forwarded: Sequence[str], limit: int) -> None:
        """Maybe copy an HTTP inference (body already read) to the route's shadow backend."""
        taken = self._take(match)
        if taken is not None:
            key, backend = taken
            self._start(key, backend.infer_http(model, version, body, dict(headers), forwarded, limit))

    def grpc(self, match: Match, model: str, version: str, message: bytes,
             metadata: tuple[tuple[str, str], ...]) -> None:
        """Maybe copy a gRPC ModelInfer to the route's shadow backend."""
        taken = self._take(match)
        if taken is not None:
            key, backend = taken
            self._start(key, backend.infer_grpc(message, model, version, None, None, metadata))
