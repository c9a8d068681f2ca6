"""Large gRPC messages stream through (issue 38): a ModelInferResponse of RELAY_MIN bytes or more
is passed on to the client as it arrives (backends/h2stream.py ``Relay``), a ModelInferRequest of
STREAM_MIN bytes or more is routed from its head and sent on as it arrives (frontend/h2upload.py),
each acknowledged to the sender only as the receiver takes it — so the gateway never holds either
whole, a client that stops reading stops the backend and a backend that stops reading stops the
client. Proven with tritonclient, grpcio and a raw HTTP/2 client against backends of
tests/support/badgrpc.py that answer big and then break the rules half-way, clients that break
them half-way, and backends that refuse: each ends the call with a clear error naming the party
at fault, a request is sent again only while it is kept whole, and the gateway keeps serving."""
from __future__ import annotations

import hashlib
import socket
import struct

import grpc
import h2.config
import h2.connection
import h2.events
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway import h2 as gh2
from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.backends.h2stream import RELAY_MIN
from gateway.frontend.h2upload import REWIND_MAX, STREAM_MIN
from tests.support.badgrpc import BadGrpc, big_answer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.skipif(not gh2.native("server") or not gh2.native("client"),
                                reason="the relay is the gateway's own HTTP/2 on both sides")

BIG = 6_000_000  # output bytes of the big answers: several stream windows (1 MiB) long
LIMIT = 16 << 20

# model -> (gRPC code, words of the message): every one a fault of the backend, after part of
# the answer went to the client.
BROKEN = {
    "big_reset_mid": ("UNAVAILABLE", "reset the stream (RST_STREAM CANCEL)"),
    "big_close": ("UNAVAILABLE", "in the middle of the answer"),
    "big_truncated": ("INTERNAL", "answered OK without a complete response message"),
    "big_two": ("INTERNAL", "answered with more than one message"),
    "big_no_status": ("INTERNAL", "without a grpc-status"),
}


@pytest.fixture(scope="module")
def bads():
    # The second one answers a refused_stream request: a retry that reaches it succeeds.
    with BadGrpc(big=BIG) as a, BadGrpc(big=BIG, override={"refused_stream": "ok"}) as b:
        yield a, b


@pytest.fixture(scope="module")
def gw(bads, tmp_path_factory):
    backends = {"bad": {"protocol": "grpc", "endpoints": [s.address for s in bads], "max_message_bytes": LIMIT,
                        "timeout_s": 10, "retries": 2,
                        # (the broken answers below count as transport failures: none may eject an endpoint
                        # the retry test needs)
                        "outlier": {"consecutive_failures": 1000}}}
    g = GatewayProcess(gateway_config(backends, [{"model": "*", "backend": "bad"}], access_log=True,
                                      limits={"body_timeout_s": 2}),
                       tmp_path_factory.mktemp("grpc-relay"))
    g.start()
    try:
        def ready() -> bool:
            with httpclient.InferenceServerClient(g.http_url) as c:
                return c.is_model_ready("big_ok")

        wait_for(ready, timeout=30, what="gateway readiness")
        yield g
    finally:
        g.stop()


def _infer_grpc(url: str, model: str):
    x = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    with grpcclient.InferenceServerClient(url) as c:
        return c.infer(model, [x], client_timeout=30)


def _seen(bads, model: str) -> int:
    return sum(s.seen.count(model) for s in bads)


