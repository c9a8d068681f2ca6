"""ModelStreamInfer through the proxy, as an async generator: :class:`Proxy` is compiled
(setup.py) and mypyc builds no async generator, so its ``infer_stream`` hands over to this."""
from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from .admission import StreamHeld
from .codec.wire import scan_infer_routing
from .headers import metadata_map, pick_headers
from .holding import hold, holding
from .errors import GatewayError, InvalidRequest

if TYPE_CHECKING:
    from .proxy import Proxy


async def proxy_stream(proxy: Proxy, first: bytes, rest: AsyncIterator[bytes], model: str, version: str,
                       timeout: float | None, affinity: str | None = None,
                       metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[bytes]:
    """:meth:`Proxy.infer_stream`."""
    routing = proxy.routing
    headers = metadata_map(metadata)
    backend, match = routing.pick(model, version, headers, affinity)
    holds = backend.holds if holding(backend, match) else None
    if holds is not None:
        await hold(backend, match, model, version)
    refused: list[GatewayError] = []
    held = StreamHeld(proxy.admission, backend.grpc_cost())
    held.take(len(first))  # over max_inflight_bytes: UNAVAILABLE before a backend stream opens

    async def requests() -> AsyncIterator[bytes]:
        yield first
        held.give()
        async for message in rest:
            m, v, _ = scan_infer_routing(message)
            try:
                if not m:
                    raise InvalidRequest("ModelInferRequest.model_name is required")
                match = routing.table.resolve(m, v, headers)
                if backend.name not in (match.split.names if match.split is not None else (match.backend,)):
                    raise InvalidRequest(
                        f"model '{m}' routes to another backend than this stream's ('{backend.name}'): "
                        "open one stream per backend")
                held.take(len(message))
            except GatewayError as err:
                refused.append(err)
                return  # half-close: the backend answers what it has, then the stream ends
            yield message
            held.give()

    if holds is not None:
        holds.enter(model, match.label)  # an open stream keeps its model in use
    try:
        trace = pick_headers(metadata, proxy.context_headers)
        async for answer in backend.infer_stream(requests(), model, version, timeout, affinity, trace):
            yield answer
    finally:
        held.close()
        if holds is not None:
            holds.leave(model, match.label)
    if refused:
        raise refused[0]
