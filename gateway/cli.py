"""Command line: ``oip-gateway serve | check | demo``.

    oip-gateway serve --config FILE [--watch] [--workers N] [--port-file PATH]
    oip-gateway check FILE [--strict]
    oip-gateway demo [--http HOST:PORT] [--grpc HOST:PORT] [--metrics HOST:PORT]
    oip-gateway reference [--http HOST:PORT] [--grpc HOST:PORT] [--metrics HOST:PORT]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from . import __version__
from .config import DEFAULT_MAX_MESSAGE_BYTES, HostPort
from .config.loader import check_config, read_config
from .config.parsing import Presence
from .errors import ConfigError, ListenError
from .gcpolicy import hold, resume, settle
from .grpcengine import grpc_engine
from .h2 import describe as describe_h2
from .h2 import native
from .malloc import tune_malloc
from .memlimit import memory_limit

__all__ = ["main"]

log = logging.getLogger("oip_gateway")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - declared dependency
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve_one(config, *, config_path: str, digest: bytes | None, port_file: str | None,
                     http_port: int | None, grpc_port: int | None, worker: bool, watch: bool) -> int:
    from .server import Gateway, wait_for_signal
    from .supervisor import announce
    from .watch import watch_file

    workers = int(os.environ.get("OIP_GATEWAY_WORKER_COUNT", "0") or 0) or config.workers
    peers_env = os.environ.get("OIP_GATEWAY_PEERS_PORT", "") if worker else ""  # (supervisor.py)
    host, _, port = peers_env.rpartition(":")
    gw = Gateway(config, reuse_port=worker, quiet_reload_errors=worker, memory_limit=memory_limit(),
                 workers=workers, peers_port=HostPort(host, int(port)) if port.isdigit() else None,
                 serves_peers=os.environ.get("OIP_GATEWAY_PEERS_SERVE", "1") == "1")
    if gw.auto_inflight and config.max_inflight_bytes is None:
        log.info("max_inflight_bytes: %d per process (a share of the memory limit; set it to override)",
                 gw.auto_inflight)
    gw.config_digest = digest  # what --watch compares changes against: the content this config came from
    # SIGHUP reloads the config file (a worker's supervisor forwards it); --watch also
    # reloads when the file changes. A SIGHUP during start-up is applied once started.
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    reloads: set[asyncio.Task[bool]] = set()

    async def reload_file(if_changed: bool) -> bool:
        before = gw.config
        ok = await gw.reload_file(config_path, if_changed=if_changed)
        if gw.config is not before:
            settle()  # what the reload replaced is collected; what it built is frozen
        return ok

    async def reload_when_started() -> bool:
        await started.wait()
        return await reload_file(False)

    def reload() -> None:
        task = loop.create_task(reload_when_started())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    listen = config.listen
    http = HostPort(listen.http.host, http_port) if (listen.http and http_port is not None) else None
    grpc = HostPort(listen.grpc.host, grpc_port) if (listen.grpc and grpc_port is not None) else None
    ports = await gw.start(http=http, grpc=grpc, serve_metrics=not worker)
    settle()  # start-up's objects frozen, out of the collector's way (gcpolicy.py)
    started.set()
    if worker:
        # The supervisor waits for this line before it counts the worker as up.
        sys.stdout.write("READY\n")
        sys.stdout.flush()
    else:
        announce(ports, port_file)
    watcher = loop.create_task(watch_file(config_path, lambda: reload_file(True))) \
        if watch else None
    try:
        await wait_for_signal()
    finally:
        if watcher is not None:
            watcher.cancel()
        await gw.stop()
    return 0


def _hold_sighup() -> None:
    """Until the event loop handles SIGHUP (reload), it must not kill the process (its
    default action): a reload signal sent during start-up would otherwise be fatal."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def cmd_serve(args: argparse.Namespace) -> int:
    _hold_sighup()
    hold()  # no collections until start-up is done (gcpolicy.py): _serve_one's settle() ends it
    try:
        return _serve(args)
    finally:
        resume()  # (start-up failed before settle())


def _serve(args: argparse.Namespace) -> int:
    try:
        # (Read once: the digest comes with the config, not from parsing the file a second time —
        # 1.3 s at 10,000 routes.)
        config, digest = read_config(args.config)
        assert config is not None  # (None only when asked to skip an unchanged file)
    except ConfigError as exc:
        for p in exc.problems:
            print(f"error: {p}", file=sys.stderr)
        return 2
    workers = args.workers or config.workers
    tune_malloc(config.max_message_bytes)
    log.info("%s", describe_h2())
    if not (native("server") and native("client")):
        log.info("%s", grpc_engine())
    _install_uvloop()
    if workers > 1:
        from .supervisor import supervise

        resume()  # (the supervisor keeps CPython's collector as it is: only its workers serve)
        return asyncio.run(
            supervise(args.config, config, workers, port_file=args.port_file, log_level=args.log_level,
                      watch=args.watch, digest=digest)
        )
    return asyncio.run(_serve_one(config, config_path=args.config, digest=digest, port_file=args.port_file,
                                  http_port=None, grpc_port=None, worker=False, watch=args.watch))


