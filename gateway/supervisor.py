"""``--workers N``: N gateway processes sharing the HTTP and gRPC ports.

The supervisor binds each port once with SO_REUSEPORT *without listening* —
that resolves a port of 0 and holds the port — then starts N fresh
interpreters (``python -m gateway _worker``) that each bind the same port with
SO_REUSEPORT and listen, so the kernel spreads connections across them. gRPC
servers are created inside each worker (grpc does not survive fork). Metrics
of all workers are aggregated by prometheus_client's multiprocess mode and
served by the supervisor. A worker that dies is restarted. SIGHUP (and, with
``--watch``, a change of the config file) is checked here once and passed to
every worker, which reloads the file itself.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess

from .config.loader import read_config
from .config.schema import GatewayConfig, HostPort
from .dataplane import DataPlane
from .errors import ConfigError
from .security.guard import Gate
from .listeners import Listeners, Ports, bind_socket
from .watch import watch_file

__all__ = ["supervise"]

log = logging.getLogger("oip_gateway.supervisor")


async def _wait_ready(proc: asyncio.subprocess.Process, timeout: float) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    if line.strip() != b"READY":
        raise RuntimeError(f"worker {proc.pid} failed to start (exit code {proc.returncode})")


async def supervise(
    config_path: str, config: GatewayConfig, workers: int, *, port_file: str | None, log_level: str,
    watch: bool = False, digest: bytes | None = None,
) -> int:
    listen = config.listen
    held = []
    ports = Ports()
    if listen.http is not None:
        s = bind_socket(listen.http, listen=False, reuse_port=True)
        held.append(s)
        ports.http = s.getsockname()[1]
    if listen.grpc is not None:
        s = bind_socket(listen.grpc, listen=False, reuse_port=True)
        held.append(s)
        ports.grpc = s.getsockname()[1]

    # Placement: one process decides per pool (gateway/peers.py). Worker 0 serves the peers port
    # (listen.peers, or a loopback one of its own); the other workers ask it.
    peers_at: HostPort | None = None
    if any(b.placement is not None for b in config.backends.values()):
        where = listen.peers or HostPort("127.0.0.1", 0)
        s = bind_socket(where, listen=False, reuse_port=True)
        held.append(s)
        peers_at = HostPort(where.host, s.getsockname()[1])
        if listen.peers is not None:
            ports.peers = peers_at.port

    mpdir = tempfile.mkdtemp(prefix="oip-gateway-metrics-")
    # Each worker takes its share of the memory limit (admission control's default).
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=mpdir, OIP_GATEWAY_WORKER_COUNT=str(workers))
    argv = [sys.executable, "-m", "gateway", "--log-level", log_level, "_worker", "--config", config_path]
    if ports.http is not None:
        argv += ["--http-port", str(ports.http)]
    if ports.grpc is not None:
        argv += ["--grpc-port", str(ports.grpc)]

    async def spawn(i: int) -> asyncio.subprocess.Process:
        mine = env if peers_at is None else dict(env, OIP_GATEWAY_PEERS_PORT=f"{peers_at.host}:{peers_at.port}",
                                                 OIP_GATEWAY_PEERS_SERVE="1" if i == 0 else "0")
        proc = await asyncio.create_subprocess_exec(*argv, env=mine, stdout=subprocess.PIPE)
        await _wait_ready(proc, 60)
        return proc

    procs = list(await asyncio.gather(*(spawn(i) for i in range(workers))))

    metrics_listeners: Listeners | None = None
    if listen.metrics is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=mpdir)
        metrics_listeners = Listeners(DataPlane(), config.max_message_bytes, Gate())
        mports = await metrics_listeners.start(
            http=None, grpc=None, metrics_addr=listen.metrics, metrics_registry=registry
        )
        ports.metrics = mports.metrics
    announce(ports, port_file, workers)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    seen: list[bytes | None] = [None]  # digest of the content last passed on

    async def reload(if_changed: bool = False) -> None:
        """Check the file once here (one log line if it is refused), then every worker
        reloads it itself (each counts the result in its metrics)."""
        try:
            config, seen[0] = await loop.run_in_executor(None, read_config, config_path,
                                                         seen[0] if if_changed else None)
            if config is None:
                return  # a watched file whose content did not change
        except ConfigError as exc:
            if if_changed and exc.digest == seen[0]:
                return
            seen[0] = exc.digest
            log.error("config reload refused, still serving the previous config: %s", "; ".join(exc.problems))
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGHUP)

    reloads: set[asyncio.Task[None]] = set()

    def on_hup() -> None:
        task = loop.create_task(reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    seen[0] = digest  # the content ``config`` was read from (cli: read once)
    watcher = loop.create_task(watch_file(config_path, lambda: reload(if_changed=True))) if watch else None

    restarts: list[float] = []
    while not stop.is_set():
        waits = {asyncio.ensure_future(p.wait()): i for i, p in enumerate(procs)}
        stopper = asyncio.ensure_future(stop.wait())
        done, pending = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if stop.is_set():
            break
        for t in done:
            if t in waits:
                i = waits[t]
                dead = procs[i]
                log.error("worker %d exited with %s; restarting", dead.pid, dead.returncode)
                multiprocess.mark_process_dead(dead.pid, mpdir)
                now = time.monotonic()
                restarts = [r for r in restarts if now - r < 60] + [now]
                if len(restarts) > 10 * workers:
                    log.critical("workers keep dying; giving up")
                    stop.set()
                    break
                procs[i] = await spawn(i)

    if watcher is not None:
        watcher.cancel()
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 15 + config.drain_s)
        except TimeoutError:
            p.kill()
            await p.wait()
    if metrics_listeners is not None:
        await metrics_listeners.stop()
    for s in held:
        s.close()
    shutil.rmtree(mpdir, ignore_errors=True)
    return 0


def announce(ports: Ports, port_file: str | None, workers: int = 1) -> None:
    """Log the bound ports and, if asked, write them to ``port_file`` atomically (tests read it)."""
    import orjson

    logging.getLogger("oip_gateway").info(
        "oip-gateway serving http=%s grpc=%s metrics=%s workers=%d",
        ports.http, ports.grpc, ports.metrics, workers,
    )
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_bytes(orjson.dumps(ports.as_dict()))
        os.replace(tmp, port_file)


