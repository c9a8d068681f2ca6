"""Hard limits and hostile requests at the gateway in front of real Triton, on the pass-through
and the converting path, with real clients (tritonclient, raw sockets, a raw HTTP/2 client
from the ``h2`` library for gRPC framing):

- tensors, dims, elements (a shape whose product overflows 64 bits), name and id lengths:
  a 4xx / INVALID_ARGUMENT naming the limit's key;
- slowloris: a trickled request head, a silent connection, a stalled body → 408 / closed;
- max connections per listener: the next one gets 503 and is closed, later ones work again;
- max concurrent streams per gRPC connection: announced in the server's SETTINGS;
- gRPC messages with a wrong length prefix or a compressed flag without an encoding;
- truncated binary data, a bad Inference-Header-Content-Length;
- each followed by a normal inference; the gateway's RSS bounded after bursts of each kind.
"""
from __future__ import annotations

import http.client
import socket
import struct
import time
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.events
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.triton

LIMITS = {"max_tensors": 4, "max_dims": 6, "max_elements": 1_000_000, "max_name_length": 64,
          "max_id_length": 128, "max_grpc_streams": 4, "header_timeout_s": 1.5, "body_timeout_s": 1.5,
          "idle_timeout_s": 30}


@pytest.fixture(scope="module")
def gw(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("limits")
    backends = {"h": {"protocol": "http", "endpoints": [triton.http_url]},
                "g": {"protocol": "grpc", "endpoints": [triton.grpc_url]}}
    # x-backend: grpc sends a request to the gRPC backend (HTTP clients: the converting path).
    routes = [{"model": "add_sub", "headers": {"x-backend": "grpc"}, "backend": "g"},
              {"model": "add_sub", "backend": "h"},
              {"model": "identity_FP32", "headers": {"x-backend": "http"}, "backend": "h"},
              {"model": "identity_FP32", "backend": "g"}]
    g = GatewayProcess(gateway_config(backends, routes, limits=LIMITS), root, "gw-limits")
    g.start()
    try:
        wait_for(lambda: httpclient.InferenceServerClient(g.http_url).is_server_ready(), timeout=60,
                 what="gateway readiness")
        yield g
    finally:
        g.stop()


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
        return r.status, orjson.loads(raw) if raw else {}
    finally:
        conn.close()


def still_serving(gw: GatewayProcess) -> None:
    a = np.arange(4, dtype=np.float32)
    ins = []
    for name in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(a)
        ins.append(i)
    with httpclient.InferenceServerClient(gw.http_url) as c:
        np.testing.assert_array_equal(c.infer("add_sub", ins).as_numpy("OUTPUT0"), 2 * a)
    i = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    i.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        np.testing.assert_array_equal(c.infer("identity_FP32", [i]).as_numpy("OUTPUT0"), np.ones((1, 2)))


def tensors(n: int, shape: list[int], name_len: int = 6) -> list[dict]:
    return [{"name": f"INPUT{k}".ljust(name_len, "x"), "datatype": "FP32", "shape": shape, "data": [1.0]}
            for k in range(n)]


HOSTILE_JSON = {
    "max_tensors": {"inputs": tensors(5, [1])},
    "max_dims": {"inputs": tensors(1, [1] * 7)},
    "max_elements": {"inputs": tensors(1, [1 << 40, 1 << 40])},  # 2^80: past 64 bits
    "max_name_length": {"inputs": tensors(1, [1], name_len=65)},
    "max_id_length": {"id": "x" * 129, "inputs": tensors(2, [1])},
}


@pytest.mark.parametrize("backend", ["http", "grpc"], ids=["pass-through", "converting"])
@pytest.mark.parametrize("limit", sorted(HOSTILE_JSON))
def test_json_request_over_a_limit(gw, backend, limit):
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", orjson.dumps(HOSTILE_JSON[limit]),
                          {"x-backend": backend})
    assert status == 400 and f"limits.{limit}" in answer["error"], answer


