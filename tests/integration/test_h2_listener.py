"""The gateway's own gRPC listener (frontend/h2listen.py on gateway/h2's libnghttp2) against
hostile HTTP/2 clients on raw sockets: rapid reset (CVE-2023-44487), CONTINUATION flood
(CVE-2024-27316 class), SETTINGS / PING / WINDOW_UPDATE floods, an HPACK bomb, a request that
never ends, a window that never opens. After each, the gateway still answers a real client and
its memory stays bounded. Plus the gRPC framing answers grpc.aio's server gave: 415 for a
non-gRPC content type, UNIMPLEMENTED for an unknown method, a message over the limit refused
from its prefix.
"""
from __future__ import annotations

import socket
import struct
import time

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from gateway import h2 as gh2
from tests.conftest import start_gateway

pytestmark = pytest.mark.skipif(not gh2.native("server"), reason="the gateway's own HTTP/2 listener is not in use")

METHOD = "/inference.GRPCInferenceService/ServerLive"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture(scope="module")
def gw(reference, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("h2listen"), reference.http_url, reference.grpc_url, "grpc",
                      limits={"body_timeout_s": 1, "idle_timeout_s": 2, "max_grpc_streams": 64},
                      max_message_bytes=1 << 20)
    yield g
    g.stop()


def addr(gw) -> tuple[str, int]:
    host, port = gw.grpc_url.rsplit(":", 1)
    return host, int(port)


def live(gw) -> bool:
    from gateway._pb import grpc_predict_v2_pb2 as pb
    from gateway._pb import grpc_predict_v2_pb2_grpc as pbg

    with grpc.insecure_channel(gw.grpc_url) as ch:
        return pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=10).live


def rss_mb(gw) -> float:
    with open(f"/proc/{gw.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload


def headers_block(path: str = METHOD, extra: list[tuple[str, str]] | None = None) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "gw"), ("content-type", "application/grpc"), ("te", "trailers"),
                                   *(extra or [])])


def open_raw(gw, settings: bytes = b"") -> socket.socket:
    s = socket.create_connection(addr(gw), timeout=10)
    s.sendall(PREFACE + frame(4, 0, 0, settings))
    return s


