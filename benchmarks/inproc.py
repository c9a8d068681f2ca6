"""The gateway's own CPU per small HTTP inference, measured in one process.

    python -m benchmarks.inproc [--requests 4000] [--batches 8] [--concurrency 1] [--profile]

A real gateway (``gateway.server.Gateway``, its real listener, backends and health checks),
a canned HTTP/1.1 backend and a keep-alive client all run on one uvloop event loop over
loopback sockets. The client's and the backend's cost is measured alone in the same run
(the client against the backend directly), so

    gateway µs per request = (CPU through the gateway − CPU direct) / requests

is the gateway's Python and its system calls, without what the load benchmark also
counts: another process's cache and branch state on a shared core (there each µs of
Python costs ~2.5 µs; docs/design-notes.md, "Inference from callbacks"). It moves in
the same direction as the load benchmark's small-HTTP cell, with far less noise: a change
on the callback path can be judged in seconds. Best of ``--batches`` batches.

``--profile``: cProfile of the batches through the gateway, top functions by own time.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import resource
import time
from typing import Any

import orjson
import uvloop

from gateway.config.loader import parse_config
from gateway.malloc import tune_malloc
from gateway.server import Gateway

from .workloads import MiB, _binary, _json_fp32, _json_small

__all__ = ["main"]

# What Triton answers to add_sub's small request (its size and headers).
SMALL_ANSWER = (b'{"id":"bench","model_name":"add_sub","model_version":"1","outputs":[{"name":"OUTPUT0",'
                b'"datatype":"FP32","shape":[16],"data":[0.25,0.75,1.25,1.75,2.25,2.75,3.25,3.75,4.25,'
                b'4.75,5.25,5.75,6.25,6.75,7.25,7.75]},{"name":"OUTPUT1","datatype":"FP32","shape":[16],'
                b'"data":[-0.25,0.25,0.75,1.25,1.75,2.25,2.75,3.25,3.75,4.25,4.75,5.25,5.75,6.25,6.75,7.25]}]}')
READY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
NO_INDEX = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
BODIES = ("small", "1m", "16m", "json1m", "json1mb")
# All-JSON FP32 bodies (identity_FP32, workloads._json_fp32), tensor bytes → JSON bytes:
# json1m is the load benchmark's http_json_to_grpc_1m body (1 MiB of FP32: 1,284,620 bytes of
# JSON, over h1sizes.DEFER_MAX / infer._LARGE, so streamed in from the socket); json1mb is
# 816,000 bytes of FP32, 999,720 bytes of JSON (under DEFER_MAX: held whole, then served).
JSON_BODIES = {"json1m": MiB, "json1mb": 816_000}
MAX_MESSAGE_BYTES = 64 << 20


def _answer(body: str) -> bytes:
    """The canned backend's answer to an inference: add_sub's, or (binary extension) an
    identity model's answer of the request's size, as Triton sends it."""
    if body == "small":
        head, data, ctype = SMALL_ANSWER, b"", b"application/json"
    elif body in JSON_BODIES:
        # identity_FP32's JSON answer, as Triton gives it: the input's values back as JSON.
        request = orjson.loads(_json_fp32(JSON_BODIES[body]))["inputs"][0]
        head = orjson.dumps({"model_name": "identity_FP32", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": request["shape"], "data": request["data"]}]})
        data, ctype = b"", b"application/json"
    else:
        size = (1 if body == "1m" else 16) << 20
        head = orjson.dumps({"model_name": "identity_UINT8", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "UINT8", "shape": [1, size], "parameters": {"binary_data_size": size}}]})
        data, ctype = bytes(size), b"application/octet-stream\r\nInference-Header-Content-Length: %d" % len(head)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (ctype, len(head) + len(data))) + head + data


def _request_body(body: str) -> tuple[bytes, bytes]:
    if body == "small":
        return _json_small(), b"Content-Type: application/json\r\n"
    if body in JSON_BODIES:
        return _json_fp32(JSON_BODIES[body]), b"Content-Type: application/json\r\n"
    data, hlen = _binary((1 if body == "1m" else 16) << 20)
    return data, b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %d\r\n" % hlen


class _Messages:
    """Counts HTTP/1.1 messages in a byte stream without keeping their bodies: ``feed``
    returns the heads of the messages completed by ``data``."""

    def __init__(self) -> None:
        self.head = b""
        self.left = -1  # body bytes still to come; -1: in a head

    def feed(self, data: bytes) -> list[bytes]:
        done = []
        view = memoryview(data)
        while len(view):
            if self.left < 0:
                buf = self.head + bytes(view[:65536])
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    self.head = buf
                    return done
                head, used = buf[:end], end + 4 - len(self.head)
                view = view[used:]
                self.head = b""
                at = head.lower().find(b"\r\ncontent-length:")
                self.left = int(head[at + 17:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                self.current = head
            take = min(self.left, len(view))
            view = view[take:]
            self.left -= take
            if self.left == 0:
                done.append(self.current)
                self.left = -1
        return done


class Backend(asyncio.Protocol):
    """Answers each request on a keep-alive connection once it has all come: GETs (probes)
    200, the repository index 404 (the checker then asks per model), inferences ``answer``."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.messages = _Messages()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for head in self.messages.feed(data):
            if head.startswith(b"GET"):
                self.transport.write(READY)
            elif b"/repository/index" in head[:80]:
                self.transport.write(NO_INDEX)
            else:
                self.transport.write(self.answer)


