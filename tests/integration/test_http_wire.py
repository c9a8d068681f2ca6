"""HTTP/1.1 on the wire for the inference path, which the listener serves without ASGI
(frontend/h1direct.py), in front of real Triton, over raw sockets: pipelined requests mixed with
requests the ASGI app serves, Expect: 100-continue, a chunked request body, HTTP/1.0 and
Connection: close, an early refusal whose body follows on a kept-alive connection, a client that
leaves mid-body, a slow reader of a large answer. The answers are checked byte for byte against
what Triton computes, and the gateway keeps serving afterwards with no error logged."""
from __future__ import annotations

import socket
import time

import httptools
import numpy as np
import orjson
import pytest

from tests.conftest import start_gateway

A = np.arange(16, dtype="<f4") * np.float32(0.5)
B = np.full(16, 0.25, dtype="<f4")
BODY = orjson.dumps({
    "id": "wire",
    "inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": A.tolist()},
               {"name": "INPUT1", "shape": [16], "datatype": "FP32", "data": B.tolist()}],
})
PATH = b"/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def gw(triton, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("wire"), triton.http_url, triton.grpc_url, "http")
    yield g
    g.stop()


class Answers:
    """Reads HTTP/1.1 answers off a socket with httptools (a parser independent of ours)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.done: list[dict] = []
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False

    def on_message_begin(self) -> None:
        self.cur = {"headers": {}, "body": b""}

    def on_status(self, status: bytes) -> None:
        self.cur["reason"] = status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.cur["headers"][name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.cur["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.cur["body"] += body

    def on_message_complete(self) -> None:
        self.done.append(self.cur)

    def read(self, n: int, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.done) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 20)
            if not data:
                self.closed = True
                break
            self.parser.feed_data(data)
        return self.done


def connect(gw) -> socket.socket:
    host, port = gw.http_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def request(body: bytes = BODY, path: bytes = PATH, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (b"POST %s HTTP/%s\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path, version, len(body), extra)) + body


def check_sum(answer: dict) -> None:
    assert answer["status"] == 200, answer
    outputs = {o["name"]: o for o in orjson.loads(answer["body"])["outputs"]}
    np.testing.assert_array_equal(np.asarray(outputs["OUTPUT0"]["data"], dtype="<f4"), A + B)
    assert int(answer["headers"]["content-length"]) == len(answer["body"])


def still_serving(gw) -> None:
    with connect(gw) as s:
        s.sendall(request())
        check_sum(Answers(s).read(1)[0])
    log = gw.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "unhandled error" not in log, gw.log_tail()


def test_keep_alive_serves_many_requests_on_one_connection(gw):
    with connect(gw) as s:
        answers = Answers(s)
        for i in range(50):
            s.sendall(request())
            check_sum(answers.read(i + 1)[i])
        assert not answers.closed


def test_pipelined_requests_are_answered_in_order(gw):
    """Inference (served directly) and metadata / health (served by the ASGI app) pipelined in
    one write: every answer comes, in the order asked."""
    meta = b"GET /v2/models/add_sub HTTP/1.1\r\nHost: gw\r\n\r\n"
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: gw\r\n\r\n"
    with connect(gw) as s:
        s.sendall(request() + meta + request() + live + request())
        got = Answers(s).read(5)
    assert [a["status"] for a in got] == [200] * 5
    check_sum(got[0])
    assert orjson.loads(got[1]["body"])["name"] == "add_sub"
    check_sum(got[2])
    assert got[3]["body"] == b'{"live":true}'
    check_sum(got[4])


def test_expect_100_continue(gw):
    head = (b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Expect: 100-continue\r\n\r\n" % (PATH, len(BODY)))
    with connect(gw) as s:
        s.sendall(head)
        s.settimeout(30)
        interim = s.recv(64)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(BODY)
        check_sum(Answers(s).read(1)[0])


def test_chunked_request_body(gw):
    pieces = [BODY[:7], BODY[7:100], BODY[100:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = (b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            % PATH)
    with connect(gw) as s:
        s.sendall(head + chunked[:50])
        time.sleep(0.05)  # the rest in a later segment (not a synchronization: either way must work)
        s.sendall(chunked[50:])
        check_sum(Answers(s).read(1)[0])


@pytest.mark.parametrize("variant", ["http/1.0", "connection: close"])
def test_the_connection_closes_when_the_client_asks(gw, variant):
    raw = request(version=b"1.0") if variant == "http/1.0" else request(extra=b"Connection: close\r\n")
    with connect(gw) as s:
        s.sendall(raw)
        answers = Answers(s)
        check_sum(answers.read(1)[0])
        assert answers.done[0]["headers"].get("connection") == "close"
        answers.read(2, timeout=10)  # waits for the close
        assert answers.closed


def test_an_early_refusal_leaves_the_connection_usable(gw):
    """415 is answered before the body is read; the body that follows is skipped and the next
    request on the same connection is served."""
    refused = request(extra=b"Content-Encoding: br\r\n")
    with connect(gw) as s:
        s.sendall(refused)
        answers = Answers(s)
        first = answers.read(1)[0]
        assert first["status"] == 415 and "compression" in orjson.loads(first["body"])["error"]
        s.sendall(request())
        check_sum(answers.read(2)[1])


def test_a_client_leaving_mid_body_does_not_disturb_the_gateway(gw):
    big = 4 << 20  # a streamed (large) body
    head = (b"POST /v2/models/identity_UINT8/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % big)
    for sent in (0, 1 << 20):
        with connect(gw) as s:
            s.sendall(head + b"\0" * sent)
    small = request()
    with connect(gw) as s:
        s.sendall(small[: len(small) // 2])  # a small body, cut off
    still_serving(gw)


def test_a_slow_reader_gets_a_large_answer_whole(gw):
    """A 16 MiB binary answer to a client that reads slowly: the gateway waits for it (write
    flow control) and the bytes arrive unchanged."""
    n = 16 << 20
    data = (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8).tobytes()
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": n}}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    raw = (b"POST /v2/models/identity_UINT8/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/octet-stream\r\n"
           b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(header), len(header) + n)
           ) + header + data
    with connect(gw) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(raw)
        answers = Answers(s)
        s.settimeout(30)
        pieces = 0
        while not answers.done and pieces < 100_000:
            chunk = s.recv(64 << 10)
            if not chunk:
                break
            answers.parser.feed_data(chunk)
            pieces += 1
            if pieces % 64 == 0:
                time.sleep(0.005)  # a slow reader (pacing, not synchronization)
        got = answers.done[0]
    assert got["status"] == 200
    hl = int(got["headers"]["inference-header-content-length"])
    assert got["body"][hl:] == data
    still_serving(gw)


def test_an_idle_connection_is_closed_after_idle_timeout(triton, tmp_path):
    """Keep-alive ends at limits.idle_timeout_s (the listener's sweep, not a timer per answer):
    a connection used again while idle keeps working; one left idle is closed by the gateway."""
    g = start_gateway(tmp_path, triton.http_url, triton.grpc_url, "http", limits={"idle_timeout_s": 1})
    try:
        with connect(g) as s:
            answers = Answers(s)
            s.sendall(request())
            check_sum(answers.read(1)[0])
            s.sendall(request())  # reused at once: still open
            check_sum(answers.read(2)[1])
            answers.read(3, timeout=15)  # returns when the gateway closes the connection
            assert answers.closed and len(answers.done) == 2
    finally:
        g.stop()


def test_a_refusal_before_100_continue_closes_the_connection(gw):
    """Refused before the body was asked for: the client may or may not send it, so the
    gateway closes the connection rather than read its next request from a body."""
    head = (b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Content-Encoding: br\r\nExpect: 100-continue\r\n\r\n" % (PATH, len(BODY)))
    with connect(gw) as s:
        s.sendall(head)
        answers = Answers(s)
        first = answers.read(1)[0]
        assert first["status"] == 415 and first["headers"].get("connection") == "close"
        answers.read(2, timeout=10)
        assert answers.closed
    still_serving(gw)
