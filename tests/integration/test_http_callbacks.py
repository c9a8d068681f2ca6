"""The inference path served from callbacks (frontend/infer.py ``infer_now``, proxy and backend
``infer_http_now``, h1 ``request_now``): a small request whose body has come is sent to a
kept-alive backend connection at once and answered from that connection's callbacks, with no
task. Everything the coroutine path does must still happen on it — these tests drive the
cases where it hands over or ends differently, through a real gateway process and real
sockets, against a scripted backend (tests/support/scripted.py) that can misbehave on cue.
"""
from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import urllib.request

import orjson

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.scripted import ScriptedHttp

BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
ANSWER = b'{"model_name":"m","outputs":[]}'


def post(conn: http.client.HTTPConnection, body: bytes = BODY, model: str = "m") -> tuple[int, bytes, dict[str, str]]:
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}


def metric(g: GatewayProcess, name: str, *labels: str) -> float:
    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def one_backend(address: str | list[str], **settings: object) -> dict[str, object]:
    endpoints = address if isinstance(address, list) else [address]
    return gateway_config({"b": {"protocol": "http", "endpoints": endpoints, **settings}},
                          [{"model": "*", "backend": "b"}], health={"interval_s": 0.2, "timeout_s": 1.0})


def warm(g: GatewayProcess) -> http.client.HTTPConnection:
    """A client connection, after a first request has left a kept-alive backend connection
    behind (the callback path needs one; the first request connects through the coroutine path)."""
    conn = http.client.HTTPConnection(g.http_url.split(":")[0], int(g.http_url.split(":")[1]), timeout=10)
    wait_for(lambda: post(conn)[0] == 200, timeout=20, interval=0.1, what="the backend to answer")
    return conn


def test_large_answer_to_a_small_request_is_streamed(tmp_path):
    """A small request whose answer is past the backend's streaming threshold (256 KiB): the
    answer's head reaches the callback path, the body is relayed as it arrives (a task of its
    own), byte for byte, and the connection carries the next requests."""
    big = b'{"model_name":"m","outputs":[],"pad":"' + b"x" * (3 << 20) + b'"}'
    backend = ScriptedHttp(lambda line, headers, body: big)
    try:
        with GatewayProcess(one_backend(backend.address), tmp_path, "gw-big") as g:
            conn = warm(g)
            for _ in range(4):
                status, body, headers = post(conn)
                assert status == 200 and body == big
                assert headers["content-length"] == str(len(big))
            conn.close()
            assert "Traceback" not in g.log_tail(200)
    finally:
        backend.close()


def test_backend_closing_a_kept_alive_connection_as_the_request_arrives_is_sent_again(tmp_path):
    """The keep-alive race on the callback path: the backend reads the request and drops the
    reused connection without a byte of answer. Nothing was answered, so the request goes
    out again (the coroutine path, on a fresh connection), as the h1 client's own retry does;
    the client sees one 200 and the endpoint is not counted as failed."""
    calls: list[bytes] = []

    def on_post(line: str, headers: dict[str, str], body: bytes) -> bytes | None:
        calls.append(body)
        return None if len(calls) == 3 else ANSWER  # the third POST: read, then reset

    backend = ScriptedHttp(on_post)
    try:
        with GatewayProcess(one_backend(backend.address), tmp_path, "gw-race") as g:
            conn = warm(g)
            assert post(conn)[0] == 200  # the second POST, on the kept-alive backend connection
            status, body, _ = post(conn)  # the third is reset, then sent again: the fourth
            assert (status, body) == (200, ANSWER)
            assert len(calls) == 4 and calls[2] == calls[3] == BODY
            assert metric(g, "oip_gateway_endpoint_ejected") == 0
            conn.close()
    finally:
        backend.close()


