"""Why the gateway has an HTTP/1.1 client of its own: its CPU per request against aiohttp's.

    .venv/bin/python -m benchmarks.h1client [--bodies small,1m] [--concurrency 1,16]
        [--requests 2000] [--rounds 3] [--out DIR]

The backends speak HTTP/1.1 through ``gateway.backends.h1`` (asyncio protocols over
httptools), hand-written where the stack's first choice would be aiohttp. Hand-written protocol
code has to pay for itself; this is the measurement that says whether it still does (issue 13:
"keep a microbenchmark in benchmarks/ that justifies it against the library it replaces").

What is measured: the CPU of *this* process (user + system, ``time.process_time``) per request
while one client sends ``--requests`` POSTs of an inference body to a canned backend and reads
each answer whole, ``--concurrency`` at a time over keep-alive connections (as many as the
concurrency, for both). The backend (benchmarks/inproc.py's canned Triton: add_sub's JSON answer
for ``small``, a binary-extension answer of the request's size for ``1m``) runs in a process of
its own, so its CPU is not counted. Both clients run on the same uvloop loop; each round runs
them in alternating order, and the table gives the median over rounds.

- ``gateway``: ``H1ConnectionPool.request`` (answers read whole, as the backends read small ones).
- ``aiohttp``: one ``ClientSession`` (``TCPConnector(limit=concurrency)``), ``session.post`` and
  ``await response.read()`` — aiohttp's C parser when it is installed with it (the wheels are).

Every answer's status and length are checked: a client that read less would be cheaper.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from gateway.backends.h1 import H1ConnectionPool

from .inproc import Backend, _answer, _request_body

__all__ = ["main", "measure"]

CLIENTS = ("gateway", "aiohttp")
BODIES = ("small", "1m")
_PATH = {"small": "/v2/models/add_sub/infer", "1m": "/v2/models/identity_UINT8/infer"}


def _headers(raw: bytes) -> dict[str, str]:
    """benchmarks/inproc.py's request header lines → a dict."""
    out = {}
    for line in raw.decode("latin-1").split("\r\n"):
        if line:
            name, value = line.split(":", 1)
            out[name.strip()] = value.strip()
    return out