@pytest.mark.parametrize("size", ["padded", "streamed", "streamed-gzip"])
@pytest.mark.parametrize("backend", ["http", "grpc"], ids=["pass-through", "converting"])
@pytest.mark.parametrize("limit", sorted(HOSTILE_JSON))
def test_a_large_json_request_is_held_to_the_same_limits(gw, backend, limit, size):
    """However much data the tensors carry — read whole (over 64 KiB) or streamed to the
    backend as it arrives (over 1 MiB, compressed or not) — the limits are checked on the
    rest of the request (codec/jsonscan.py): a request is not taken past them by its size."""
    import gzip

    doc = orjson.loads(orjson.dumps(HOSTILE_JSON[limit]))
    doc["inputs"][0]["data"] = np.random.default_rng(7).random(10_000 if size == "padded" else 200_000).tolist()
    body = orjson.dumps(doc)
    headers = {"x-backend": backend}
    if size == "streamed-gzip":
        body = gzip.compress(body, compresslevel=1)
        headers["content-encoding"] = "gzip"
    assert (len(body) > 1 << 20) == size.startswith("streamed"), len(body)
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, headers)
    assert status == 400 and f"limits.{limit}" in answer["error"], answer
    if size != "padded" and limit == "max_tensors":
        assert httpclient.InferenceServerClient(gw.http_url).is_server_live()
        still_serving(gw)


def test_a_large_json_request_within_the_limits_passes(gw):
    a = np.arange(300_000, dtype=np.float32)
    for backend in ("http", "grpc"):
        body = orjson.dumps({"id": "big", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, a.size],
                                                      "data": a.tolist()}]})
        assert len(body) > 1 << 20
        status, answer = post(gw.http_url, "/v2/models/identity_FP32/infer", body, {"x-backend": backend})
        assert status == 200, answer
        assert answer["id"] == "big" and answer["outputs"][0]["data"] == a.tolist()


def test_binary_extension_header_over_a_limit(gw):
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1 << 62, 8],
                                       "parameters": {"binary_data_size": 8}}]})
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", header + b"\0" * 8,
                          {"inference-header-content-length": str(len(header))})
    assert status == 400 and "limits.max_elements" in answer["error"]


def _grpc_request(**kw) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=kw.pop("model", "identity_FP32"), id=kw.pop("id", ""))
    for k in range(kw.pop("n", 1)):
        t = req.inputs.add(name=kw.get("name", f"INPUT{k}"), datatype="FP32")
        t.shape.extend(kw.get("shape", [1]))
    req.raw_input_contents.extend([b"\0" * 4] * len(req.inputs))
    return req


@pytest.mark.parametrize("backend", ["grpc", "http"], ids=["pass-through", "converting"])
def test_grpc_request_over_a_limit(gw, backend):
    cases = {
        "max_tensors": _grpc_request(n=5),
        "max_dims": _grpc_request(shape=[1] * 7),
        "max_elements": _grpc_request(shape=[1 << 40, 1 << 40]),
        "max_name_length": _grpc_request(name="I" * 65),
        "max_id_length": _grpc_request(id="i" * 129),
    }
    with grpc.insecure_channel(gw.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for limit, req in cases.items():
            with pytest.raises(grpc.RpcError) as err:
                call(req.SerializeToString(), metadata=(("x-backend", backend),))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, limit
            assert f"limits.{limit}" in err.value.details(), (limit, err.value.details())
    still_serving(gw)


def test_long_model_names(gw):
    long = "m" * 65
    status, answer = post(gw.http_url, f"/v2/models/{long}/infer", b"{}")
    assert status == 400 and "limits.max_name_length" in answer["error"]
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        with pytest.raises(InferenceServerException) as exc:
            c.get_model_metadata(long)
        assert "max_name_length" in str(exc.value)
        with pytest.raises(InferenceServerException) as exc:
            i = grpcclient.InferInput("INPUT0", [1], "FP32")
            i.set_data_from_numpy(np.ones(1, dtype=np.float32))
            c.infer(long, [i])
        assert "max_name_length" in str(exc.value)


def test_a_large_body_arriving_slowly_is_not_a_stall(gw):
    """Past the first MiB a body is read in large pieces (rawbody.py: the socket's low-water
    mark), so a slow client's bytes can wait in the kernel for longer than body_timeout_s
    (1.5 s here) between reads: they are progress, not a pause — the request is answered."""
    a = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, a.size],
                                       "parameters": {"binary_data_size": a.nbytes}}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    body = header + a.tobytes()
    head = (f"POST /v2/models/identity_FP32/infer HTTP/1.1\r\nHost: x\r\nx-backend: http\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    with _connect(gw.http_url) as sock:
        sock.sendall(head + body[: 1200 << 10])
        sent = 1200 << 10
        start = time.monotonic()
        while time.monotonic() - start < 4.0:  # 8 KiB every 0.25 s: well under the mark
            sock.sendall(body[sent : sent + 8192])
            sent += 8192
            time.sleep(0.25)  # (the client's pace, not a wait for the gateway)
        sock.sendall(body[sent:])
        sock.settimeout(30)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert answer.endswith(a.tobytes())


def _connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_slowloris_head(gw):
    sock = _connect(gw.http_url)
    started = time.monotonic()
    sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n")
    # Trickle header bytes: each keeps the connection busy, none completes the head.
    for _ in range(3):
        try:
            sock.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
        time.sleep(0.4)
    answer = _read_all(sock)  # the gateway closes it
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"limits.header_timeout_s" in answer
    assert time.monotonic() - started < 10
    # A connection that never sends anything is closed too.
    silent = _connect(gw.http_url)
    assert _read_all(silent) == b""
    silent.close()
    still_serving(gw)


def test_stalled_body(gw):
    sock = _connect(gw.http_url)
    sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"inputs\": [")
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"limits.body_timeout_s" in answer, answer[:300]
    still_serving(gw)


