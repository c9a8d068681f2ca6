"""Large bodies read past the HTTP parsers (frontend/h1conn.py ``go_raw``, backends/h1/connection.py
``_Connection.buffer_updated``): after the read that brought a request's (or an answer's) head,
the rest of a large body is read straight into buffers of the connection's own and passed on
as views, with no copy. Through a real gateway process and real sockets: every byte must
arrive where it should, the next request on the same connection (pipelined right behind the
body, in the same packet) must be parsed by the new parser, and the connection keeps serving.
"""
from __future__ import annotations

import hashlib
import random
import socket

import orjson

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.scripted import ScriptedHttp

SMALL = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]})


def answer_for(body: bytes) -> bytes:
    """What the scripted backend answers: the body's digest, then 2 MiB derived from it (an
    answer large enough to be streamed through the gateway, and not periodic)."""
    digest = hashlib.sha256(body).hexdigest().encode()
    return digest + random.Random(digest).randbytes(2 << 20)


def binary_request(size: int, seed: int) -> tuple[bytes, bytes]:
    """(head, body) of a binary-extension inference request with ``size`` tensor bytes."""
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [size],
                                       "parameters": {"binary_data_size": size}}]})
    body = header + random.Random(seed).randbytes(size)
    head = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(header), len(body)))
    return head, body