def test_not_ready_answer_from_an_endpoint_thought_ready_goes_to_another(tmp_path):
    """An endpoint the checker saw ready answers "unknown model" (it unloaded the model since):
    on the callback path the answer is not relayed; the endpoint is marked not ready for the
    model and the request goes to the other endpoint, as the coroutine path's retry does."""
    refusals: list[int] = []

    def gone(line: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        refusals.append(1)
        return 400, b'{"error":"Request for unknown model: \'m\' is not found"}'

    served: list[int] = []

    def good(line: str, headers: dict[str, str], body: bytes) -> bytes:
        served.append(1)
        return ANSWER

    bad, ok = ScriptedHttp(gone), ScriptedHttp(good)
    try:
        cfg = gateway_config({"b": {"protocol": "http", "endpoints": [bad.address, ok.address]}},
                             [{"model": "m", "backend": "b"}], health={"interval_s": 0.2, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-notready") as g:
            # Both endpoints say "m" is ready (GET .../ready answers 200): the checker has seen it.
            wait_for(lambda: metric(g, "oip_gateway_route_ready") == 1, timeout=20, what="the route to be ready")
            conn = http.client.HTTPConnection(*g.http_url.split(":"), timeout=10)  # type: ignore[arg-type]
            answers = [post(conn) for _ in range(12)]
            assert all(status == 200 and body == ANSWER for status, body, _ in answers), answers
            assert refusals and len(served) == 12
            assert metric(g, "oip_gateway_backend_events_total", 'event="retry"') >= 1
            conn.close()
    finally:
        bad.close()
        ok.close()


def test_backend_timeout_on_the_callback_path(tmp_path):
    """A kept-alive backend connection that does not answer within timeout_s: 504 with a JSON
    error naming the endpoint, the connection retired, and the next request is served."""
    slow = threading.Event()

    def on_post(line: str, headers: dict[str, str], body: bytes) -> bytes:
        if slow.is_set():
            slow.clear()
            time.sleep(1.5)
        return ANSWER

    backend = ScriptedHttp(on_post)
    try:
        with GatewayProcess(one_backend(backend.address, timeout_s=0.5), tmp_path, "gw-timeout") as g:
            conn = warm(g)
            slow.set()
            status, body, headers = post(conn)
            assert status == 504 and headers["content-type"] == "application/json"
            assert backend.address in orjson.loads(body)["error"]
            assert post(conn)[:2] == (200, ANSWER)
            assert metric(g, "oip_gateway_upstream_errors_total", 'kind="UpstreamTimeout"') == 1
            conn.close()
    finally:
        backend.close()


def test_client_leaving_before_the_answer_leaves_the_gateway_serving(tmp_path):
    """The client closes its connection after sending a request and before the backend
    answers: the answer arriving later has nowhere to go and is dropped; the request is
    still counted once, and the gateway serves the next clients on the same backend
    connection pool."""
    release = threading.Event()
    held: list[int] = []

    def on_post(line: str, headers: dict[str, str], body: bytes) -> bytes:
        if b"hold" in body:
            held.append(1)
            release.wait(10)
        return ANSWER

    backend = ScriptedHttp(on_post)
    try:
        with GatewayProcess(one_backend(backend.address), tmp_path, "gw-gone") as g:
            warm(g).close()
            before = metric(g, "oip_gateway_requests_total", 'api="infer"')
            host, port = g.http_url.split(":")
            body = orjson.dumps({"inputs": [], "id": "hold"})
            for i in range(5):
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                              % (len(body), body))
                    wait_for(lambda n=i: len(held) > n, timeout=10, what="the request to reach the backend")
            release.set()
            wait_for(lambda: metric(g, "oip_gateway_requests_total", 'api="infer"') >= before + 5, timeout=10,
                     what="the abandoned requests to be counted")
            conn = warm(g)
            assert post(conn)[:2] == (200, ANSWER)
            conn.close()
            assert "Traceback" not in g.log_tail(200)
    finally:
        backend.close()


def test_a_request_handed_to_the_coroutine_path_is_rate_counted_once(tmp_path):
    """The callback path runs the head's checks (the guard: auth and rate) first; a request it
    then leaves to the coroutine path — a compressed body here; also splits, mirrors, gRPC
    backends, an endpoint with no idle connection, and a request sent again — must not be charged
    twice: a route's burst of 3 admits 3 such requests, then 429."""
    backend = ScriptedHttp(lambda line, headers, body: ANSWER)
    try:
        cfg = gateway_config({"b": {"protocol": "http", "endpoints": [backend.address]}},
                             [{"model": "m", "backend": "b", "rate": {"per_s": 0.01, "burst": 3}}],
                             health={"interval_s": 0.2, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-rate") as g:
            conn = http.client.HTTPConnection(*g.http_url.split(":"), timeout=10)  # type: ignore[arg-type]
            gz = gzip.compress(BODY)
            statuses = []
            for _ in range(4):
                conn.request("POST", "/v2/models/m/infer", body=gz,
                             headers={"content-type": "application/json", "content-encoding": "gzip"})
                r = conn.getresponse()
                r.read()
                statuses.append(r.status)
            assert statuses == [200, 200, 200, 429], statuses
            conn.close()
    finally:
        backend.close()