def test_stalled_binary_body_read_whole(gw):
    """A binary body of a size read whole past the parser (h1sizes.py WHOLE_MAX) that stops
    half-way: the request is refused with 408 once body_timeout_s passes without a byte."""
    from gateway.frontend.h1sizes import WHOLE_MAX, WHOLE_MIN

    size = 1 << 20
    assert WHOLE_MIN < size < WHOLE_MAX
    sock = _connect(gw.http_url)
    sock.sendall(b"POST /v2/models/identity_FP32/infer HTTP/1.1\r\nHost: x\r\nx-backend: http\r\n"
                 b"Inference-Header-Content-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % size + bytes(size // 2))
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"limits.body_timeout_s" in answer, answer[:300]
    still_serving(gw)


def test_max_connections(triton, tmp_path):
    backends = {"h": {"protocol": "http", "endpoints": [triton.http_url]}}
    g = GatewayProcess(gateway_config(backends, [{"model": "add_sub", "backend": "h"}],
                                      limits={"max_connections": 4}), tmp_path, "gw-conns")
    g.start()
    try:
        wait_for(lambda: httpclient.InferenceServerClient(g.http_url).is_server_ready(), timeout=60,
                 what="gateway readiness")
        held = [_connect(g.http_url) for _ in range(4)]
        # The listener may not have seen all four yet: the fifth is refused once it has.
        def refused() -> bool:
            extra = _connect(g.http_url)
            try:
                answer = _read_all(extra)
            finally:
                extra.close()
            return answer.startswith(b"HTTP/1.1 503") and b"limits.max_connections" in answer
        wait_for(refused, timeout=10, what="a connection past max_connections refused")
        for s in held:
            s.close()
        wait_for(lambda: httpclient.InferenceServerClient(g.http_url).is_server_live(), timeout=10,
                 what="connections accepted again")
        # gRPC: four HTTP/2 connections get the server's SETTINGS; the fifth is closed at once.
        def h2_open() -> tuple[socket.socket, bool]:
            sock = _connect(g.grpc_url)
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
            return sock, bool(sock.recv(65536))
        grpc_held = [h2_open() for _ in range(4)]
        assert all(answered for _, answered in grpc_held)
        extra, answered = h2_open()
        extra.close()
        assert not answered
        for s, _ in grpc_held:
            s.close()
        with grpcclient.InferenceServerClient(g.grpc_url) as c:
            wait_for(c.is_server_live, timeout=10, what="gRPC connections accepted again")
    finally:
        g.stop()


def test_grpc_streams_per_connection_announced(gw):
    """The server's HTTP/2 SETTINGS carry MAX_CONCURRENT_STREAMS = limits.max_grpc_streams."""
    sock = _connect(gw.grpc_url)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    settings = None
    deadline = time.monotonic() + 10
    while settings is None and time.monotonic() < deadline:
        for event in conn.receive_data(sock.recv(65536)):
            if isinstance(event, h2.events.RemoteSettingsChanged):
                settings = {int(k): v.new_value for k, v in event.changed_settings.items()}
    sock.close()
    assert settings is not None and settings.get(3) == LIMITS["max_grpc_streams"]


def _raw_grpc(url: str, payload: bytes, wait: float = 15) -> tuple[str | None, str]:
    """One ModelInfer call with ``payload`` as the DATA (the 5-byte gRPC prefix included, as
    crafted); returns (grpc-status, grpc-message) of the answer, (None, "") if none came
    within ``wait`` seconds."""
    sock = _connect(url)
    sock.settimeout(wait)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"),
                          (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", url),
                          ("content-type", "application/grpc"), ("te", "trailers")])
    conn.send_data(1, payload, end_stream=True)
    sock.sendall(conn.data_to_send())
    status = message = None
    deadline = time.monotonic() + wait
    done = False
    while not done and time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                headers = dict(event.headers)
                status = headers.get("grpc-status", status)
                message = headers.get("grpc-message", message)
            if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
        sock.sendall(conn.data_to_send())
    sock.close()
    return status, message or ""


