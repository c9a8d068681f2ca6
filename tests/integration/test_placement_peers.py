"""Placement's peers port and its followers, hostile cases, with real gateway processes and no
Triton: the placement pool's endpoint is the reference server (``add_sub`` is ready there, so a
decider answers for it without a load; any other model's load is refused by it — it has no
model control).

- A decider (``listen.peers`` set): its peers API refuses hostile input cleanly — unknown or
  non-placement backends, odd ``copies``, huge and oddly quoted model names, wrong methods, a 1 MB
  body, garbage HTTP on a raw socket — and keeps serving.
- A follower (top-level ``peers`` naming a peer that misbehaves, no ``listen.peers`` of its own):
  its client gets a clear 502 / 503 naming the peer, never a hang, and its other routes keep
  working.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import GatewayProcess, ReferenceServer, gateway_config
from tests.support.procs import wait_for

API = "/placement/v1/backends/{backend}/models/{model}"


# ------------------------------------------------------------------------------------------ helpers


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def place(port: int, backend: str, model: str, query: str = "", **kw: Any) -> tuple[int, dict[str, str], bytes]:
    return request(port, "POST", API.format(backend=backend, model=model) + query, **kw)


def raw(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send ``payload`` on a fresh connection, end the sending side, read until the server closes
    (or answers and waits): whatever comes back within ``timeout``. A hang fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # (the server may close while we still send)
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                pytest.fail(f"no answer and no close within {timeout} s after {payload[:60]!r}")
            if not chunk:
                break
            got += chunk
        return got


class Peer:
    """A peer of our own on a raw socket: reads a request head and answers ``answer`` (None:
    closes at once, before reading anything)."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.asked = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                if self.answer is None:
                    return
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.asked += 1
                conn.sendall(self.answer)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def closed_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def backends(ref: ReferenceServer, load_timeout_s: float = 2) -> dict[str, Any]:
    return {
        "pool": {"protocol": "http", "endpoints": [ref.http_url],
                 "placement": {"capacity_models": 4, "load_timeout_s": load_timeout_s}},
        "plain": {"protocol": "http", "endpoints": [ref.http_url]},
    }


ROUTES = [{"model": "add_sub", "backend": "pool"}, {"model": "string_reverse", "backend": "plain"},
          {"model": "*", "backend": "pool"}]


@contextlib.contextmanager
def gateway(workdir: Path, name: str, ref: ReferenceServer, *, listen_peers: bool = False,
            peers: list[str] | None = None, load_timeout_s: float = 2) -> Iterator[GatewayProcess]:
    cfg = gateway_config(backends(ref, load_timeout_s), ROUTES, **({"peers": peers} if peers else {}))
    if listen_peers:
        cfg["listen"]["peers"] = "127.0.0.1:0"
    with GatewayProcess(cfg, workdir, name) as gw:
        port = gw.ports["http"]
        # Ready: add_sub checked ready on the pool's endpoint (and the server up).
        wait_for(lambda: request(port, "GET", "/v2/models/add_sub/ready", timeout=2)[0] == 200, timeout=30,
                 what=f"{name}: add_sub ready")
        yield gw


def serves(gw: GatewayProcess) -> None:
    """The gateway still answers its other routes: add_sub through the placement pool, string_reverse
    through the plain backend, and is alive."""
    assert gw.proc is not None and gw.proc.poll() is None, gw.log_tail()
    port = gw.ports["http"]
    for model in ("add_sub", "string_reverse"):
        status, _, body = request(port, "GET", f"/v2/models/{model}", timeout=5)
        assert status == 200 and json.loads(body)["name"] == model, (model, status, body)
    status, _, body = request(port, "POST", "/v2/models/add_sub/infer", json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0] * 4},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [2.0] * 4},
    ]}).encode(), {"content-type": "application/json"}, timeout=5)
    assert status == 200 and json.loads(body)["outputs"], (status, body)


