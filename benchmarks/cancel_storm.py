"""Does the backend survive clients that drop their gRPC calls en masse? Bursts of small ModelInfer
calls, each ended abruptly with every stream still open.

    .venv/bin/python -m benchmarks.cancel_storm [--bursts 200] [--burst-ms 300] [--clients 64]
        [--workers 2] [--direct]

One Triton (add_sub), one gateway with a gRPC backend (``--workers``), or none (``--direct``). Each
burst is ``h2load -c<clients> -D<burst-ms>ms``: when it ends, h2load closes its connections with
its calls in flight, the gateway relays their cancellation to Triton (as a client talking to it
directly would). After each burst the run checks that Triton is still running; it stops at the
first burst that killed it and prints the end of Triton's log.

Why: Triton 2.51 (pytriton 0.7.0) races a cancelled inference against its completion in its gRPC
server and can segfault (triton-inference-server issues 7368, 8034). Seen in session 12: 3 times
in ~1,090 bursts through two workers with ``OIP_GATEWAY_GRPC_EVENT_ENGINE=0`` (the grpc engine
choice, gateway/grpcengine.py), never in 1,350 without — why that choice is opt-in. Session 13,
grpc's default engine: once in 73 bursts with grpc.aio's own client call (so ~1 in 1,420 over
both sessions) and once in 967 with the gateway's direct call (grpcdirect.py), which
cancels at grpc-core as grpc.aio does. Run it with and without that variable to compare. Needs
h2load (nghttp2-client).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.triton import TritonServer

from .targets import gateway_routes_config, start_gateway
from .workloads import GRPC_INFER_PATH, write_bodies

__all__ = ["main"]


def _burst(url: str, body: Path, headers: tuple[tuple[str, str], ...], clients: int, ms: int) -> str:
    cmd = ["h2load", "-t1", f"-c{clients}", "-m1", f"-D{ms}ms", "-d", str(body)]
    for k, v in headers:
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(f"http://{url}{GRPC_INFER_PATH}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=ms / 1000 + 60).stdout
    return next((line.strip() for line in out.splitlines() if "succeeded" in line), out[-200:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cancel_storm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", type=int, default=200)
    ap.add_argument("--burst-ms", type=int, default=300)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--direct", action="store_true", help="h2load straight to Triton (no gateway)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="oip-cancel-storm-"))
    body, headers = write_bodies(["grpc_small"], work)["grpc_small"]
    triton = TritonServer()
    triton.start(work / "triton")
    gw = None
    try:
        url = triton.grpc_url
        if not args.direct:
            gw, target = start_gateway(gateway_routes_config("grpc", triton.http_url, triton.grpc_url), work / "gw",
                                       "gw", args.workers)
            url = target.grpc_url
        for i in range(args.bursts):
            seen = _burst(url, body, headers, args.clients, args.burst_ms)
            assert triton.proc is not None
            if triton.proc.poll() is not None:
                print(f"burst {i}: Triton exited ({triton.proc.returncode}); {seen}")
                if triton.log_path is not None:
                    print(triton.log_path.read_text(errors="replace")[-1500:])
                return 1
            print(f"burst {i}: Triton alive; {seen}", flush=True)
        print(f"{args.bursts} bursts, Triton alive ({'direct' if args.direct else f'{args.workers} worker(s)'})")
        return 0
    finally:
        if gw is not None:
            gw.stop()
        triton.stop()


if __name__ == "__main__":
    sys.exit(main())
