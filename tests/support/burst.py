"""Bursts of large inference requests from a process of their own.

Why a process: tritonclient holds several copies of each tensor it sends and receives, so a burst
of 16 MB requests from the test process's own threads raised its peak RSS to ~3.7 GB — and a
process forked later inherits its parent's peak (``ru_maxrss`` survives fork and exec), which is
what libFuzzer holds to ``-rss_limit_mb`` (tests/unit/test_fuzz_targets.py failed at start-up).

    start(kind, url, mb=16, clients=16, count=2, hold=False) -> Burst; burst.wait(timeout) -> outcomes

``kind``: ``http`` (tritonclient, binary extension), ``json`` (plain V2 JSON both ways over
http.client, the body encoded once with orjson — tritonclient's own encoding and decoding of
~19 MB of JSON text per request took most of a burst's time: a tensor of ``mb`` MB is ~4-5 × that
as JSON text), ``grpc`` (tritonclient, identity_FP32), ``stream``
(one ModelStreamInfer per client carrying its ``count`` requests). Each outcome is ``"200"`` (answered
with the very tensor sent), ``"503"`` (refused: 503 or UNAVAILABLE), or an error's text.

``hold``: each client keeps one client object (one connection of its own: HTTP keep-alive, or a
gRPC channel outside grpc's shared subchannel pool) for all its requests and keeps it open after
the burst, until ``release()`` — the gateway's side of those connections stays up meanwhile, as
with a service that keeps its clients. Otherwise every request has a client of its own, closed
after it, and the process exits when the burst ends.
"""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import orjson

__all__ = ["Burst", "start"]


class Burst:
    def __init__(self, proc: subprocess.Popen[str], hold: bool) -> None:
        self.proc = proc
        self._line: str | None = None
        self._reader: threading.Thread | None = None
        if hold:  # its outcomes come before it exits: read as they come
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self._line = self.proc.stdout.readline()

    def running(self) -> bool:
        """Whether the burst's requests are still going (a held burst's connections stay after)."""
        if self._reader is not None:
            return self._reader.is_alive()
        return self.proc.poll() is None

    def wait(self, timeout: float = 300) -> list[str]:
        if self._reader is not None:
            self._reader.join(timeout)
            if not self._line:
                self.proc.kill()
                _, err = self.proc.communicate(timeout=30)
                raise RuntimeError(f"burst failed ({self.proc.returncode}):\n{err[-3000:]}")
            outcomes: list[str] = json.loads(self._line)
            return outcomes
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"burst failed ({self.proc.returncode}):\n{err[-3000:]}")
        outcomes = json.loads(out.strip().splitlines()[-1])
        return outcomes

    def release(self, timeout: float = 60) -> None:
        """A held burst's clients close their connections and the process exits; a burst still
        sending (a test that failed before it ended) is stopped."""
        if self.proc.poll() is not None:
            return
        if self.proc.stdin is None:
            self.proc.kill()
            self.proc.wait(30)
            return
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def start(kind: str, url: str, *, mb: int = 16, clients: int = 16, count: int = 2, hold: bool = False) -> Burst:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.burst", kind, url, str(mb), str(clients), str(count)]
                            + (["hold"] if hold else []),
                            stdin=subprocess.PIPE if hold else None, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return Burst(proc, hold)


def _held_client(kind: str, url: str) -> Any:
    """One client object with a connection of its own, kept for all of a client's requests."""
    import grpc
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tests.support.clients import LARGE_MESSAGES

    own = [("grpc.use_local_subchannel_pool", 1)]  # not the process-wide connection grpc shares
    if kind == "json":
        return _json_connection(url)
    if kind == "http":
        return httpclient.InferenceServerClient(url, network_timeout=120, connection_timeout=120)
    if kind == "grpc":
        return grpcclient.InferenceServerClient(url, channel_args=LARGE_MESSAGES + own)
    return grpc.insecure_channel(url, options=LARGE_MESSAGES + own)


def json_body(big: np.ndarray) -> bytes:
    """A V2 JSON inference request carrying ``big`` as INPUT0, asking for OUTPUT0 as JSON."""
    return orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(big.shape),
                                     "data": big.ravel()}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def _json_connection(url: str) -> http.client.HTTPConnection:
    host, port = url.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=120)


def _json_outcome(url: str, body: bytes, big: np.ndarray, held: http.client.HTTPConnection | None) -> str:
    conn = held if held is not None else _json_connection(url)
    try:
        conn.request("POST", "/v2/models/identity_FP32/infer", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        answer = r.read()
    finally:
        if held is None:
            conn.close()
    if r.status == 503:
        return "503"
    if r.status != 200:
        return f"{r.status}: {answer[:300]!r}"
    out = orjson.loads(answer)["outputs"][0]
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    return "200" if np.array_equal(got, big) else "wrong answer"


def _outcomes(kind: str, url: str, big: np.ndarray, count: int, held: Any = None, body: bytes = b"") -> list[str]:
    from tritonclient.utils import InferenceServerException

    from tests.support.clients import In, Out, infer, stream_infer

    try:
        if kind == "json":
            return [_json_outcome(url, body, big, held) for _ in range(count)]
        if kind == "stream":
            outs = stream_infer(url, big, count, channel=held)
            return ["200" if np.array_equal(o, big.ravel()) else "wrong answer" for o in outs]
        done = []
        for _ in range(count):
            r = infer(kind, url, "identity_FP32", [In("INPUT0", big, "FP32", True)], [Out("OUTPUT0", True)],
                      client=held)
            done.append("200" if np.array_equal(r.outputs["OUTPUT0"], big) else "wrong answer")
        return done
    except InferenceServerException as exc:
        return ["503" if str(exc.status()) in ("503", "StatusCode.UNAVAILABLE") else f"{exc.status()}: {exc}"]
    except Exception as exc:  # reported, not raised: the test decides
        return [f"{type(exc).__name__}: {exc}"]


def main(argv: list[str]) -> None:
    kind, url, mb, clients, count = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    hold = argv[5:] == ["hold"]
    big = np.arange(mb * 1_000_000 // 4, dtype=np.float32).reshape(1, -1)
    body = json_body(big) if kind == "json" else b""
    results: list[str] = []
    held: list[Any] = []
    lock = threading.Lock()

    def client() -> None:
        mine = _held_client(kind, url) if hold else None
        got = _outcomes(kind, url, big, count, mine, body)
        with lock:
            results.extend(got)
            if mine is not None:
                held.append(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results), flush=True)
    if hold:
        sys.stdin.readline()  # until release(): the connections stay open
        for c in held:
            c.close()


if __name__ == "__main__":
    main(sys.argv[1:])