def test_grpc_framing_errors(gw):
    msg = _grpc_request().SerializeToString()
    status, message = _raw_grpc(gw.grpc_url, b"\1" + struct.pack(">I", len(msg)) + msg)
    assert status == "13" and "no encoding" in message  # gRPC's own answer: INTERNAL
    status, message = _raw_grpc(gw.grpc_url, b"\0" + struct.pack(">I", 7) + b"\xff" * 7)
    assert status == "3" and "malformed protobuf message" in message  # the gateway's: INVALID_ARGUMENT
    # A length prefix longer than the data: gRPC (core) waits for the rest of the message —
    # the call never reaches the gateway's code and ends when its connection does. The
    # gateway serves everyone else meanwhile.
    status, _ = _raw_grpc(gw.grpc_url, b"\0" + struct.pack(">I", len(msg) + 100) + msg, wait=2)
    assert status != "0"
    still_serving(gw)


def test_truncated_binary_and_bad_header_length(gw):
    header = orjson.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}]})
    for backend in ("http", "grpc"):
        status, answer = post(gw.http_url, "/v2/models/add_sub/infer", header + b"\0" * 20,
                              {"inference-header-content-length": str(len(header)), "x-backend": backend})
        assert 400 <= status < 500 and "error" in answer, (backend, status, answer)
    for bad in ("-1", "abc", str(len(header) + 100), "1e3"):
        status, answer = post(gw.http_url, "/v2/models/add_sub/infer", header + b"\0" * 32,
                              {"inference-header-content-length": bad})
        assert status == 400 and "Inference-Header-Content-Length" in answer["error"], (bad, answer)
    still_serving(gw)