def read_until_closed(s: socket.socket, limit_s: float = 10) -> bytes:
    """Everything the gateway sends until it closes the connection (bounded in time)."""
    got = bytearray()
    deadline = time.monotonic() + limit_s
    s.settimeout(limit_s)
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while len(data) - pos >= 9:
        n = int.from_bytes(data[pos:pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
        out.append((kind, flags, sid, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def goaway_code(data: bytes) -> int | None:
    for kind, _, _, payload in frames(data):
        if kind == 7:
            return int.from_bytes(payload[4:8], "big")
    return None


ENHANCE_YOUR_CALM = 11


def test_rapid_reset_is_cut_off(gw):
    s = open_raw(gw)
    block = headers_block()
    burst = b"".join(frame(1, 0x4, sid, block) + frame(3, 0, sid, struct.pack(">I", 8))
                     for sid in range(1, 4001, 2))
    try:
        s.sendall(burst)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = read_until_closed(s)
    s.close()
    assert goaway_code(got) == ENHANCE_YOUR_CALM
    assert live(gw)
    assert refusals(gw, "flood_rst_stream") >= 1


def refusals(gw, reason: str) -> float:
    """oip_gateway_refusals_total{protocol="grpc",reason=...} from the gateway's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    want = f'oip_gateway_refusals_total{{protocol="grpc",reason="{reason}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(want))


@pytest.mark.parametrize("kind,payload,count", [
    (4, b"", 2000),  # SETTINGS
    (6, b"12345678", 5000),  # PING
    (8, struct.pack(">I", 1), 50000),  # WINDOW_UPDATE on the connection
])
def test_control_frame_floods_are_cut_off(gw, kind, payload, count):
    s = open_raw(gw)
    try:
        s.sendall(frame(kind, 0, 0, payload) * count)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = read_until_closed(s)
    s.close()
    assert goaway_code(got) == ENHANCE_YOUR_CALM
    assert live(gw)


def test_continuation_flood_is_cut_off(gw):
    s = open_raw(gw)
    block = headers_block()
    data = frame(1, 0x4 & 0, 1, block[:5]) + frame(9, 0, 1, b"") * 10000
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    start = time.monotonic()
    read_until_closed(s)
    s.close()
    assert time.monotonic() - start < 9, "the connection was not closed"
    assert live(gw)


def test_an_hpack_bomb_resets_the_stream_not_the_gateway(gw):
    """One 4 KB header in the dynamic table, then a block naming it 1,000 times (a few bytes each):
    4 MB decoded from 1 KB. The header-list limit resets the stream before Python sees it."""
    enc = hpack.Encoder()
    first = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "gw"),
                        ("content-type", "application/grpc"), ("x-bomb", "b" * 4000)])
    bomb = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "gw"),
                       ("content-type", "application/grpc")]) + bytes([0x80 | 62]) * 1000  # 62: x-bomb
    s = open_raw(gw)
    msg = b"\x00\x00\x00\x00\x00"
    before = rss_mb(gw)
    s.sendall(frame(1, 0x4, 1, first) + frame(0, 0x1, 1, msg) + frame(1, 0x4, 3, bomb) + frame(0, 0x1, 3, msg))
    got = bytearray()
    s.settimeout(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got += s.recv(65536)
        fs = frames(bytes(got))
        if any(k == 3 and sid == 3 for k, _, sid, _ in fs) and any(k == 1 and sid == 1 and f & 1
                                                                  for k, f, sid, _ in fs):
            break
    s.close()
    fs = frames(bytes(got))
    assert any(k == 3 and sid == 3 for k, _, sid, _ in fs), "the bomb's stream was not reset"
    assert any(k == 1 and sid == 1 for k, _, sid, _ in fs), "the honest stream was not answered"
    assert rss_mb(gw) - before < 50
    assert live(gw)


def test_a_request_that_never_ends_is_answered_and_let_go(gw):
    s = open_raw(gw)
    s.sendall(frame(1, 0x4, 1, headers_block()) + frame(0, 0, 1, b"\x00\x00\x00\x00\x10ab"))
    got = read_until_closed(s, 10)  # the stall sweep answers, then the idle sweep closes
    s.close()
    blocks = [p for k, f, sid, p in frames(got) if k == 1 and sid == 1]
    assert blocks, "the stalled call got no status"
    headers = dict(hpack.Decoder().decode(blocks[0]))
    assert headers["grpc-status"] == "4"  # DEADLINE_EXCEEDED
    assert "body_timeout_s" in headers["grpc-message"]
    assert live(gw)


def test_a_window_that_never_opens_is_closed_when_idle(gw):
    """A client that announces a zero window and never reads an answer: the connection goes at
    idle_timeout_s, with what was queued for it."""
    s = open_raw(gw, struct.pack(">HI", 4, 0))  # SETTINGS_INITIAL_WINDOW_SIZE = 0
    body = b"\x00\x00\x00\x00\x00"
    for sid in range(1, 40, 2):
        s.sendall(frame(1, 0x4, sid, headers_block()) + frame(0, 0x1, sid, body))
    start = time.monotonic()
    read_until_closed(s, 15)
    s.close()
    assert time.monotonic() - start < 12
    assert live(gw)


def test_grpc_framing_answers(gw):
    """415 for a non-gRPC content type; UNIMPLEMENTED for an unknown method; a message over
    max_message_bytes refused from its prefix (grpc's words); a malformed grpc-timeout refused."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s = socket.create_connection(addr(gw), timeout=10)
    def head(path: str, content_type: str = "application/grpc", *extra: tuple[str, str]) -> list[tuple[str, str]]:
        return [(":method", "POST"), (":scheme", "http"), (":authority", "gw"), (":path", path), ("te", "trailers"),
                ("content-type", content_type), *extra]

    conn.send_headers(1, head(METHOD, "application/json"), end_stream=True)
    conn.send_headers(3, head("/no.Such/Method"))
    conn.send_data(3, b"\x00\x00\x00\x00\x00", end_stream=True)
    conn.send_headers(5, head("/inference.GRPCInferenceService/ModelInfer"))
    conn.send_data(5, b"\x00" + (1 << 30).to_bytes(4, "big") + b"x" * 100)
    conn.send_headers(7, head(METHOD, "application/grpc", ("grpc-timeout", "1x")))
    conn.send_data(7, b"\x00\x00\x00\x00\x00", end_stream=True)
    s.sendall(conn.data_to_send())
    answers: dict[int, dict[str, str]] = {}
    deadline = time.monotonic() + 10
    while len(answers) < 4 and time.monotonic() < deadline:
        for ev in conn.receive_data(s.recv(65536)):
            if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                answers.setdefault(ev.stream_id, {}).update(
                    {k.decode(): v.decode() for k, v in ev.headers})
        s.sendall(conn.data_to_send())
    s.close()
    assert answers[1][":status"] == "415"
    assert answers[3]["grpc-status"] == "12" and answers[3]["grpc-message"] == "Method not found!"
    assert answers[5]["grpc-status"] == "8"
    assert answers[5]["grpc-message"] == f"Received message larger than max ({1 << 30} vs. {1 << 20})"
    assert answers[7]["grpc-status"] == "13" and "grpc-timeout" in answers[7]["grpc-message"]


def test_many_streams_on_one_connection(gw):
    """More concurrent calls than max_grpc_streams (64) on one grpcio channel: the client queues
    the excess (SETTINGS_MAX_CONCURRENT_STREAMS), every call is answered."""
    import asyncio

    from gateway._pb import grpc_predict_v2_pb2 as pb

    async def many() -> list[bytes]:
        async with grpc.aio.insecure_channel(gw.grpc_url) as ch:
            call = ch.unary_unary(METHOD)
            return await asyncio.gather(*(call(pb.ServerLiveRequest().SerializeToString(), timeout=30)
                                          for _ in range(300)))

    answers = asyncio.run(many())
    assert all(pb.ServerLiveResponse.FromString(a).live for a in answers)


def _patient(reference, tmp_path_factory, backend: str):
    """A gateway that waits a minute for a request's end (body_timeout_s), 1 MiB messages."""
    g = start_gateway(tmp_path_factory.mktemp(f"h2patient-{backend}"), reference.http_url, reference.grpc_url,
                      backend, limits={"body_timeout_s": 60, "max_grpc_streams": 128}, max_message_bytes=1 << 20)
    yield g
    g.stop()


@pytest.fixture(scope="module")
def patient(reference, tmp_path_factory):
    yield from _patient(reference, tmp_path_factory, "grpc")


@pytest.fixture(scope="module")
def patient_http(reference, tmp_path_factory):
    """As ``patient``, routing to an HTTP pool: a large gRPC request is read whole to be converted."""
    yield from _patient(reference, tmp_path_factory, "http")


def _infer_message(n: int) -> bytes:
    """A ModelInferRequest of about ``n`` bytes: a head, then one raw_input_contents."""
    from gateway._pb import grpc_predict_v2_pb2 as pb

    r = pb.ModelInferRequest(model_name="identity_UINT8")
    t = r.inputs.add()
    t.name, t.datatype = "INPUT0", "UINT8"
    t.shape.extend([1, n - 100])
    r.raw_input_contents.append(b"\x07" * (n - 100))
    return r.SerializeToString()


@pytest.mark.parametrize("case", ["unparsable", "streamed_to_grpc", "read_whole_for_http"])
def test_one_connection_cannot_hold_a_message_per_stream(patient, patient_http, case):
    """60 unary calls on one connection, each sending most of a 1 MiB message and never its end:
    the listener stops giving window back once its requests hold its budget (16 MiB here), so the
    client cannot push 60 MiB into it — then stalls, and the gateway serves others. Whatever the
    message: one whose head cannot be told apart (received whole), one streamed to a gRPC pool
    (held back by the backend's window, frontend/h2upload.py), one read whole for an HTTP pool."""
    gw = patient_http if case == "read_whole_for_http" else patient
    message = None if case == "unparsable" else _infer_message((1 << 20) - 64)
    rss = _rss(gw)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s = socket.create_connection(addr(gw), timeout=10)
    s.sendall(conn.data_to_send())
    head = [(":method", "POST"), (":scheme", "http"), (":authority", "gw"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"), ("te", "trailers"),
            ("content-type", "application/grpc")]
    streams = list(range(1, 121, 2))
    left = {}
    for sid in streams:
        conn.send_headers(sid, head)
        if message is None:
            left[sid] = b"\x00" + (1 << 20).to_bytes(4, "big") + b"\x07" * ((1 << 20) - 100)
        else:
            left[sid] = b"\x00" + len(message).to_bytes(4, "big") + message[:-100]
    s.sendall(conn.data_to_send())
    sent = 0
    idle_since = time.monotonic()
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline and time.monotonic() - idle_since < 2:
        progressed = False
        for sid in list(left):
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if room <= 0:
                continue
            chunk, left[sid] = left[sid][:room], left[sid][room:]
            conn.send_data(sid, chunk)
            sent += len(chunk)
            progressed = True
            if not left[sid]:
                del left[sid]
        s.sendall(conn.data_to_send())
        # While there is room to send, read only what is already there; once there is none, wait
        # for the gateway's WINDOW_UPDATEs (up to 0.5 s a turn, 2 s without progress in all).
        s.settimeout(0 if progressed else 0.5)
        try:
            data = s.recv(65536)
        except (TimeoutError, BlockingIOError):
            data = b""
        finally:
            s.settimeout(10)  # sendall waits for room
        if data:
            conn.receive_data(data)
            s.sendall(conn.data_to_send())
        if progressed:
            idle_since = time.monotonic()
    total = len(streams) << 20
    if case == "streamed_to_grpc":
        # Each went on to the backend as it came (which holds them, unfinished): the gateway only
        # passed them through.
        assert sent > 50 << 20, f"{sent} of {total} bytes taken in"
        assert _rss(gw) < rss + (24 << 20), (rss, _rss(gw))
    else:
        assert left, "every byte went in: nothing bounded what one connection holds"
        assert sent < 40 << 20, f"{sent} of {total} bytes taken in"
    assert live(gw)
    s.close()


def _rss(gw) -> int:
    with open(f"/proc/{gw.proc.pid}/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