def infer_unplaced(gw: GatewayProcess, model: str, timeout: float = 15) -> tuple[int, dict[str, str], bytes, float]:
    """An inference for ``model``, which no endpoint has: the follower asks its peer to place it."""
    start = time.monotonic()
    status, headers, body = request(gw.ports["http"], "POST", f"/v2/models/{model}/infer",
                                    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}',
                                    {"content-type": "application/json"}, timeout=timeout)
    return status, headers, body, time.monotonic() - start


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("placement-peers")


@pytest.fixture(scope="module")
def decider(workdir: Path, reference: ReferenceServer) -> Iterator[GatewayProcess]:
    with gateway(workdir, "decider", reference, listen_peers=True) as gw:
        yield gw


def peers_port(gw: GatewayProcess) -> int:
    port = gw.ports.get("peers")
    assert isinstance(port, int) and port > 0, gw.ports
    return port


# ------------------------------------------------------------------------------------------ the decider


def test_port_file_names_the_peers_port(decider: GatewayProcess, reference: ReferenceServer):
    port = peers_port(decider)
    assert port not in (decider.ports["http"], decider.ports["grpc"], decider.ports["metrics"])
    # A ready model: answered from the index, no load.
    status, headers, body = place(port, "pool", "add_sub")
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    assert json.loads(body) == {"endpoints": [reference.http_url]}


@pytest.mark.parametrize("backend", ["nope", "plain", "%2e%2e", "pool%00", "x" * 2000])
def test_unknown_and_non_placement_backends_are_404_json(decider: GatewayProcess, backend: str):
    status, _, body = place(peers_port(decider), backend, "add_sub")
    assert status == 404, (status, body)
    doc = json.loads(body)
    assert doc["code"] == "NOT_FOUND" and doc["kind"] == "ModelNotFound" and "no placement pool" in doc["error"]


@pytest.mark.parametrize("query", ["?copies=abc", "?copies=", "?copies=-1", "?copies=0", "?copies=1.5",
                                   "?copies=99999999999", "?copies=1&copies=2", "?copies", "?other=1",
                                   "?copies=%20", "?%ff=%ff"])
def test_odd_copies_fall_back_to_the_default(decider: GatewayProcess, reference: ReferenceServer, query: str):
    status, _, body = place(peers_port(decider), "pool", "add_sub", query)
    assert status == 200, (query, status, body)
    assert json.loads(body) == {"endpoints": [reference.http_url]}


@pytest.mark.parametrize("query", ["?copies=%C2%B2", "?copies=" + "9" * 5000])
def test_copies_that_isdigit_but_int_refuses_fall_back_to_the_default(decider: GatewayProcess, query: str):
    status, _, body = place(peers_port(decider), "pool", "add_sub", query)
    assert status == 200, (status, body)


@pytest.mark.parametrize("model", [
    "x" * 8000,  # over limits.max_name_length
    "%2F", "..%2F..%2Fetc%2Fpasswd", "a%20b", "%C3%BC%E2%82%AC", "%FF%FE", "a%00b", "%25", "%", "%zz",
    "'%22;--", "a%0D%0AX-Injected:%201", "%E2%80%AE", ".", "..",
])
def test_odd_model_names_get_a_clean_answer(decider: GatewayProcess, model: str):
    status, headers, body = place(peers_port(decider), "pool", model)
    assert status in (200, 400, 404, 414, 431, 503), (status, body[:300])
    assert "x-injected" not in headers
    if headers.get("content-type") == "application/json":
        doc = json.loads(body)
        assert "endpoints" in doc or ("error" in doc and "code" in doc), doc
    status, _, _ = place(peers_port(decider), "pool", "add_sub")
    assert status == 200


