"""Bad input and broken backends: each gets its clear error, and the gateway keeps serving.

HTTP errors are ``{"error": "..."}`` with the status the issue names; gRPC
errors carry the matching status code. A backend's own error reaches the
client unchanged (compared with the same request sent to the backend directly).
"""
from __future__ import annotations

import gzip
import socket
import threading
from types import SimpleNamespace

import aiohttp
import grpc
import numpy as np
import orjson
import pytest

from tests.conftest import start_gateway
from tests.support.clients import In, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

LIMIT = 1 << 20  # the gateway under test refuses bodies above 1 MiB


@pytest.fixture(scope="module")
def refused():
    """An address nothing listens on: bound (so no one else takes it) but never listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


BROKEN_LENGTH = 8 << 20  # what the broken backend announces; it sends 1 MiB of it


@pytest.fixture(scope="module")
def broken():
    """A scripted HTTP backend (real socket, own thread) whose inference answers break
    off: the head announces 8 MiB, 1 MiB follows, then ``/cutoff`` models close the
    connection and ``/stall`` models go silent. Health GETs answer 200. A request
    whose body ends early (its sender closed the connection) is counted in ``aborted``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    stop = threading.Event()
    aborted: list[int] = []
    progress: list[int] = [0]  # body bytes received so far by the latest request

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            post = head.startswith(b"POST")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:
                try:
                    chunk = conn.recv(1 << 20)
                except OSError:
                    chunk = b""
                if not chunk:
                    aborted.append(len(rest))
                    return
                rest += chunk
                if post:
                    progress[0] = len(rest)
            if head.startswith(b"GET"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                         b"Inference-Header-Content-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % BROKEN_LENGTH)
            conn.sendall(b"\0" * (1 << 20))
            if b"/stall" in head.split(b"\r\n")[0]:
                stop.wait(30)

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    yield SimpleNamespace(address=f"127.0.0.1:{sock.getsockname()[1]}", aborted=aborted, progress=progress)
    stop.set()
    sock.close()


@pytest.fixture(scope="module")
def gw(reference, black_hole, refused, broken, tmp_path_factory):
    backends = {
        "ref-http": {"protocol": "http", "endpoints": [reference.http_url]},
        "ref-grpc": {"protocol": "grpc", "endpoints": [reference.grpc_url]},
        "down-http": {"protocol": "http", "endpoints": [refused]},
        "down-grpc": {"protocol": "grpc", "endpoints": [refused]},
        "hole-http": {"protocol": "http", "endpoints": [black_hole], "timeout_s": 0.5},
        "hole-grpc": {"protocol": "grpc", "endpoints": [black_hole], "timeout_s": 0.5},
        "broken-http": {"protocol": "http", "endpoints": [broken.address], "timeout_s": 1.0},
    }
    routes = [
        {"model": "add_sub", "backend": "ref-http"},
        {"model": "string_reverse", "version": "1", "backend": "ref-http"},
        {"model": "identity_FP32", "backend": "ref-grpc"},
        {"model": "down_http*", "backend": "down-http"},
        {"model": "down_grpc*", "backend": "down-grpc"},
        {"model": "slow_http*", "backend": "hole-http"},
        {"model": "slow_grpc*", "backend": "hole-grpc"},
        {"model": "cutoff*", "backend": "broken-http"},
        {"model": "stall*", "backend": "broken-http"},
    ]
    proc = GatewayProcess(
        gateway_config(backends, routes, max_message_bytes=LIMIT), tmp_path_factory.mktemp("errors"), "gateway-errors"
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def still_serving(gw):
    """After every bad request, a good one still works and the process is alive."""
    yield
    assert gw.proc.poll() is None, gw.log_tail()
    a = np.arange(4, dtype=np.float32)
    r = infer("http", gw.http_url, "add_sub", [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
    r = infer("grpc", gw.grpc_url, "identity_FP32", [In("INPUT0", a.reshape(1, 4), "FP32")])
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], a.reshape(1, 4))


def post(url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
    import asyncio

    async def run():
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(f"http://{url}{path}", data=body, headers=headers or {}) as r:
                return r.status, await r.read(), dict(r.headers)

    return asyncio.run(run())


def get(url: str, path: str) -> tuple[int, bytes]:
    import asyncio

    async def run():
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{url}{path}") as r:
                return r.status, await r.read()

    return asyncio.run(run())


def grpc_infer(url: str, message: bytes, timeout: float = 10) -> grpc.RpcError:
    with grpc.insecure_channel(url, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(message, timeout=timeout)
    return info.value


def infer_message(model: str, nbytes: int = 16, version: str = "") -> bytes:
    from gateway._pb import grpc_predict_v2_pb2 as pb

    msg = pb.ModelInferRequest(model_name=model, model_version=version)
    t = msg.inputs.add(name="INPUT0", datatype="UINT8", shape=[1, nbytes])
    msg.raw_input_contents.append(b"\x01" * nbytes)
    del t
    return msg.SerializeToString()


def error_of(body: bytes) -> str:
    doc = orjson.loads(body)
    assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"], doc
    return doc["error"]


GOOD_JSON = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})


# -- unknown model / version --------------------------------------------------------
def test_unknown_model(gw):
    status, body, _ = post(gw.http_url, "/v2/models/nope/infer", GOOD_JSON)
    assert status == 404 and "nope" in error_of(body)
    status, body = get(gw.http_url, "/v2/models/nope")
    assert status == 404 and "nope" in error_of(body)
    err = grpc_infer(gw.grpc_url, infer_message("nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.details()


def test_unknown_version_relayed_from_backend(gw, reference):
    """add_sub's route has no version: the backend's own answer reaches the client unchanged."""
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                    {"name": "INPUT1", "shape": [1], "datatype": "FP32", "data": [1]}]})
    direct = post(reference.http_url, "/v2/models/add_sub/versions/9/infer", body)
    via = post(gw.http_url, "/v2/models/add_sub/versions/9/infer", body)
    assert via[0] == direct[0] and via[0] >= 400
    assert via[1] == direct[1]
    error_of(via[1])


def test_unknown_version_of_versioned_route(gw):
    status, body, _ = post(gw.http_url, "/v2/models/string_reverse/versions/2/infer", GOOD_JSON)
    assert status == 404 and "string_reverse" in error_of(body)
    err = grpc_infer(gw.grpc_url, infer_message("string_reverse", version="2"))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_unknown_version_grpc_backend_error_code_relayed(gw, reference):
    with grpc.insecure_channel(reference.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as direct:
            ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                infer_message("identity_FP32", version="9"), timeout=10)
    via = grpc_infer(gw.grpc_url, infer_message("identity_FP32", version="9"))
    assert via.code() == direct.value.code() and via.details() == direct.value.details()


# -- malformed bodies ---------------------------------------------------------------
@pytest.mark.parametrize("body", [b"{", b"[]", b"null", b"\xff\xfe", b'{"inputs": 3}',
                                  b'{"inputs": [{"name": "INPUT0"}]}'])
def test_malformed_json(gw, reference, body):
    # HTTP backend: pass-through, so the backend's own 400 comes back unchanged.
    direct = post(reference.http_url, "/v2/models/add_sub/infer", body)
    via = post(gw.http_url, "/v2/models/add_sub/infer", body)
    assert via[0] == direct[0] == 400 and via[1] == direct[1]
    # gRPC backend: the gateway itself decodes, and answers 400 {"error": ...}.
    status, answer, _ = post(gw.http_url, "/v2/models/identity_FP32/infer", body)
    assert status == 400, answer
    error_of(answer)


def test_header_length_larger_than_body(gw, reference):
    headers = {"Inference-Header-Content-Length": str(len(GOOD_JSON) + 100), "Content-Type": "application/octet-stream"}
    direct = post(reference.http_url, "/v2/models/add_sub/infer", GOOD_JSON, headers)
    via = post(gw.http_url, "/v2/models/add_sub/infer", GOOD_JSON, headers)
    assert via[0] == direct[0] == 400 and via[1] == direct[1]
    status, body, _ = post(gw.http_url, "/v2/models/identity_FP32/infer", GOOD_JSON, headers)
    assert status == 400 and "header" in error_of(body).lower()


def test_grpc_without_model_name(gw):
    err = grpc_infer(gw.grpc_url, infer_message(""))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "model_name" in err.details()


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x10short", b"\x0a\x05add"])
def test_grpc_garbage(gw, garbage):
    err = grpc_infer(gw.grpc_url, garbage)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_gzip_body(gw):
    status, body, _ = post(gw.http_url, "/v2/models/identity_FP32/infer", b"not gzip",
                           {"Content-Encoding": "gzip"})
    assert status == 400
    error_of(body)


def test_gzip_bomb_is_bounded(gw):
    bomb = gzip.compress(b"\0" * (4 * LIMIT))
    status, body, _ = post(gw.http_url, "/v2/models/identity_FP32/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413
    error_of(body)


# -- limits -------------------------------------------------------------------------
def test_body_over_limit(gw):
    status, body, _ = post(gw.http_url, "/v2/models/add_sub/infer", b"x" * (LIMIT + 1))
    assert status == 413 and "limit" in error_of(body)
    err = grpc_infer(gw.grpc_url, infer_message("identity_FP32", nbytes=LIMIT + 1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- broken backends ----------------------------------------------------------------
def test_backend_down(gw):
    status, body, _ = post(gw.http_url, "/v2/models/down_http/infer", GOOD_JSON)
    assert status == 503 and "reachable" in error_of(body)
    err = grpc_infer(gw.grpc_url, infer_message("down_grpc"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    # Cross-protocol to a dead backend is the same answer.
    status, body, _ = post(gw.http_url, "/v2/models/down_grpc/infer", GOOD_JSON)
    assert status == 503
    err = grpc_infer(gw.grpc_url, infer_message("down_http"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


def test_backend_timeout(gw):
    status, body, _ = post(gw.http_url, "/v2/models/slow_http/infer", GOOD_JSON)
    assert status == 504 and error_of(body)
    err = grpc_infer(gw.grpc_url, infer_message("slow_grpc"))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    status, body, _ = post(gw.http_url, "/v2/models/slow_grpc/infer", GOOD_JSON)
    assert status == 504


@pytest.mark.parametrize("model", ["cutoff", "stall"])
def test_answer_breaking_off_after_its_head(gw, model):
    """A large pass-through answer is relayed as it arrives, so its head is already
    out when the backend breaks off: the client gets a truncated answer (connection
    closed, as behind any proxy), never a hang or a 500, and the gateway logs one
    line, not a traceback."""
    import asyncio

    async def run() -> tuple[int, int]:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{gw.http_url}/v2/models/{model}/infer", data=GOOD_JSON,
                              timeout=aiohttp.ClientTimeout(total=20)) as r:
                got = 0
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for chunk in r.content.iter_any():
                        got += len(chunk)
                return r.status, got

    status, got = asyncio.run(run())
    assert status == 200 and got < BROKEN_LENGTH
    wait_for(lambda: "answer cut off after its head was sent" in gw.log_tail(200), timeout=10,
             what="the cut-off log line")
    assert "Traceback" not in gw.log_tail(200)


@pytest.fixture(scope="module")
def roomy(broken, tmp_path_factory):
    """A gateway with the default 256 MiB body limit in front of the scripted backend."""
    config = gateway_config({"broken-http": {"protocol": "http", "endpoints": [broken.address], "timeout_s": 1.0}},
                            [{"model": "upload*", "backend": "broken-http"}])
    with GatewayProcess(config, tmp_path_factory.mktemp("roomy"), "gateway-roomy") as g:
        yield g


def test_client_leaving_mid_upload_aborts_the_streamed_request(roomy, broken):
    """A large binary-extension body streams to the backend as it arrives; when its
    client disconnects halfway, the backend's connection is closed too (it never
    receives a complete request) and the gateway keeps serving."""
    gw = roomy
    header = b'{"inputs":[{"name":"INPUT0","shape":[1,2097152],"datatype":"FP32"}]}'
    length = len(header) + (8 << 20)
    before = len(broken.aborted)
    with socket.create_connection(tuple(gw.http_url.rsplit(":", 1))) as client:
        client.sendall(b"POST /v2/models/upload/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/octet-stream\r\n"
                       b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(header), length, header))
        client.sendall(b"\0" * (2 << 20))
        # The backend receives the first part while the client is still sending: it streams
        # (a buffering gateway would send nothing before all 8 MiB had arrived).
        wait_for(lambda: broken.progress[0] > (1 << 20), timeout=10, what="the body's first MiB at the backend")
        assert len(broken.aborted) == before
    wait_for(lambda: len(broken.aborted) > before, timeout=10, what="the backend to see the request cut off")
    assert 0 < broken.aborted[-1] < length
    assert gw.proc.poll() is None and "Traceback" not in gw.log_tail(200)


def test_large_body_for_an_unknown_model_is_refused_unread(roomy):
    """Routing happens before a large body is read: 404 at once, the connection stays usable."""
    import asyncio

    header = b'{"inputs":[{"name":"INPUT0","shape":[1,1048576],"datatype":"FP32"}]}'
    body = header + b"\0" * (4 << 20)

    async def run() -> list[tuple[int, bytes]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            out = []
            for path in ("/v2/models/nope/infer", "/v2/health/live"):
                async with s.post(f"http://{roomy.http_url}{path}", data=body,
                                  headers={"Inference-Header-Content-Length": str(len(header))}) if "infer" in path \
                        else s.get(f"http://{roomy.http_url}{path}") as r:
                    out.append((r.status, await r.read()))
            return out

    (status, answer), (live, _) = asyncio.run(run())
    assert status == 404 and "nope" in error_of(answer) and live == 200


def test_stalled_upload_gets_408(roomy, broken):
    """A client that stops sending its (streamed) body for timeout_s gets 408 and the
    backend's connection is closed; a slow but steady upload is not cut (h1 unit tests)."""
    header = b'{"inputs":[{"name":"INPUT0","shape":[1,2097152],"datatype":"FP32"}]}'
    before = len(broken.aborted)
    with socket.create_connection(tuple(roomy.http_url.rsplit(":", 1)), timeout=20) as client:
        client.sendall(b"POST /v2/models/upload/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(header), len(header) + (8 << 20), header))
        client.sendall(b"\0" * (2 << 20))  # then silence, connection open
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = client.recv(65536)
            assert chunk, "connection closed without an answer"
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            chunk = client.recv(65536)
            assert chunk, "connection closed mid-answer"
            body += chunk
    assert head.startswith(b"HTTP/1.1 408"), head
    assert "stalled" in error_of(body)
    wait_for(lambda: len(broken.aborted) > before, timeout=10, what="the backend's connection to close")


def test_unknown_path_and_method(gw):
    status, body = get(gw.http_url, "/v3/whatever")
    assert status == 404
    error_of(body)
    status, body, _ = post(gw.http_url, "/v2/health/live", b"")
    assert status == 405
    error_of(body)


def test_gateway_not_ready_when_a_route_has_no_ready_endpoint(reference, refused, tmp_path_factory):
    backends = {"ok": {"protocol": "http", "endpoints": [reference.http_url]},
                "dead": {"protocol": "grpc", "endpoints": [refused]}}
    routes = [{"model": "add_sub", "backend": "ok"}, {"model": "string_reverse", "backend": "dead"}]
    with GatewayProcess(gateway_config(backends, routes), tmp_path_factory.mktemp("notready"), "gw-notready") as g:
        # Wait until the health checker has run (the endpoint gauge is exported), then it must still say no.
        wait_for(lambda: b"oip_gateway_endpoint_healthy" in get_metrics(g), timeout=20, what="a health round")
        assert get(g.http_url, "/v2/health/ready")[0] == 400
        assert get(g.http_url, "/v2/health/live")[0] == 200
        assert get(g.http_url, "/v2/models/add_sub/ready")[0] == 200


def test_ready_follows_the_backend(tmp_path_factory):
    """Ready only once the backend's models are ready; not ready again when it goes away."""
    from tests.support.gateway import ReferenceServer

    workdir = tmp_path_factory.mktemp("follow")
    ref = ReferenceServer(workdir, "ref-follow").start()
    try:
        g = start_gateway(workdir, ref.http_url, ref.grpc_url, "grpc")
        try:
            assert get(g.http_url, "/v2/health/ready")[0] == 200
            ref.stop()
            wait_for(lambda: get(g.http_url, "/v2/health/ready")[0] == 400, timeout=20, what="not ready")
        finally:
            g.stop()
    finally:
        ref.stop()


def get_metrics(g) -> bytes:
    import urllib.request

    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        return r.read()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_converted_response_is_compressed_when_asked(gw, coding):
    """HTTP client → gRPC backend: the gateway itself compresses the answer the client asked to be compressed."""
    import zlib

    plain = post(gw.http_url, "/v2/models/identity_FP32/infer", GOOD_JSON, {"Accept-Encoding": "identity"})
    assert plain[0] == 200 and "Content-Encoding" not in plain[2]
    status, body, headers = post(gw.http_url, "/v2/models/identity_FP32/infer", gzip.compress(GOOD_JSON),
                                 {"Content-Encoding": "gzip", "Accept-Encoding": coding})
    assert status == 200 and headers["Content-Encoding"] == coding
    wbits = 31 if coding == "gzip" else 15
    assert zlib.decompress(body, wbits) == plain[1]


def test_unknown_model_is_not_ready_rather_than_an_error(gw, triton):
    """Readiness of a model nobody serves: 'not ready', as Triton itself answers."""
    from tests.support.clients import readiness

    for kind, url in (("http", gw.http_url), ("grpc", gw.grpc_url)):
        assert readiness(kind, url, "nope")[2] is False
    assert get(gw.http_url, "/v2/models/nope/ready")[0] == get(triton.http_url, "/v2/models/nope/ready")[0] == 400
