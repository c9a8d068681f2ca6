"""Background health and readiness checks (never per request).

Each round asks every endpoint whether it is live, then asks, for every route
with an exact model name, whether some endpoint of its pool reports that model
ready. The gateway is ready when every such route is, and never with no
backends. Results are plain attributes read by the proxy and metrics.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ..errors import GatewayError
from .._pb import grpc_predict_v2_pb2 as pb
from .grpc import GrpcPool
from .http import HttpPool

__all__ = ["HealthChecker"]

log = logging.getLogger("oip_gateway.health")

Pool = HttpPool | GrpcPool


async def endpoint_live(pool: Pool, ep, timeout: float) -> bool:
    try:
        if isinstance(pool, HttpPool):
            reply = await pool.request("GET", "/v2/health/live", timeout=timeout, endpoint=ep)
            return reply.status == 200
        resp = await pool.call("ServerLive", pb.ServerLiveRequest(), timeout=timeout, endpoint=ep)
        return bool(resp.live)
    except GatewayError:
        return False


async def endpoint_model_ready(pool: Pool, ep, model: str, version: str, timeout: float) -> bool:
    try:
        if isinstance(pool, HttpPool):
            path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
            reply = await pool.request("GET", path, timeout=timeout, endpoint=ep)
            return reply.status == 200
        resp = await pool.call(
            "ModelReady", pb.ModelReadyRequest(name=model, version=version), timeout=timeout, endpoint=ep
        )
        return bool(resp.ready)
    except GatewayError:
        return False


class HealthChecker:
    def __init__(
        self,
        pools: dict[str, Pool],
        exact_routes: Sequence[tuple[str, str | None, str]],
        *,
        interval_s: float,
        timeout_s: float,
        on_round: Callable[["HealthChecker"], None] | None = None,
        concurrency: int = 64,
    ) -> None:
        self.pools = pools
        self.exact_routes = list(exact_routes)  # (model, version or None, backend)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.ready = False
        self.rounds = 0
        self.not_ready: list[str] = []
        self._on_round = on_round
        self._sem = asyncio.Semaphore(concurrency)
        self._task: asyncio.Task[None] | None = None

    async def _bounded(self, coro):
        async with self._sem:
            return await coro

    async def check_once(self) -> bool:
        eps = [(pool, ep) for pool in self.pools.values() for ep in pool.endpoints]
        live = await asyncio.gather(*(self._bounded(endpoint_live(p, ep, self.timeout_s)) for p, ep in eps))
        for (_, ep), ok in zip(eps, live):
            ep.healthy = ok

        async def route_ready(model: str, version: str | None, backend: str) -> bool:
            pool = self.pools[backend]
            for ep in pool.endpoints:
                if ep.healthy and await self._bounded(
                    endpoint_model_ready(pool, ep, model, version or "", self.timeout_s)
                ):
                    return True
            return False

        results = await asyncio.gather(*(route_ready(*r) for r in self.exact_routes))
        self.not_ready = [f"{m}" + (f"/{v}" if v else "") for (m, v, _), ok in zip(self.exact_routes, results) if not ok]
        any_live = any(live)
        self.ready = any_live and not self.not_ready
        self.rounds += 1
        if self._on_round is not None:
            self._on_round(self)
        return self.ready

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # noqa: BLE001 - the checker must outlive any single failure
                log.exception("health round failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