def test_a_very_long_request_line_is_refused_and_the_port_keeps_serving(decider: GatewayProcess):
    port = peers_port(decider)
    got = raw(port, b"POST " + API.format(backend="pool", model="x" * 300_000).encode() + b" HTTP/1.1\r\n"
              b"Host: x\r\nContent-Length: 0\r\n\r\n")
    assert got == b"" or got.startswith(b"HTTP/1.1 4"), got[:200]
    assert place(port, "pool", "add_sub")[0] == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_wrong_method_is_405(decider: GatewayProcess, method: str):
    status, headers, _ = request(peers_port(decider), method, API.format(backend="pool", model="add_sub"))
    assert status == 405 and "POST" in headers.get("allow", "")


@pytest.mark.parametrize("path", ["/", "/placement/v1/backends/pool", "/placement/v1/backends/pool/models/",
                                  "/v2/models/add_sub/infer", "/metrics",
                                  "/placement/v1/backends/pool/models/add_sub/extra"])
def test_other_paths_are_404(decider: GatewayProcess, path: str):
    assert request(peers_port(decider), "POST", path)[0] == 404


def test_a_1mb_body_is_ignored_and_the_port_keeps_serving(decider: GatewayProcess, reference: ReferenceServer):
    port = peers_port(decider)
    status, _, body = place(port, "pool", "add_sub", body=b"x" * (1 << 20),
                            headers={"content-type": "application/octet-stream"})
    assert status in (200, 413), (status, body[:200])
    # Chunked, and one that says more than it sends.
    chunk = b"x" * 65536
    payload = (b"POST " + API.format(backend="pool", model="add_sub").encode() + b" HTTP/1.1\r\nHost: x\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + (b"10000\r\n" + chunk + b"\r\n") * 16 + b"0\r\n\r\n")
    got = raw(port, payload)
    assert got == b"" or got.startswith((b"HTTP/1.1 200", b"HTTP/1.1 4")), got[:200]
    got = raw(port, b"POST " + API.format(backend="pool", model="add_sub").encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Content-Length: 1048576\r\n\r\nshort")
    assert got == b"" or got.startswith((b"HTTP/1.1 200", b"HTTP/1.1 4")), got[:200]
    status, _, body = place(port, "pool", "add_sub")
    assert status == 200 and json.loads(body) == {"endpoints": [reference.http_url]}


GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 2,  # a TLS ClientHello's start
    b"\x00" * 4096,
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
    b"Content-Length: 2\r\n\r\nab",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nnot hex\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nno colon here\r\n\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/9.9\r\n\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nX: " + b"a" * 300_000 + b"\r\n\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\n" + b"X-H: v\r\n" * 5000 + b"\r\n",
    b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nHost: x\r\n",  # head never ends
    b"\r\n" * 1000,
    b"POST /placement/v1/backends/pool/models/add\xff\xfe_sub HTTP/1.1\r\nHost: x\r\n\r\n",
]


def test_garbage_http_on_a_raw_socket(decider: GatewayProcess):
    port = peers_port(decider)
    for payload in GARBAGE:
        got = raw(port, payload)
        assert got == b"" or got.startswith(b"HTTP/1.1 "), (payload[:60], got[:200])
        assert not got.startswith(b"HTTP/1.1 5"), (payload[:60], got[:200])
    # Many at once, some closed mid-request.
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: raw(port, p), GARBAGE * 3))
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /placement/v1/backends/pool/models/add_sub HTTP/1.1\r\nHo")
        s.close()
    assert place(port, "pool", "add_sub")[0] == 200
    serves(decider)


# ------------------------------------------------------------------------------------------ followers