def read_answer(sock: socket.socket, pending: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a Content-Length from ``sock`` (``pending``: bytes already read)."""
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(1 << 20)
        assert chunk, "connection closed before an answer"
        pending += chunk
    end = pending.index(b"\r\n\r\n") + 4
    head = bytes(pending[:end]).decode("latin-1")
    status = int(head.split(" ", 2)[1])
    length = next(int(line.split(":", 1)[1]) for line in head.split("\r\n")
                  if line.lower().startswith("content-length:"))
    while len(pending) < end + length:
        chunk = sock.recv(1 << 20)
        assert chunk, "connection closed mid-answer"
        pending += chunk
    body = bytes(pending[end:end + length])
    del pending[:end + length]
    return status, body


def test_large_bodies_both_ways_byte_exact_with_a_request_pipelined_behind(tmp_path):
    backend = ScriptedHttp(lambda line, headers, body: answer_for(body))
    config = gateway_config({"b": {"protocol": "http", "endpoints": [backend.address]}},
                            [{"model": "*", "backend": "b"}], health={"interval_s": 0.2, "timeout_s": 1.0})
    try:
        with GatewayProcess(config, tmp_path, "gw-raw") as g:
            host, port = g.http_url.split(":")
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                pending = bytearray()
                for seed, size in ((1, 5 << 20), (2, (1 << 20) + 1), (3, 9 << 20)):
                    head, body = binary_request(size, seed)
                    small_head = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: "
                                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(SMALL))
                    # The head with the body's first bytes, the body in pieces, and its last
                    # piece in one packet with a small request pipelined behind it.
                    sock.sendall(head + body[:1000])
                    for i in range(1000, len(body) - 5000, 3 << 20):
                        sock.sendall(body[i:min(i + (3 << 20), len(body) - 5000)])
                    sock.sendall(body[len(body) - 5000:] + small_head + SMALL)
                    status, answer = read_answer(sock, pending)
                    assert status == 200 and answer == answer_for(body)
                    status, answer = read_answer(sock, pending)
                    assert status == 200 and answer == answer_for(SMALL)
            assert "Traceback" not in g.log_tail(200)
    finally:
        backend.close()


def test_heads_and_bodies_around_the_head_read_size_in_one_packet(tmp_path):
    """A read while a request head is awaited takes at most HEAD_READ bytes (rawbody.py): a head
    larger than that (a 20 KiB header), a body that spans it (read whole through the parser
    in more reads), and a packet of pipelined requests larger than it all arrive intact — the
    same through the gateway's backend side, whose answers' heads are read the same way."""
    from gateway.rawbody import HEAD_READ

    backend = ScriptedHttp(lambda line, headers, body: answer_for(body)[: 64 + len(body) % 50_000])
    config = gateway_config({"b": {"protocol": "http", "endpoints": [backend.address]}},
                            [{"model": "*", "backend": "b"}], health={"interval_s": 0.2, "timeout_s": 1.0})

    def request(body: bytes, extra: bytes = b"") -> bytes:
        return (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%s"
                b"Content-Length: %d\r\n\r\n" % (extra, len(body))) + body

    def json_body(n: int) -> bytes:
        return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [n], "data": [0.5] * n}]})

    medium = json_body(20_000)  # ~100 KB: more than one head read, less than DEFER_MAX
    assert HEAD_READ < len(medium) < 1 << 20
    big_header = b"X-Padding: " + b"p" * 20_000 + b"\r\n"
    assert len(big_header) > HEAD_READ
    try:
        with GatewayProcess(config, tmp_path, "gw-head-read") as g:
            host, port = g.http_url.split(":")
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                pending = bytearray()
                burst = [request(SMALL, big_header), request(medium)] + [request(json_body(k)) for k in range(1, 40)]
                sock.sendall(b"".join(burst))  # ~130 KB of pipelined requests at once
                for raw in burst:
                    body = raw[raw.index(b"\r\n\r\n") + 4:]
                    status, answer = read_answer(sock, pending)
                    assert status == 200 and answer == answer_for(body)[: 64 + len(body) % 50_000]
            assert "Traceback" not in g.log_tail(200)
    finally:
        backend.close()


def test_binary_bodies_read_whole_around_the_limits(tmp_path):
    """Binary-extension bodies of more than WHOLE_MIN and at most WHOLE_MAX bytes are read whole
    past the parser into one buffer (the part that came with the head first), then sent as a
    small request is (h1listen.py). Sizes on both sides of both limits, sent in pieces that
    split anywhere, each with a request pipelined right behind it in the same packet; a
    compressed one and an all-JSON one of that size take the other paths; a client that leaves
    mid-body costs nothing. Every byte must arrive where it should."""
    import gzip

    from gateway.frontend.h1sizes import WHOLE_MAX, WHOLE_MIN

    seen: list[int] = []  # the body sizes the backend got

    def answer(line: str, headers: dict[str, str], body: bytes) -> bytes:
        seen.append(len(body))
        return answer_for(body)

    backend = ScriptedHttp(answer)
    config = gateway_config({"b": {"protocol": "http", "endpoints": [backend.address]}},
                            [{"model": "*", "backend": "b"}], health={"interval_s": 0.2, "timeout_s": 1.0})
    small_head = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(SMALL))
    header_len = len(binary_request(1, 0)[1]) - 1
    try:
        with GatewayProcess(config, tmp_path, "gw-whole") as g:
            host, port = g.http_url.split(":")
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                pending = bytearray()
                sizes = (WHOLE_MIN - header_len, WHOLE_MIN + 1 - header_len, 1 << 20, WHOLE_MAX - header_len,
                         WHOLE_MAX + 1 - header_len)
                for n, size in enumerate(sizes):
                    head, body = binary_request(size, 10 + n)
                    cut = 1 + (n * 7919) % 20_000  # the head's packet brings this much of the body
                    sock.sendall(head + body[:cut])
                    for i in range(cut, len(body) - 3000, 300_001):
                        sock.sendall(body[i:min(i + 300_001, len(body) - 3000)])
                    sock.sendall(body[len(body) - 3000:] + small_head + SMALL)
                    status, answer = read_answer(sock, pending)
                    assert status == 200 and answer == answer_for(body), size
                    status, answer = read_answer(sock, pending)
                    assert status == 200 and answer == answer_for(SMALL)
                # Compressed: read through the parser (checked inflated), not whole.
                head, body = binary_request(1 << 20, 99)
                packed = gzip.compress(body, compresslevel=1)
                packed_head = head.replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % len(packed))
                sock.sendall(packed_head.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n") + packed)
                status, answer = read_answer(sock, pending)
                assert status == 200 and answer == answer_for(packed)
                # All JSON, 1.5 MB: no Inference-Header-Content-Length, streamed as before.
                doc = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [150_000],
                                                "data": [0.25] * 150_000}]})
                assert WHOLE_MIN < len(doc) <= WHOLE_MAX
                sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(doc) + doc)
                status, answer = read_answer(sock, pending)
                assert status == 200 and answer == answer_for(doc)
            # A client gone half-way through a body read whole: nothing reaches the backend,
            # and the gateway goes on serving.
            head, body = binary_request(1 << 20, 7)
            before = len(seen)
            with socket.create_connection((host, int(port)), timeout=30) as gone:
                gone.sendall(head + body[: len(body) // 2])
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                head, other = binary_request((1 << 20) + 1, 8)
                sock.sendall(head + other)
                status, answer = read_answer(sock, bytearray())
                assert status == 200 and answer == answer_for(other)
            assert seen[before:] == [len(other)]  # (the half body never went anywhere)
            assert "Traceback" not in g.log_tail(200)
    finally:
        backend.close()