def test_memory_bounded_after_hostile_bursts(gw):
    pid = gw.proc.pid
    still_serving(gw)
    before = rss(pid)
    bodies = [orjson.dumps(b) for b in HOSTILE_JSON.values()]
    bodies.append(orjson.dumps({"inputs": tensors(1, [1] * 10_000)}))  # 10,000 dims
    bodies.append(orjson.dumps({"inputs": tensors(3000, [1])}))  # 3,000 tensors
    host, port = gw.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for _ in range(60):
            for body in bodies:
                conn.request("POST", "/v2/models/add_sub/infer", body=body,
                             headers={"content-type": "application/json"})
                r = conn.getresponse()
                r.read()
                assert r.status == 400
    finally:
        conn.close()
    with grpc.insecure_channel(gw.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        big = _grpc_request(n=3000).SerializeToString()
        for _ in range(100):
            with pytest.raises(grpc.RpcError):
                call(big)
    still_serving(gw)
    assert rss(pid) - before < 50 << 20, (before, rss(pid))


@pytest.mark.parametrize("backend", ["http", "grpc"], ids=["pass-through", "converting"])
def test_invalid_utf8_names_and_ids(gw, backend):
    """Bytes that are not UTF-8 in a model name (URL), an id or a tensor name: 400 /
    INVALID_ARGUMENT, never a name or id changed on its way to Triton."""
    host, port = gw.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v2/models/add%FFsub/infer", body=b"{}", headers={"x-backend": backend})
        r = conn.getresponse()
        assert r.status == 400 and b"not valid UTF-8" in r.read()
    finally:
        conn.close()
    for body in (b'{"id": "\xff", "inputs": []}',
                 b'{"inputs": [{"name": "IN\xc3\x28", "datatype": "FP32", "shape": [1], "data": [1]}]}'):
        status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"x-backend": backend})
        assert status == 400 and "UTF-8" in answer["error"], answer
    grpc_backend = "grpc" if backend == "http" else "http"  # a gRPC client: pass-through on the gRPC backend
    good = _grpc_request().SerializeToString()
    with grpc.insecure_channel(gw.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for bad in (b"\x1a\x02\xff\xfe" + good, good + b"\x1a\x02\xff\xfe", b"\x0a\x02\xff\xfe"):
            with pytest.raises(grpc.RpcError) as err:
                call(bad, metadata=(("x-backend", grpc_backend),))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "UTF-8" in err.value.details()
    still_serving(gw)


def _add_sub_inputs(a: float, b: float) -> bytes:
    """The inputs member of an add_sub request (two FP32 [4] tensors), as JSON text."""
    return orjson.dumps([{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [a] * 4},
                         {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [b] * 4}])


def test_triton_reads_the_first_of_repeated_names(triton):
    """Why the gateway refuses repeated names: Triton (RapidJSON's FindMember) reads the first
    of them, where orjson, msgspec and Python's json read the last."""
    body = b'{"inputs":' + _add_sub_inputs(1, 1) + b',"inputs":' + _add_sub_inputs(5, 5) + b"}"
    status, answer = post(triton.http_url, "/v2/models/add_sub/infer", body)
    assert status == 200, answer
    assert {o["name"]: o["data"] for o in answer["outputs"]}["OUTPUT0"] == [2.0] * 4  # 1 + 1: the first


@pytest.mark.parametrize("backend", ["http", "grpc"], ids=["pass-through", "converting"])
def test_repeated_member_names_are_refused(gw, backend):
    """One request, two meanings: refused with 400 naming the member, on both paths — the
    limits check would judge one value and the backend read another."""
    over = orjson.dumps([{"name": "INPUT0", "datatype": "FP32", "shape": [1 << 40, 1 << 40], "data": [1.0]}])
    cases = {
        # the first (what Triton reads) past max_elements, the last (what a last-wins check sees) fine
        "inputs": b'{"inputs":' + over + b',"inputs":' + _add_sub_inputs(1, 2) + b"}",
        "shape": b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1000000000],"shape":[4],'
                 b'"data":[1,1,1,1]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,1,1,1]}]}',
        "sequence_id": b'{"parameters":{"sequence_id":1,"sequence_id":2},"inputs":' + _add_sub_inputs(1, 2) + b"}",
        "id": b'{"id":"a","id":"b","inputs":' + _add_sub_inputs(1, 2) + b"}",
    }
    for name, body in cases.items():
        status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"x-backend": backend})
        assert status == 400 and f"repeats the member name '{name}'" in answer["error"], (name, answer)
    # Past the size the limits check parses (64 KiB of JSON): the converting path reads it, and refuses.
    big = orjson.dumps([{"name": "INPUT0", "datatype": "FP32", "shape": [20000], "data": [1.5] * 20000}])
    body = b'{"inputs":' + big + b',"inputs":' + _add_sub_inputs(1, 2) + b"}"
    assert len(body) > 64 * 1024
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"x-backend": "grpc"})
    assert status == 400 and "repeats the member name 'inputs'" in answer["error"], answer
    still_serving(gw)


@pytest.mark.parametrize("backend", ["http", "grpc"], ids=["pass-through", "converting"])
def test_colons_in_strings_are_not_repeats(gw, backend):
    """The colon count that proves a request free of repeats is only a shortcut: a request
    whose strings hold colons (an id, a parameter) is read again and answered as ever."""
    body = (b'{"id":"urn:req:1","parameters":{"tag":"a:b"},"inputs":' + _add_sub_inputs(1.5, 2)
            + b',"outputs":[{"name":"OUTPUT0"}]}')
    status, answer = post(gw.http_url, "/v2/models/add_sub/infer", body, {"x-backend": backend})
    assert status == 200, answer
    assert answer["id"] == "urn:req:1"
    assert answer["outputs"][0]["data"] == [3.5] * 4