@pytest.fixture
def peer_garbage() -> Iterator[Peer]:
    peer = Peer(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
    yield peer
    peer.close()


def test_a_follower_whose_peer_answers_garbage(workdir: Path, reference: ReferenceServer, peer_garbage: Peer):
    with gateway(workdir, "follower-garbage", reference, peers=[peer_garbage.address]) as gw:
        assert gw.ports.get("peers") is None  # no peers port of its own: a follower
        status, _, body, took = infer_unplaced(gw, "m1")
        assert status == 502, (status, body)
        assert peer_garbage.address in json.loads(body)["error"], body
        assert took < 5 and peer_garbage.asked >= 1
        # Many at once: every one answered, none hangs.
        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(lambda i: infer_unplaced(gw, f"m{i % 3}"), range(40)))
        assert all(r[0] == 502 for r in results), {r[0] for r in results}
        assert max(r[3] for r in results) < 10
        serves(gw)
        # The gRPC side: INTERNAL (a bad answer from upstream), naming the peer.
        import grpc
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        with grpcclient.InferenceServerClient(gw.grpc_url) as client:
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata("m7", client_timeout=10)
            assert info.value.status() == str(grpc.StatusCode.INTERNAL), info.value
            assert peer_garbage.address in info.value.message()


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
                                    b"not http\r\n\r\n"])
def test_a_follower_whose_peer_closes_or_breaks_off(workdir: Path, reference: ReferenceServer,
                                                    answer: bytes | None):
    peer = Peer(answer)
    try:
        with gateway(workdir, "follower-closes", reference, peers=[peer.address]) as gw:
            for model in ("m1", "m1", "m2"):
                status, headers, body, took = infer_unplaced(gw, model)
                assert status == 503, (status, body)
                assert headers.get("retry-after", "").isdigit(), headers
                assert peer.address in json.loads(body)["error"], body
                assert took < 5
            serves(gw)
    finally:
        peer.close()


def test_a_follower_whose_peers_are_all_unreachable(workdir: Path, reference: ReferenceServer):
    gone = [closed_address(), closed_address()]
    with gateway(workdir, "follower-alone", reference, peers=gone) as gw:
        for model in ("m1", "m2", "m1"):
            status, headers, body, took = infer_unplaced(gw, model)
            assert status == 503, (status, body)
            assert int(headers["retry-after"]) >= 1
            error = json.loads(body)["error"]
            assert "m1" in error or "m2" in error
            assert any(a in error for a in gone), error
            assert took < 5
        serves(gw)


def test_a_follower_whose_peer_never_answers_is_bounded_by_load_timeout(workdir: Path, reference: ReferenceServer,
                                                                         black_hole: str):
    with gateway(workdir, "follower-silent", reference, peers=[black_hole], load_timeout_s=1) as gw:
        status, headers, body, took = infer_unplaced(gw, "m1")
        assert status == 503 and headers.get("retry-after"), (status, body)
        assert took < 4, took
        serves(gw)


def test_a_follower_relays_the_deciders_refusal(workdir: Path, reference: ReferenceServer, decider: GatewayProcess):
    """A real decider (the reference server has no model control): its refusal reaches the follower's
    client with the decider's status and words."""
    with gateway(workdir, "follower-real", reference, peers=[f"127.0.0.1:{peers_port(decider)}"]) as gw:
        status, _, body, _ = infer_unplaced(gw, "m9")
        assert status == 400 and "no model control" in json.loads(body)["error"], (status, body)
        serves(gw)


def test_a_follower_relays_a_peer_error_with_an_odd_code_to_grpc(workdir: Path, reference: ReferenceServer):
    body = b'{"error": "refused by the peer", "code": "BOGUS"}'
    peer = Peer(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (len(body), body))
    try:
        with gateway(workdir, "follower-bogus", reference, peers=[peer.address]) as gw:
            status, _, answer, _ = infer_unplaced(gw, "m1")
            assert status == 400 and json.loads(answer)["error"] == "refused by the peer"  # HTTP: fine
            import tritonclient.grpc as grpcclient
            from tritonclient.utils import InferenceServerException

            with grpcclient.InferenceServerClient(gw.grpc_url) as client:
                with pytest.raises(InferenceServerException) as info:
                    client.get_model_metadata("m2", client_timeout=10)
                assert "refused by the peer" in (info.value.message() or ""), info.value
    finally:
        peer.close()
