"""Bursts of large inference requests from a process of their own.

Why a process: tritonclient holds several copies of each tensor it sends and receives, so a burst
of 16 MB requests from the test process's own threads raised its peak RSS to ~3.7 GB — and a
process forked later inherits its parent's peak (``ru_maxrss`` survives fork and exec), which is
what libFuzzer holds to ``-rss_limit_mb`` (tests/unit/test_fuzz_targets.py failed at start-up).

    start(kind, url, mb=16, clients=16, count=2) -> Burst; burst.wait(timeout) -> outcomes

``kind``: ``http`` / ``grpc`` (tritonclient, identity_FP32), ``stream`` (one ModelStreamInfer per
client carrying its ``count`` requests). Each outcome is ``"200"`` (answered with the very tensor
sent), ``"503"`` (refused: 503 or UNAVAILABLE), or an error's text.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np

__all__ = ["Burst", "start"]


class Burst:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 300) -> list[str]:
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"burst failed ({self.proc.returncode}):\n{err[-3000:]}")
        outcomes: list[str] = json.loads(out.strip().splitlines()[-1])
        return outcomes


def start(kind: str, url: str, *, mb: int = 16, clients: int = 16, count: int = 2) -> Burst:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.burst", kind, url, str(mb), str(clients), str(count)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Burst(proc)


def _outcomes(kind: str, url: str, big: np.ndarray, count: int) -> list[str]:
    from tritonclient.utils import InferenceServerException

    from tests.support.clients import In, Out, infer, stream_infer

    try:
        if kind == "stream":
            outs = stream_infer(url, big, count)
            return ["200" if np.array_equal(o, big.ravel()) else "wrong answer" for o in outs]
        done = []
        for _ in range(count):
            r = infer(kind, url, "identity_FP32", [In("INPUT0", big, "FP32")], [Out("OUTPUT0")])
            done.append("200" if np.array_equal(r.outputs["OUTPUT0"], big) else "wrong answer")
        return done
    except InferenceServerException as exc:
        return ["503" if str(exc.status()) in ("503", "StatusCode.UNAVAILABLE") else f"{exc.status()}: {exc}"]
    except Exception as exc:  # reported, not raised: the test decides
        return [f"{type(exc).__name__}: {exc}"]


def main(argv: list[str]) -> None:
    kind, url, mb, clients, count = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    big = np.arange(mb * 1_000_000 // 4, dtype=np.float32).reshape(1, -1)
    results: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        got = _outcomes(kind, url, big, count)
        with lock:
            results.extend(got)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