def cmd_worker(args: argparse.Namespace) -> int:
    _hold_sighup()
    hold()  # (as cmd_serve)
    try:
        config, digest = read_config(args.config)
        assert config is not None
        tune_malloc(config.max_message_bytes)
        _install_uvloop()
        return asyncio.run(
            _serve_one(config, config_path=args.config, digest=digest, port_file=None, http_port=args.http_port,
                       grpc_port=args.grpc_port, worker=True, watch=False)
        )
    finally:
        resume()


def cmd_check(args: argparse.Namespace) -> int:
    """Everything checkable here is checked. A file or variable the config names that does not
    exist on this machine (a Secret mounted, a variable set only in the pod) is one note line
    and no failure — unless ``--strict``, which loads the config exactly as ``serve`` does."""
    found = check_config(args.file, Presence.STRICT if args.strict else Presence.LENIENT)
    for note in found.notes:
        print(f"note: {note}")
    for p in found.problems:
        print(f"error: {p}", file=sys.stderr)
    if found.config is None:
        print(f"{args.file}: {len(found.problems)} problem(s)", file=sys.stderr)
        return 1
    config = found.config
    absent = f"; {len(found.notes)} file(s) or variable(s) not present here, not checked (--strict requires them)" \
        if found.notes else ""
    print(f"{args.file}: OK ({len(config.backends)} backends, {len(config.routes)} routes){absent}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.serve import run_demo

    tune_malloc(DEFAULT_MAX_MESSAGE_BYTES)
    _install_uvloop()
    return asyncio.run(
        run_demo(
            http=HostPort.parse(args.http),
            grpc=HostPort.parse(args.grpc),
            metrics=HostPort.parse(args.metrics),
            port_file=args.port_file,
        )
    )


def cmd_reference(args: argparse.Namespace) -> int:
    from .demo.serve import run_reference

    tune_malloc(DEFAULT_MAX_MESSAGE_BYTES)
    _install_uvloop()
    return asyncio.run(
        run_reference(http=HostPort.parse(args.http), grpc=HostPort.parse(args.grpc), port_file=args.port_file,
                      metrics=HostPort.parse(args.metrics) if args.metrics else None)
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oip-gateway",
        description="A gateway for Open Inference Protocol (KServe V2) servers: Triton, OVMS, MLServer.")
    parser.add_argument("--version", action="version", version=f"oip-gateway {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,check,demo,reference}")

    serve = sub.add_parser("serve", help="run the gateway from a config file")
    serve.add_argument("--config", required=True, help="YAML config file (see docs/config.md)")
    serve.add_argument("--workers", type=int, default=None, help="processes sharing the ports (default: config)")
    serve.add_argument("--port-file", help="write the bound ports as JSON here once serving")
    serve.add_argument("--watch", action="store_true",
                       help="reload the config when the file changes (SIGHUP always reloads it)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check", help="validate a config file and exit")
    check.add_argument("file")
    check.add_argument("--strict", action="store_true",
                       help="files and environment variables the config names must exist here, as for "
                            "serve (default: those absent here are noted, e.g. a pod's mounted Secrets)")
    check.set_defaults(func=cmd_check)

    demo = sub.add_parser("demo", help="run the gateway in front of the built-in reference V2 server")
    demo.add_argument("--http", default="0.0.0.0:8000")
    demo.add_argument("--grpc", default="0.0.0.0:8001")
    demo.add_argument("--metrics", default="0.0.0.0:8002")
    demo.add_argument("--port-file", help="write the gateway's bound ports as JSON here once serving")
    demo.set_defaults(func=cmd_demo)

    ref = sub.add_parser("reference", help="run only the built-in reference V2 server (the demo's backend)")
    ref.add_argument("--http", default="127.0.0.1:0")
    ref.add_argument("--grpc", default="127.0.0.1:0")
    ref.add_argument("--metrics", default=None, help="also serve Prometheus metrics here (off by default)")
    ref.add_argument("--port-file", help="write the bound ports as JSON here once serving")
    ref.set_defaults(func=cmd_reference)

    # Started by the supervisor of --workers N; not for people (kept out of --help).
    worker = sub.add_parser("_worker")
    worker.add_argument("--config", required=True)
    worker.add_argument("--http-port", type=int)
    worker.add_argument("--grpc-port", type=int)
    worker.set_defaults(func=cmd_worker)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest != "_worker"]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    if args.command == "serve" and args.workers is not None and args.workers < 1:
        print("error: --workers must be >= 1", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
