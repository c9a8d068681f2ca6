"""A large gRPC answer is relayed as it arrives (issue 38, backends/h2stream.py ``Relay``):
the gateway passes a ModelInferResponse of RELAY_MIN bytes or more on to the client a piece at
a time, acknowledging the backend's bytes only as the client takes them, so it never holds the
whole message and a client that stops reading stops the backend. Proven with tritonclient and
a raw HTTP/2 client against backends of tests/support/badgrpc.py that answer big and then break
the rules half-way: each ends the client's call with a clear error naming the backend, nothing
is sent again once a byte has reached the client, and the gateway keeps serving."""
from __future__ import annotations

import socket
import struct

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
    with BadGrpc(big=BIG) as a, BadGrpc(big=BIG) as b:
        yield a, b


@pytest.fixture(scope="module")
def gw(bads, tmp_path_factory):
    backends = {"bad": {"protocol": "grpc", "endpoints": [s.address for s in bads], "max_message_bytes": LIMIT,
                        "timeout_s": 10, "retries": 2}}
    g = GatewayProcess(gateway_config(backends, [{"model": "*", "backend": "bad"}], access_log=True),
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