class Client(asyncio.Protocol):
    """Sends its request, waits for the whole answer, sends again, until ``left`` runs out."""

    def __init__(self, request: bytes, state: dict[str, Any]) -> None:
        self.request = request
        self.state = state
        self.messages = _Messages()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self) -> None:
        if self.state["left"] <= 0:
            self.state["idle"] += 1
            if self.state["idle"] == self.state["clients"]:
                self.state["done"].set_result(None)
            return
        self.state["left"] -= 1
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        for head in self.messages.feed(data):
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"answer not 200: {head[:300]!r}")
            self.send()


async def _run(port: int, request: bytes, requests: int, concurrency: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"left": requests, "idle": 0, "clients": concurrency, "done": loop.create_future()}
    clients = []
    for _ in range(concurrency):
        _, proto = await loop.create_connection(lambda: Client(request, state), "127.0.0.1", port)
        clients.append(proto)
    before, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    for c in clients:
        c.send()
    await state["done"]
    after, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time() - cpu
    # The total from the precise clock, split as the (coarser) rusage splits it.
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    share = user / (user + system) if user + system else 1.0
    spent = (cpu * share, cpu * (1 - share))
    for c in clients:
        c.transport.close()
    return spent


async def measure(requests: int, batches: int, concurrency: int, profile: bool,
                  body: str = "small", only: str | None = None) -> dict[str, float]:
    """``only``: "via" or "direct" runs just those batches, after a fixed warm-up of 50 requests
    (benchmarks/instructions.py counts the instructions of one side at two request counts)."""
    loop = asyncio.get_running_loop()
    answer = _answer(body)
    server = await loop.create_server(lambda: Backend(answer), "127.0.0.1", 0)
    backend_port = server.sockets[0].getsockname()[1]
    config = parse_config({
        "listen": {"http": "127.0.0.1:0", "grpc": None, "metrics": None},
        "backends": {"triton": {"protocol": "http", "endpoints": [f"127.0.0.1:{backend_port}"], "timeout_s": 300}},
        "routes": [{"model": "add_sub", "backend": "triton"}, {"model": "identity_UINT8", "backend": "triton"},
                   {"model": "identity_FP32", "backend": "triton"}],
        "max_message_bytes": MAX_MESSAGE_BYTES,
        "health": {"interval_s": 5.0, "timeout_s": 2.0},
    })
    gateway = Gateway(config)
    ports = await gateway.start()
    assert ports.http is not None
    data, headers = _request_body(body)
    model = b"add_sub" if body == "small" else b"identity_FP32" if body in JSON_BODIES else b"identity_UINT8"

    def request(host: str) -> bytes:
        return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n"
                % (model, host.encode(), headers, len(data))) + data

    via = request(f"127.0.0.1:{ports.http}")
    direct = request(f"127.0.0.1:{backend_port}")
    # Warm: connections, caches, metric children.
    await _run(ports.http, via, max(4, requests // 20) if only is None else 50, concurrency)
    if only is not None:
        # Counted runs: a full collection of the start-up heap (~10^5 objects) would land in one
        # run and not the other depending on allocation counts — millions of instructions that
        # are not per request. The heap so far is frozen out of the collector; the young
        # generations are still collected as the requests allocate.
        gc.collect()
        gc.freeze()
    best_via = best_direct = (float("inf"), 0.0)
    profiler = cProfile.Profile() if profile else None
    for _ in range(batches):
        if only != "via":
            best_direct = min(best_direct, await _run(backend_port, direct, requests, concurrency), key=sum)
        if only == "direct":
            continue
        if profiler is not None:
            profiler.enable()
        best_via = min(best_via, await _run(ports.http, via, requests, concurrency), key=sum)
        if profiler is not None:
            profiler.disable()
    await gateway.stop()
    server.close()
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    per = 1e6 / requests
    return {"direct_us": sum(best_direct) * per, "via_us": sum(best_via) * per,
            "gateway_us": (sum(best_via) - sum(best_direct)) * per,
            "gateway_user_us": (best_via[0] - best_direct[0]) * per,
            "gateway_sys_us": (best_via[1] - best_direct[1]) * per}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--body", choices=BODIES, default="small",
                        help="small: add_sub's JSON request; 1m / 16m: a binary-extension request and answer "
                             "of that size (an identity model); json1m: the load benchmark's 1 MiB FP32 JSON "
                             "request (1,284,620 bytes, identity_FP32) and its JSON answer; json1mb: the same "
                             "under 1 MiB of JSON (999,720 bytes: the whole-body path)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", choices=("via", "direct"),
                        help="run only the batches through the gateway (or only those direct), after a fixed "
                             "warm-up (benchmarks/instructions.py)")
    args = parser.parse_args(argv)
    # The allocator as `oip-gateway serve` sets it up (gateway/malloc.py): without it each large
    # body's buffers are fresh pages the kernel faults in, which the gateway never pays.
    tune_malloc(MAX_MESSAGE_BYTES)
    result = uvloop.run(measure(args.requests, args.batches, args.concurrency, args.profile, args.body, args.only))
    print(f"{args.body} c={args.concurrency}: direct {result['direct_us']:.1f} µs/req (client + backend), "
          f"through the gateway {result['via_us']:.1f}: gateway {result['gateway_us']:.1f} µs per request "
          f"(user {result['gateway_user_us']:.1f}, system {result['gateway_sys_us']:.1f})")


if __name__ == "__main__":
    main()
