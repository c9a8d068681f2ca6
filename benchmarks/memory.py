"""Memory after a burst: the gateway's RSS idle, at the peak of a burst of large requests,
and 2 / 5 / 10 / 30 s after it ended — with the idle trim (gateway/malloc.py) on and off, and with
the clients keeping their connections open after the burst (grpc's read-ahead on each connection
stays allocated while it is open: gateway/grpcengine.py caps it).

    .venv/bin/python -m benchmarks.memory [--clients 6] [--requests 3] [--mb 8] [--workers 1]
        [--json-mb 4] [--kinds http,json,grpc,stream]

One Triton (identity_FP32), one gateway per kind and mode with a gRPC backend; the burst is
``--clients`` clients at once, ``--requests`` requests of ``--mb`` MB each way each, sent as
``http``: HTTP binary-extension requests (converted to gRPC: the path that holds the most
copies), ``json``: plain V2 JSON both ways (converted; ``--json-mb``, default 4: a 4 MB tensor is
~19 MB of JSON text, parsed into Python numbers), ``grpc``: ModelInfer (passed through),
``stream``: one ModelStreamInfer per client carrying its requests; from a process of their own
(tests/support/burst.py). RSS is the gateway's process tree (supervisor + workers), sampled every
50 ms during the burst. Writes
benchmarks/results/<date>-memory/results.md and results.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.procstat import rss_bytes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import burst  # noqa: E402
from tests.support.clients import In, Out, infer, stream_infer  # noqa: E402
from tests.support.gateway import GatewayProcess, gateway_config  # noqa: E402
from tests.support.triton import TritonServer  # noqa: E402

MB = 1_000_000
AFTER = (2, 5, 10, 30)


KINDS = {"http": "HTTP binary → gRPC backend", "json": "HTTP JSON → gRPC backend",
          "grpc": "gRPC ModelInfer", "stream": "gRPC ModelStreamInfer"}


def _send(kind: str, url: str, tensor: np.ndarray, count: int) -> None:
    if kind == "stream":
        stream_infer(url, tensor, count)
        return
    binary = kind != "json"
    for _ in range(count):
        infer("http" if kind == "json" else kind, url, "identity_FP32", [In("INPUT0", tensor, "FP32", binary)],
              [Out("OUTPUT0", binary)])


# (name, environment, clients keep their connections open after the burst)
MODES = (("trim on (default)", {}, False), ("trim on, clients keep their connections", {}, True),
         ("trim off", {"OIP_GATEWAY_MALLOC_TRIM": "0"}, False))


def run_mode(kind: str, name: str, env: dict[str, str], held: bool, triton: TritonServer, args: argparse.Namespace,
             workdir: Path) -> dict:
    backends = {"t": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    cfg = gateway_config(backends, [{"model": "identity_FP32", "backend": "t"}])
    gw = GatewayProcess(cfg, workdir, f"gw-{kind}-{len(env)}-{int(held)}", workers=args.workers, env=env).start()
    try:
        assert gw.proc is not None
        pid = gw.proc.pid
        url = gw.http_url if kind in ("http", "json") else gw.grpc_url
        small = np.ones((1, 16), dtype=np.float32)
        for _ in range(25):
            _send(kind, url, small, 2)
        time.sleep(1.0)
        idle = rss_bytes(pid)
        peak = idle
        start = time.monotonic()
        # The clients run in a process of their own (tests/support/burst.py): each with one
        # connection it keeps for the rest of the run when ``held``.
        mb = args.json_mb if kind == "json" else args.mb
        load = burst.start(kind, url, mb=mb, clients=args.clients, count=args.requests, hold=held)
        try:
            while load.running() and time.monotonic() - start < 300:
                peak = max(peak, rss_bytes(pid))
                time.sleep(0.05)
            outcomes = load.wait(timeout=60)
            burst_s = time.monotonic() - start
            end = time.monotonic()
            after = {}
            for t in AFTER:
                time.sleep(max(0.0, end + t - time.monotonic()))
                after[t] = rss_bytes(pid)
        finally:
            load.release()
        answered = sum(o == "200" for o in outcomes)
        return {"kind": kind, "mode": name, "idle": idle, "peak": peak, "after": after, "burst_s": burst_s,
                "answered": answered, "sent": args.clients * args.requests}
    finally:
        gw.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--json-mb", type=int, default=4, help="tensor MB of the json kind (its JSON text is ~4.8 ×)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS), help="comma list of: " + ", ".join(KINDS))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    date = datetime.date.today().isoformat()
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{date}-memory")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    triton = TritonServer(startup_models=["identity_FP32"]).start(work / "triton")
    try:
        rows = [run_mode(kind, name, env, held, triton, args, work) for kind in args.kinds.split(",")
                for name, env, held in MODES]
    finally:
        triton.stop()
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))
    lines = [f"# Gateway RSS after a burst ({date})", "",
             f"{args.clients} clients × {args.requests} requests of {args.mb} MB each way ({args.json_mb} MB tensors "
             f"as JSON; identity_FP32 on a gRPC backend), gateway with {args.workers} worker(s); RSS of its process "
             "tree in MB.", "",
             "| requests | mode | idle | peak | " + " | ".join(f"+{t} s" for t in AFTER) + " | burst s | answered |",
             "|---|---|--:|--:|" + "--:|" * len(AFTER) + "--:|--:|"]
    for r in rows:
        lines.append(f"| {KINDS[r['kind']]} | {r['mode']} | {r['idle'] / MB:.0f} | {r['peak'] / MB:.0f} | "
                     + " | ".join(f"{r['after'][t] / MB:.0f}" for t in AFTER)
                     + f" | {r['burst_s']:.1f} | {r['answered']} / {r['sent']} |")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
