"""``balance: least_request`` through a real gateway: with one endpoint busy on a slow
request, new requests go to the idle endpoint instead of queueing behind it (round robin
would send every other one there)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from tests.support.clients import In, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for


@pytest.fixture
def slow_backend():
    """A healthy HTTP endpoint (health and readiness GETs answer 200 at once) whose
    inference answers wait until ``release`` is set; ``posts`` counts inference requests."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    release = threading.Event()
    posts: list[int] = []

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                if head.startswith(b"POST"):
                    posts.append(1)
                    release.wait(30)
                    body = b'{"model_name":"add_sub","outputs":[]}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", release, posts
    release.set()
    sock.close()


def _ready(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as r:
        return r.status == 200


def test_least_request_avoids_the_busy_endpoint(reference, slow_backend, tmp_path):
    slow, release, posts = slow_backend
    backends = {"pool": {"protocol": "http", "endpoints": [slow, reference.http_url], "balance": "least_request"}}
    # One health round at start-up, then none during the test: a probe in flight would
    # count as load on its endpoint.
    cfg = gateway_config(backends, [{"model": "add_sub", "backend": "pool"}], health={"interval_s": 60, "timeout_s": 2})
    with GatewayProcess(cfg, tmp_path, "gw-lr") as g:
        wait_for(lambda: _ready(g.http_url), timeout=10, what="the first health round")
        a = np.arange(4, dtype=np.float32)
        ins = [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")]
        # Ties go in round-robin order, so the first request goes to the slow endpoint and stays there.
        held = threading.Thread(target=lambda: infer("http", g.http_url, "add_sub", ins))
        held.start()
        try:
            wait_for(lambda: len(posts) == 1, timeout=10, what="the first request to reach the slow endpoint")
            for _ in range(6):
                r = infer("http", g.http_url, "add_sub", ins)
                np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
            assert len(posts) == 1  # none of the six went to the busy endpoint
        finally:
            release.set()
            held.join(timeout=30)
