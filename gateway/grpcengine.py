"""grpc core's socket engine, chosen before grpc loads (process-wide, once: ``gateway/__init__``),
and the cap on its read-ahead per connection that the listener and every backend channel set
(``READ_BUFFER_OPTION``, below).

grpcio (1.6x on) runs the sockets of servers and client channels on its EventEngine — the
experiments ``event_engine_listener`` and ``event_engine_client``, on by default: a pool of
threads of its own polls the sockets and hands every event over to the thread that waits on
the completion queue (grpc.aio's poller thread), which hands it on to the event loop. With
those two experiments off, grpc's earlier engine (iomgr) polls the sockets from the thread
that waits on the completion queue itself: one hand-over less per event. Measured on this
machine through benchmarks/grpc_floor.py (a bare grpc.aio pass-through, small ModelInfer,
16 concurrent callers, 10,000 calls each way, perf stat on the process): context switches per
call 13-15 → 7-9, CPU per call 285-318 → 221-254 µs, calls per second +20-35 %. Both are
needed (each alone: about -8 %); the gateway is a server and a client of gRPC on every call.

Opt-in: ``OIP_GATEWAY_GRPC_EVENT_ENGINE=0`` turns the two experiments off; unset (or ``1``),
grpc's own default runs. Why not by default: Triton 2.51 (pytriton 0.7.0) segfaults when a gRPC
inference is cancelled as it completes (its gRPC server's race, triton-inference-server issues
7368, 8034), and with the experiments off, bursts of 64 abandoned calls through two workers
crashed it 3 times in ~1,090 bursts against 0 in 1,350 with grpc's default
(benchmarks/cancel_storm.py). A front door must not make a backend it fronts fall over more
often; with a Triton that has the fix, the CPU is worth taking.

grpc reads ``GRPC_EXPERIMENTS`` once, when its core starts — while ``grpc`` is imported — so
this must run before anything imports it (set later, it is silently not used). An explicit
``GRPC_EXPERIMENTS`` is left alone. No grpc import here.
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

__all__ = ["ENGINE_CHOSEN", "ENGINE_OFF", "READ_BUFFER_CAP", "READ_BUFFER_OPTION", "choose_grpc_engine", "grpc_engine",
           "unchosen"]

ENGINE_OFF = "-event_engine_client,-event_engine_listener"
# Set beside it: the value is the gateway's choice, not the user's (a process started from this
# one inherits both; a benchmark comparing two trees drops them so each tree chooses for itself).
ENGINE_CHOSEN = "OIP_GATEWAY_GRPC_ENGINE_CHOSEN"


# The most grpc reads ahead on one connection (a listener's and a backend channel's option alike).
# grpc sizes each connection's next read from what the last ones brought (doubling while reads
# fill it) and keeps the unused part of that read buffer allocated between reads, with no upper
# bound by default (grpc/grpc#42194). After bursts of 16 MB tensors that was tens of MB per
# connection, held until the connection closes or later traffic fills it — in use at the allocator,
# not the idle trim's to give back: a
# ModelStreamInfer burst left +22 to +73 MB on the one backend connection, and 16 clients that kept
# their connections open left +67 MB over idle 30 s later (97 MB in use at malloc against 16 idle);
# with this cap, +8 MB. CPU per 16 MB gRPC request with it: 0.98 / 0.98 / 0.68 × without at
# c=1 / 16 / 64 (benchmarks/results/2026-11-24-readcap).
READ_BUFFER_CAP = 1 << 20
# (Measured on grpcio 1.85; a grpcio without this option ignores it, as grpc does any unknown one.)
READ_BUFFER_OPTION = ("grpc.experimental.tcp_max_read_buffer_size", READ_BUFFER_CAP)


def choose_grpc_engine(environ: MutableMapping[str, str] | None = None, loaded: bool | None = None) -> bool:
    """Turn grpc's EventEngine off for listeners and channels when asked to
    (``OIP_GATEWAY_GRPC_EVENT_ENGINE=0``); return whether this call set it. ``loaded``: whether
    grpc is already imported (then nothing is set: it would not be read)."""
    env = os.environ if environ is None else environ
    if loaded is None:
        loaded = "grpc" in sys.modules
    if loaded or "GRPC_EXPERIMENTS" in env or env.get("OIP_GATEWAY_GRPC_EVENT_ENGINE", "1") != "0":
        return False
    env["GRPC_EXPERIMENTS"] = ENGINE_OFF
    env[ENGINE_CHOSEN] = "1"
    return True


def unchosen(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the gateway's own choice (an explicit one stays)."""
    if environ.get(ENGINE_CHOSEN) == "1":
        return {k: v for k, v in environ.items() if k not in (ENGINE_CHOSEN, "GRPC_EXPERIMENTS")}
    return environ


def grpc_engine(environ: MutableMapping[str, str] | None = None) -> str:
    """What the start-up log says of it."""
    env = os.environ if environ is None else environ
    value = env.get("GRPC_EXPERIMENTS")
    if value == ENGINE_OFF:
        return "grpc sockets polled by its completion queue (EventEngine off for listeners and channels)"
    if value is None:
        return "grpc's default socket engine (EventEngine)"
    return f"grpc experiments as set: GRPC_EXPERIMENTS={value}"