# -- the backend, in a process of its own ------------------------------------------------------
async def _serve(body: str, port_file: Path) -> None:
    loop = asyncio.get_running_loop()
    answer = _answer(body)
    server = await loop.create_server(lambda: Backend(answer), "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()  # until terminated


def _start_backend(body: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = workdir / f"backend-{body}.port"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.h1client", "--serve", body,
                             "--port-file", str(port_file)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"the canned backend exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the canned backend did not start within 30 s")


# -- the clients ---------------------------------------------------------------------------------
async def _drive(one: Any, requests: int, concurrency: int) -> tuple[float, float]:
    """``requests`` calls of ``one()``, ``concurrency`` at a time: (CPU s, wall s)."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - cpu, time.perf_counter() - wall


def _check(status: int, got: int, want: int, client: str) -> None:
    if status != 200 or got != want:
        raise SystemExit(f"{client}: answer {status} with {got} bytes, expected 200 with {want}")


async def _run_gateway(port: int, body: str, requests: int, concurrency: int) -> tuple[float, float]:
    data, raw = _request_body(body)
    headers, path, want = _headers(raw), _PATH[body], len(_answer(body).split(b"\r\n\r\n", 1)[1])
    pool = H1ConnectionPool("127.0.0.1", port, connect_timeout=5.0, max_connections=concurrency)

    async def one() -> None:
        r = await pool.request("POST", path, body=data, headers=headers, timeout=60.0)
        assert not hasattr(r.body, "__aiter__")
        _check(r.status, len(r.body), want, "gateway")  # type: ignore[arg-type]

    try:
        await _drive(one, concurrency * 4, concurrency)  # connections open, caches warm
        return await _drive(one, requests, concurrency)
    finally:
        pool.close()


async def _run_aiohttp(port: int, body: str, requests: int, concurrency: int) -> tuple[float, float]:
    data, raw = _request_body(body)
    headers, want = _headers(raw), len(_answer(body).split(b"\r\n\r\n", 1)[1])
    url = f"http://127.0.0.1:{port}{_PATH[body]}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one() -> None:
            async with session.post(url, data=data, headers=headers) as r:
                answer = await r.read()
                _check(r.status, len(answer), want, "aiohttp")

        await _drive(one, concurrency * 4, concurrency)
        return await _drive(one, requests, concurrency)


_RUN = {"gateway": _run_gateway, "aiohttp": _run_aiohttp}


async def measure(bodies: list[str], concurrency: list[int], requests: int, rounds: int,
                  workdir: Path) -> list[dict[str, Any]]:
    """One row per (body, concurrency, client): CPU µs per request (median of ``rounds``),
    each round's value, and requests per second."""
    rows = []
    for body in bodies:
        proc, port = _start_backend(body, workdir)
        try:
            n = requests if body == "small" else max(50, requests // 10)
            for c in concurrency:
                cpu: dict[str, list[float]] = {k: [] for k in CLIENTS}
                rate: dict[str, list[float]] = {k: [] for k in CLIENTS}
                for r in range(rounds):
                    order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
                    for client in order:
                        spent, wall = await _RUN[client](port, body, n, c)
                        cpu[client].append(spent / n * 1e6)
                        rate[client].append(n / wall)
                        print(f"  {body:>5} c={c:<3} round {r} {client:<8} {cpu[client][-1]:8.1f} µs CPU/req "
                              f"{rate[client][-1]:8.0f} req/s", flush=True)
                for client in CLIENTS:
                    rows.append({"body": body, "concurrency": c, "client": client, "requests": n,
                                 "cpu_us": statistics.median(cpu[client]), "rounds_us": cpu[client],
                                 "req_s": statistics.median(rate[client])})
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| body | c | gateway µs/req | aiohttp µs/req | gateway ÷ aiohttp | gateway req/s | aiohttp req/s |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    by = {(r["body"], r["concurrency"], r["client"]): r for r in rows}
    for body, c in dict.fromkeys((r["body"], r["concurrency"]) for r in rows):
        g, a = by[(body, c, "gateway")], by[(body, c, "aiohttp")]
        lines.append(f"| {body} | {c} | {g['cpu_us']:.1f} | {a['cpu_us']:.1f} | {g['cpu_us'] / a['cpu_us']:.2f} | "
                     f"{g['req_s']:.0f} | {a['req_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bodies", default=",".join(BODIES), help="comma list of: small, 1m")
    parser.add_argument("--concurrency", default="1,16", help="comma list (default 1,16)")
    parser.add_argument("--requests", type=int, default=2000, help="per measurement (1m: a tenth, at least 50)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write results.json and results.md here")
    parser.add_argument("--serve", choices=BODIES, help=argparse.SUPPRESS)  # the backend process
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        assert args.port_file is not None
        uvloop.run(_serve(args.serve, args.port_file))
        return
    bodies = [b for b in args.bodies.split(",") if b]
    if not set(bodies) <= set(BODIES):
        parser.error(f"--bodies: one of {', '.join(BODIES)}")
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="h1client-") as tmp:
        rows = uvloop.run(measure(bodies, concurrency, args.requests, args.rounds, Path(tmp)))
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        env = {"python": platform.python_version(), "aiohttp": aiohttp.__version__, "cpus": os.cpu_count(),
               "requests": args.requests, "rounds": args.rounds}
        (args.out / "results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        (args.out / "results.md").write_text(
            f"CPU of the client process per request, median of {args.rounds} alternating rounds "
            f"(python -m benchmarks.h1client; {env}).\n\n{text}\n")


if __name__ == "__main__":
    main()
