"""Running the reference server alone, and the demo (gateway in front of it).

``oip-gateway demo`` starts the reference V2 server on loopback ports the
kernel picks, then the gateway on Triton's default ports (8000/8001/8002)
with a route per demo model. ``oip-gateway reference`` runs the reference
server alone (tests use it as a second real backend).
"""
from __future__ import annotations

import logging

from ..config.schema import BackendSpec, GatewayConfig, Health, HostPort, Listen, Route
from ..observability.metrics import Metrics
from ..server import Gateway, Listeners, Ports, wait_for_signal
from ..supervisor import announce
from .models import default_repository
from ..security.guard import Gate
from .plane import DemoPlane

__all__ = ["demo_config", "run_demo", "run_reference"]

log = logging.getLogger("oip_gateway.demo")

# The demo routes its models across both transports so one `oip-gateway demo`
# shows pass-through and conversion: add_sub lives in the HTTP backend, every
# other model in the gRPC backend, so each client protocol meets both paths.
_LOOPBACK = HostPort("127.0.0.1", 0)


async def start_reference(http: HostPort | None, grpc: HostPort | None, max_message_bytes: int,
                          metrics: HostPort | None = None) -> Listeners:
    observed = Metrics() if metrics is not None else None
    listeners = Listeners(DemoPlane(default_repository()), max_message_bytes, Gate(), observed)
    await listeners.start(http=http, grpc=grpc, metrics_addr=metrics,
                          metrics_registry=observed.registry if observed else None)
    return listeners


def demo_config(ref: Ports, *, http: HostPort, grpc: HostPort, metrics: HostPort) -> GatewayConfig:
    backends = {
        "demo-http": BackendSpec("demo-http", "http", (HostPort("127.0.0.1", ref.http or 0),)),
        "demo-grpc": BackendSpec("demo-grpc", "grpc", (HostPort("127.0.0.1", ref.grpc or 0),)),
    }
    routes = tuple(
        Route(model=name, backend="demo-http" if name == "add_sub" else "demo-grpc") for name in default_repository()
    )
    return GatewayConfig(
        backends=backends,
        routes=routes,
        listen=Listen(http=http, grpc=grpc, metrics=metrics),
        health=Health(interval_s=1.0, timeout_s=1.0),
    )


async def run_reference(*, http: HostPort, grpc: HostPort, port_file: str | None,
                        metrics: HostPort | None = None, max_message_bytes: int = 256 * 1024 * 1024) -> int:
    ref = await start_reference(http, grpc, max_message_bytes, metrics)
    announce(ref.ports, port_file)
    try:
        await wait_for_signal()
    finally:
        await ref.stop()
    return 0


async def run_demo(*, http: HostPort, grpc: HostPort, metrics: HostPort, port_file: str | None) -> int:
    config = demo_config(Ports(), http=http, grpc=grpc, metrics=metrics)
    ref = await start_reference(_LOOPBACK, _LOOPBACK, config.max_message_bytes)
    config = demo_config(ref.ports, http=http, grpc=grpc, metrics=metrics)
    gw = Gateway(config)
    ports = await gw.start()
    await gw.health.check_once()
    log.info("demo models: %s", ", ".join(default_repository()))
    announce(ports, port_file)
    try:
        await wait_for_signal()
    finally:
        await gw.stop()
        await ref.stop()
    return 0