def test_the_answer_is_relayed_byte_for_byte(gw, bads):
    assert len(big_answer("big_ok", BIG)) > RELAY_MIN
    for _ in range(3):
        result = _infer_grpc(gw.grpc_url, "big_ok")
        expected = np.frombuffer((bytes(range(251)) * (BIG // 251 + 1))[:BIG], np.uint8)
        assert np.array_equal(result.as_numpy("OUTPUT0"), expected)
        assert result.get_response().model_name == "big_ok"


def test_the_converting_path_still_reads_it_whole(gw):
    x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    with httpclient.InferenceServerClient(gw.http_url, network_timeout=30) as c:
        out = c.infer("big_ok", [x], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert out.as_numpy("OUTPUT0").nbytes == BIG


@pytest.mark.parametrize("model", list(BROKEN))
def test_a_backend_that_breaks_off_mid_answer_is_an_error_naming_it_and_not_sent_again(gw, bads, model):
    code, words = BROKEN[model]
    before = _seen(bads, model)
    with pytest.raises(InferenceServerException) as info:
        _infer_grpc(gw.grpc_url, model)
    err = info.value
    assert err.status() == f"StatusCode.{code}", err
    assert words in err.message(), err.message()
    assert "backend 'bad' endpoint 127.0.0.1:" in err.message()  # the party at fault
    assert _seen(bads, model) == before + 1  # part of it reached the client: never sent again
    assert np.array_equal(_infer_grpc(gw.grpc_url, "big_ok").as_numpy("OUTPUT0")[:3], [0, 1, 2])


def test_a_status_after_the_answer_is_the_backends_relayed_not_a_retry(gw, bads):
    before = _seen(bads, "big_unavailable")
    with pytest.raises(InferenceServerException) as info:
        _infer_grpc(gw.grpc_url, "big_unavailable")
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "the backend is busy" in info.value.message()
    assert _seen(bads, "big_unavailable") == before + 1


def test_a_converted_request_is_not_sent_again_once_its_answer_began(gw, bads):
    """An HTTP client's request, converted, is read back whole (h2stream.Gathered, not relayed),
    yet once the answer's first bytes came the backend has run it: it is let go then, and a
    status after them is the client's answer, not a retry on the other endpoint."""
    before = _seen(bads, "big_unavailable")
    x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    with httpclient.InferenceServerClient(gw.http_url, network_timeout=30) as c:
        with pytest.raises(InferenceServerException) as info:
            c.infer("big_unavailable", [x])
        assert "the backend is busy" in info.value.message()
        assert _seen(bads, "big_unavailable") == before + 1
        # Refused before any answer, the same request goes to the other endpoint, which takes it.
        before = _seen(bads, "refused_stream")
        assert c.infer("refused_stream", [x]).get_response()["model_name"] == "refused_stream"
        assert _seen(bads, "refused_stream") >= before + 1


def _raw_call(port: int, model: str) -> tuple[socket.socket, h2.connection.H2Connection, int]:
    """A ModelInfer on a raw HTTP/2 connection that acknowledges nothing yet: the client's
    window (65,535 bytes) is all the gateway may send."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "gw"),
                            (":path", "/inference.GRPCInferenceService/ModelInfer"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    message = pb.ModelInferRequest(model_name=model).SerializeToString()
    conn.send_data(sid, struct.pack(">BI", 0, len(message)) + message, end_stream=True)
    sock.sendall(conn.data_to_send())
    return sock, conn, sid


def test_a_client_that_stops_reading_stops_the_backend_and_then_gets_it_all(gw, bads):
    """Flow control reaches through: while the client's window stays shut the backend is held
    at about the gateway's stream window (1 MiB), not the 6 MB answer; opened, all of it comes."""
    sent_before = sum(s.sent for s in bads)
    blocked_before = sum(s.blocked for s in bads)
    sock, conn, sid = _raw_call(int(gw.grpc_url.rsplit(":", 1)[1]), "big_ok")
    try:
        wait_for(lambda: sum(s.blocked for s in bads) > blocked_before, timeout=20,
                 what="the backend waiting for the gateway's window")
        held = sum(s.sent for s in bads) - sent_before
        assert held < 3 << 20, held  # the stream window and a little: not the answer
        body = bytearray()
        trailers: dict[bytes, bytes] = {}
        ended = False
        while not ended:
            data = sock.recv(1 << 20)
            assert data, "the gateway closed the connection"
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    trailers = dict(ev.headers)
                elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                    ended = True
            sock.sendall(conn.data_to_send())
        assert trailers.get(b"grpc-status") == b"0", trailers
        assert bytes(body) == struct.pack(">BI", 0, len(big_answer("big_ok", BIG))) + big_answer("big_ok", BIG)
    finally:
        sock.close()


def test_a_client_that_goes_away_mid_answer_leaves_the_gateway_serving(gw, bads):
    sock, conn, sid = _raw_call(int(gw.grpc_url.rsplit(":", 1)[1]), "big_ok")
    blocked = sum(s.blocked for s in bads)
    wait_for(lambda: sum(s.blocked for s in bads) > blocked, timeout=20, what="the answer under way")
    sock.close()
    for _ in range(3):
        assert _infer_grpc(gw.grpc_url, "big_ok").as_numpy("OUTPUT0").nbytes == BIG


# -- requests ---------------------------------------------------------------------------------
INFER = "/inference.GRPCInferenceService/ModelInfer"


def _big_request(model: str, n: int) -> bytes:
    r = pb.ModelInferRequest(model_name=model, id="up")
    t = r.inputs.add()
    t.name, t.datatype = "INPUT0", "UINT8"
    t.shape.append(n)
    r.raw_input_contents.append((bytes(range(7, 256)) * (n // 249 + 1))[:n])
    return r.SerializeToString()


def _grpc_call(gw, message: bytes) -> bytes:
    with grpc.insecure_channel(gw.grpc_url, options=[("grpc.max_send_message_length", LIMIT),
                                                    ("grpc.max_receive_message_length", LIMIT)]) as ch:
        return ch.unary_unary(INFER)(message, timeout=30)


@pytest.mark.parametrize("n", [STREAM_MIN, 3 << 20, 12 << 20])
def test_a_large_request_reaches_the_backend_byte_for_byte(gw, bads, n):
    message = _big_request("ok", n)
    answer = pb.ModelInferResponse.FromString(_grpc_call(gw, message))
    assert answer.model_name == "ok"
    digests = [d for s in bads for m, d in s.bodies if m == "ok"]
    assert hashlib.sha256(message).hexdigest() in digests


def test_a_routing_field_after_the_raw_contents_is_refused_and_the_backend_never_gets_it(gw, bads):
    """protobuf's last value wins: a model_name after the tensor bytes would route the backend's
    parse elsewhere than the gateway's. The backend's stream is reset before the message ends."""
    message = _big_request("ok", 2 << 20) + b"\x0a\x05other"
    seen, resets = sum(len(s.seen) for s in bads), sum(s.resets for s in bads)
    with pytest.raises(grpc.RpcError) as info:
        _grpc_call(gw, message)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "field 1 of ModelInferRequest follows raw_input_contents" in info.value.details()
    assert sum(len(s.seen) for s in bads) == seen
    wait_for(lambda: sum(s.resets for s in bads) > resets, timeout=10, what="the backend's stream reset")
    assert pb.ModelInferResponse.FromString(_grpc_call(gw, _big_request("ok", 1 << 20))).model_name == "ok"


def _raw_client(gw) -> tuple[socket.socket, h2.connection.H2Connection, int]:
    sock = socket.create_connection(("127.0.0.1", int(gw.grpc_url.rsplit(":", 1)[1])), timeout=30)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "gw"), (":path", INFER),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    sock.sendall(conn.data_to_send())
    return sock, conn, sid


def _send(sock, conn, sid, data: bytes, end: bool) -> int:
    """Sends what the windows allow of ``data`` (reading the gateway's frames while they are shut,
    up to ``patience`` seconds of silence); returns how much went."""
    sent = 0
    sock.settimeout(1.0)
    while sent < len(data):
        room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(data) - sent)
        if room > 0:
            conn.send_data(sid, data[sent:sent + room], end_stream=end and sent + room == len(data))
            sent += room
            sock.sendall(conn.data_to_send())
            continue
        try:
            got = sock.recv(1 << 16)
        except TimeoutError:
            return sent  # the window stayed shut
        if not got:
            return sent
        conn.receive_data(got)
        sock.sendall(conn.data_to_send())
    return sent


def _status(sock, conn) -> dict[bytes, bytes]:
    """Reads to the call's end: its trailers (or trailers-only head)."""
    sock.settimeout(30)
    fields: dict[bytes, bytes] = {}
    while True:
        got = sock.recv(1 << 20)
        assert got, "the gateway closed the connection"
        for ev in conn.receive_data(got):
            if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                fields.update(dict(ev.headers))
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                return fields
        sock.sendall(conn.data_to_send())


@pytest.mark.parametrize("case", ["truncated", "two_messages"])
def test_a_client_that_breaks_its_request_off_gets_internal_and_the_backend_nothing(gw, bads, case):
    message = _big_request("ok", 2 << 20)
    framed = struct.pack(">BI", 0, len(message)) + message
    data = framed[: len(framed) // 2] if case == "truncated" else framed + struct.pack(">BI", 0, 3) + b"abc"
    seen = sum(len(s.seen) for s in bads)
    sock, conn, sid = _raw_client(gw)
    try:
        assert _send(sock, conn, sid, data, True) == len(data)
        fields = _status(sock, conn)
    finally:
        sock.close()
    assert fields.get(b"grpc-status") == b"13", fields
    words = b"the request ended inside a message" if case == "truncated" else b"carries one request message"
    assert words in fields.get(b"grpc-message", b""), fields
    assert sum(len(s.seen) for s in bads) == seen


def test_a_client_that_stops_sending_mid_request_gets_deadline_exceeded_and_the_backend_a_reset(gw, bads):
    """limits.body_timeout_s: the client has its window and sends nothing more. Its own fault
    (DEADLINE_EXCEEDED, the gateway's words); the backend's stream is reset, never completed."""
    message = _big_request("ok", 2 << 20)
    framed = struct.pack(">BI", 0, len(message)) + message
    seen, resets = sum(len(s.seen) for s in bads), sum(s.resets for s in bads)
    sock, conn, sid = _raw_client(gw)
    try:
        assert _send(sock, conn, sid, framed[: len(framed) // 3], False) == len(framed) // 3
        fields = _status(sock, conn)
    finally:
        sock.close()
    assert fields.get(b"grpc-status") == b"4", fields  # DEADLINE_EXCEEDED
    assert b"request message stalled for limits.body_timeout_s" in fields.get(b"grpc-message", b""), fields
    assert sum(len(s.seen) for s in bads) == seen
    wait_for(lambda: sum(s.resets for s in bads) > resets, timeout=10, what="the backend's stream reset")


def test_a_backend_that_stops_reading_stops_the_client(gw, bads):
    """While the backend acknowledges nothing, the client can send the gateway's stream window
    (1 MiB) and the backend's (64 KiB), not the 8 MB request; once it reads on, all of it goes."""
    message = _big_request("ok", 8 << 20)
    framed = struct.pack(">BI", 0, len(message)) + message
    for s in bads:
        s.hold()
    sock, conn, sid = _raw_client(gw)
    try:
        sent = _send(sock, conn, sid, framed, True)
        assert sent < (1 << 20) + (256 << 10), sent  # held back: not the request
        for s in bads:
            s.release()
        sent += _send(sock, conn, sid, framed[sent:], True)
        assert sent == len(framed)
        fields = _status(sock, conn)
    finally:
        for s in bads:
            s.release()
        sock.close()
    assert fields.get(b"grpc-status") == b"0", fields
    assert hashlib.sha256(message).hexdigest() in [d for s in bads for _, d in s.bodies]


def test_a_refused_request_is_sent_again_only_while_it_is_kept_whole(gw, bads):
    """refused_stream: the first backend refuses the stream (RST_STREAM REFUSED_STREAM, RFC 9113
    section 8.7) once it has read the request; the second answers. A request within REWIND_MAX
    goes to the second; a larger one was streamed on and is not kept: the refusal is final."""
    small = _big_request("refused_stream", REWIND_MAX // 2)
    before = sum(s.seen.count("refused_stream") for s in bads)
    for _ in range(2):  # (round robin: one of the two starts at the refusing backend)
        assert pb.ModelInferResponse.FromString(_grpc_call(gw, small)).model_name == "refused_stream"
    # (the refusing one is asked twice: an HTTP/2 client sends a refused stream once more itself)
    assert sum(s.seen.count("refused_stream") for s in bads) == before + 4
    large = _big_request("refused_stream", 4 * REWIND_MAX)
    outcomes = []
    for _ in range(2):
        try:
            _grpc_call(gw, large)
            outcomes.append("ok")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert "not sent again" in err.details() and "refused the stream" in err.details(), err.details()
            outcomes.append("refused")
    assert sorted(outcomes) == ["ok", "refused"]


# -- converting: a gRPC client, an HTTP pool -----------------------------------------------------
@pytest.fixture(scope="module")
def gw_http(reference, tmp_path_factory):
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url], "max_message_bytes": LIMIT}}
    g = GatewayProcess(gateway_config(backends, [{"model": "*", "backend": "ref"}], access_log=True),
                       tmp_path_factory.mktemp("grpc-relay-http"))
    g.start()
    try:
        def ready() -> bool:
            with httpclient.InferenceServerClient(g.http_url) as c:
                return c.is_model_ready("identity_UINT8")

        wait_for(ready, timeout=30, what="gateway readiness")
        yield g
    finally:
        g.stop()


@pytest.mark.parametrize("n", [1000, STREAM_MIN, 5 << 20])
def test_a_large_request_to_an_http_pool_and_its_answer_arrive_whole(gw_http, n):
    """Streamed in, read whole for the conversion; the answer goes out as its pieces (the HTTP
    answer's bytes, no joined message)."""
    data = (np.arange(n) % 251).astype(np.uint8).reshape(1, n)
    x = grpcclient.InferInput("INPUT0", [1, n], "UINT8")
    x.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(gw_http.grpc_url) as c:
        for _ in range(2):
            out = c.infer("identity_UINT8", [x], client_timeout=30)
            assert np.array_equal(out.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
@pytest.mark.parametrize("n", [1000, 3 << 20])
def test_a_compressed_request_is_relayed_compressed(gw, bads, compression, n):
    """grpc-encoding on pass-through: the gateway reads the message to route it, and sends it on
    as the client wrote it — compressed, with its encoding — not inflated."""
    message = _big_request("ok", n)
    before = [len(s.bodies) for s in bads]
    with grpc.insecure_channel(gw.grpc_url, compression=compression,
                               options=[("grpc.max_send_message_length", LIMIT)]) as ch:
        answer = pb.ModelInferResponse.FromString(ch.unary_unary(INFER)(message, timeout=30))
    assert answer.model_name == "ok"
    name = "gzip" if compression == grpc.Compression.Gzip else "deflate"
    new = [(e, d) for s, k in zip(bads, before) for e, (_, d) in zip(s.encodings[k:], s.bodies[k:])]
    assert new == [(name, hashlib.sha256(message).hexdigest())]
