"""gateway.h2._h2, the HTTP/2 connections on libnghttp2 (gateway/h2/_h2.c, docs/h2-design.md).

The peers are the pure-Python ``h2`` package (both sides), raw frames for what no honest peer sends
(floods, CONTINUATION abuse, HPACK bombs), the extension's other side, and a grpcio client over a
real socket on uvloop.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import os
import struct
import sys
import sysconfig
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import h2 as gh2

if not gh2.available():
    pytest.skip("gateway.h2._h2 is not built (no libnghttp2-dev, or OIP_GATEWAY_H2=0)", allow_module_level=True)

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack

from gateway.h2 import _h2

HEAD, DATA, TRAILERS, CLOSE = _h2.HEAD, _h2.DATA, _h2.TRAILERS, _h2.CLOSE
WRITABLE, GOAWAY, DEAD, PING_ACK, SETTINGS = _h2.WRITABLE, _h2.GOAWAY, _h2.DEAD, _h2.PING_ACK, _h2.SETTINGS

METHOD = b"/inference.GRPCInferenceService/ModelInfer"
REQ_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"backend"),
    (b":path", METHOD),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]
RESP_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
RESP_TRAILERS = [(b"grpc-status", b"0")]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


RESP_MSG = grpc_message(b"\x0a\x12" + b"x" * 18)

# --------------------------------------------------------------------------------------------
# helpers


def joined(out) -> bytes:
    return b"".join(bytes(x) for x in out) if out else b""


def flush_bytes(conn) -> bytes:
    return joined(conn.flush())


def h2_client(**settings_) -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    if settings_:
        c.update_settings(settings_)
    return c


def h2_server() -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    c.initiate_connection()
    return c


class Pair:
    """Our connection against an h2 peer, pumping bytes both ways until both are quiet."""

    def __init__(self, ours, peer):
        self.ours, self.peer = ours, peer
        self.events: list = []  # ours
        self.peer_events: list = []

    def pump(self, rounds: int = 100) -> tuple[list, list]:
        evs, pevs = [], []
        for _ in range(rounds):
            moved = False
            data = self.peer.data_to_send()
            if data:
                moved = True
                evs += self.ours.feed(data)
            out = flush_bytes(self.ours)
            evs += self.ours.poll()
            if out:
                moved = True
                pevs += self.peer.receive_data(out)
            if not moved:
                break
        self.events += evs
        self.peer_events += pevs
        return evs, pevs


def native_pump(a, b, rounds: int = 1000) -> tuple[list, list]:
    """Two of our connections against each other: (events of a, events of b)."""
    ea, eb = [], []
    for _ in range(rounds):
        oa, ob = flush_bytes(a), flush_bytes(b)
        ea += a.poll()
        eb += b.poll()
        if not oa and not ob:
            break
        if oa:
            eb += b.feed(oa)
        if ob:
            ea += a.feed(ob)
    return ea, eb


def of_kind(events, kind) -> list:
    return [e for e in events if e[0] == kind]


def body_of(events, sid) -> bytes:
    return b"".join(e[2] for e in events if e[0] == DATA and e[1] == sid)


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame in a server's output."""
    out, i = [], 0
    while i + 9 <= len(data):
        n = int.from_bytes(data[i : i + 3], "big")
        sid = int.from_bytes(data[i + 5 : i + 9], "big") & 0x7FFFFFFF
        out.append((data[i + 3], data[i + 4], sid, data[i + 9 : i + 9 + n]))
        i += 9 + n
    return out


def goaway_of(data: bytes) -> tuple[int, int] | None:
    """(last stream id, error code) of the last GOAWAY in ``data``."""
    found = None
    for ftype, _, _, payload in frames_of(data):
        if ftype == 7:
            found = (int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"))
    return found


def resets_of(data: bytes) -> dict[int, int]:
    return {sid: int.from_bytes(p, "big") for t, _, sid, p in frames_of(data) if t == 3}


def raw_server(**limits) -> tuple[_h2.ServerConnection, hpack.Encoder]:
    """A server that has read a bare client preface (magic + empty SETTINGS)."""
    srv = _h2.ServerConnection(**limits)
    # no SETTINGS_MAX_CONCURRENT_STREAMS: no limit (RFC 9113 section 6.5.2)
    assert srv.feed(PREFACE + frame(4, 0, 0)) == [(SETTINGS, 2**32 - 1)]
    flush_bytes(srv)
    return srv, hpack.Encoder()


def header_frames(sid: int, block: bytes, end_stream: bool = False) -> bytes:
    """HEADERS (+ CONTINUATION) frames of at most 16384 bytes carrying ``block``."""
    parts = [block[i : i + 16384] for i in range(0, len(block), 16384)] or [b""]
    out = b""
    for i, part in enumerate(parts):
        last = 0x4 if i == len(parts) - 1 else 0
        out += frame(1, last | (0x1 if end_stream else 0), sid, part) if i == 0 else frame(9, last, sid, part)
    return out


def raw_request(enc: hpack.Encoder, sid: int, end_stream: bool = False, extra=()) -> bytes:
    return header_frames(sid, enc.encode(REQ_HEADERS + list(extra)), end_stream)


def h2_send(conn: h2.connection.H2Connection, sid: int, data: bytes, end_stream: bool = False) -> None:
    """h2's send_data, cut to its outbound frame size."""
    step = conn.max_outbound_frame_size
    for i in range(0, len(data), step):
        conn.send_data(sid, data[i : i + step], end_stream=end_stream and i + step >= len(data))


def settle_unary(srv, events):
    """The server side of a unary gRPC exchange: answer every finished request."""
    for ev in events:
        if ev[0] == DATA:
            srv.consume(ev[1], len(ev[2]))
        if (ev[0] in (HEAD, DATA) and ev[3]) or ev[0] == TRAILERS:
            srv.respond(ev[1], RESP_HEADERS, RESP_MSG, RESP_TRAILERS)


# --------------------------------------------------------------------------------------------
# the module


def test_extension_is_fresh():
    """The .so is no older than _h2.c (else the tests would test the code as it was): rebuild with
    `OIP_GATEWAY_COMPILE=0 .venv/bin/python setup.py build_ext --inplace` or `pip install -e .`."""
    src = Path(_h2.__file__).with_name("_h2.c")
    assert Path(_h2.__file__).name.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    assert src.stat().st_mtime_ns <= Path(_h2.__file__).stat().st_mtime_ns


def test_module_surface():
    assert [HEAD, DATA, TRAILERS, CLOSE, WRITABLE, GOAWAY, DEAD, PING_ACK, SETTINGS] == list(range(1, 10))
    codes = (_h2.NO_ERROR, _h2.PROTOCOL_ERROR, _h2.INTERNAL_ERROR, _h2.FLOW_CONTROL_ERROR, _h2.STREAM_CLOSED,
             _h2.REFUSED_STREAM, _h2.CANCEL, _h2.ENHANCE_YOUR_CALM)
    assert codes == (0, 1, 2, 3, 5, 7, 8, 11)  # RFC 9113 section 7
    assert issubclass(_h2.H2Error, Exception) and _h2.H2Error.code == 0
    assert issubclass(_h2.ServerConnection, _h2.Connection) and issubclass(_h2.ClientConnection, _h2.Connection)
    assert _h2.NGHTTP2_VERSION.startswith("1.")
    if _h2.NGHTTP2_VERSION == "1.52.0" and os.path.exists("/usr/share/doc/libnghttp2-14/changelog.Debian.gz"):
        # Debian bookworm's backports (docs/h2-design.md, "Versions")
        assert {"max_continuations", "stream_reset_rate_limit"} <= set(_h2.FEATURES)
    with pytest.raises(TypeError):
        _h2.Connection()
    with pytest.raises(TypeError, match="unknown limit"):
        _h2.ServerConnection(max_streams=3)
    with pytest.raises(TypeError):
        _h2.ServerConnection(100)
    with pytest.raises(TypeError):
        _h2.ServerConnection(max_concurrent_streams="100")
    with pytest.raises(ValueError, match="max_frame_size"):
        _h2.ServerConnection(max_frame_size=1000)
    with pytest.raises(ValueError, match="initial_window_size"):
        _h2.ClientConnection(initial_window_size=2**31)
    with pytest.raises(ValueError):
        _h2.ClientConnection(ping_burst=-1)


def test_stub_matches_the_extension():
    """_h2.pyi (what mypy reads) has the extension's names, signatures and defaults."""
    import subprocess

    run = subprocess.run([sys.executable, "-m", "mypy.stubtest", "gateway.h2._h2"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_signature_defaults_are_the_defaults():
    import inspect

    for cls in (_h2.ServerConnection, _h2.ClientConnection):
        params = inspect.signature(cls).parameters
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
        explicit = cls(**{name: p.default for name, p in params.items()})
        assert flush_bytes(explicit) == flush_bytes(cls())
        # every limit is a keyword the constructor knows
        for name, p in params.items():
            cls(**{name: p.default})


# --------------------------------------------------------------------------------------------
# handshakes


def test_server_handshake_advertises_the_limits():
    srv = _h2.ServerConnection(max_concurrent_streams=7, initial_window_size=300000, max_header_list_size=9000,
                               connection_window_size=4 << 20)
    p = Pair(srv, h2_client())
    evs, pevs = p.pump()
    assert evs == [(SETTINGS, 100)]
    changed = next(e for e in pevs if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert changed[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 7
    assert changed[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE].new_value == 300000
    assert changed[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 9000
    assert p.peer.outbound_flow_control_window == 4 << 20
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in pevs)
    assert srv.want_read and not srv.want_write and srv.open_streams == 0


def test_client_handshake():
    cli = _h2.ClientConnection()
    out = flush_bytes(cli)
    assert out.startswith(PREFACE)
    p = Pair(cli, h2_server())
    pevs = p.peer.receive_data(out)
    changed = next(e for e in pevs if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert changed[h2.settings.SettingCodes.ENABLE_PUSH].new_value == 0
    assert changed[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE].new_value == 1 << 20
    evs, _ = p.pump()
    assert evs == [(SETTINGS, p.peer.local_settings.max_concurrent_streams)]
    assert cli.remote_max_concurrent_streams == p.peer.local_settings.max_concurrent_streams
    assert cli.can_request()


def test_bad_preface_raises_and_queues_goaway():
    srv = _h2.ServerConnection()
    with pytest.raises(_h2.H2Error) as err:
        srv.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert err.value.code < 0
    assert goaway_of(flush_bytes(srv))[1] == _h2.PROTOCOL_ERROR
    assert not srv.want_read
    with pytest.raises(_h2.H2Error):
        srv.feed(b"more")


# --------------------------------------------------------------------------------------------
# unary exchanges


def test_unary_server_against_h2_client():
    p = Pair(_h2.ServerConnection(), h2_client())
    p.pump()
    cli, srv = p.peer, p.ours
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    cli.send_data(sid, grpc_message(b"hello"), end_stream=True)
    evs, _ = p.pump(1)
    assert evs == [(HEAD, sid, REQ_HEADERS, False), (DATA, sid, grpc_message(b"hello"), True)]
    assert isinstance(evs[1][2], bytes)
    srv.consume(sid, 10)
    assert srv.respond(sid, RESP_HEADERS, RESP_MSG, RESP_TRAILERS) is True
    evs, pevs = p.pump()
    assert evs == []
    kinds = [type(e) for e in pevs if not isinstance(e, h2.events.WindowUpdated)]
    ev = h2.events
    assert kinds == [ev.ResponseReceived, ev.DataReceived, ev.TrailersReceived, ev.StreamEnded]
    assert pevs[0].headers == RESP_HEADERS
    assert next(e for e in pevs if isinstance(e, h2.events.DataReceived)).data == RESP_MSG
    assert next(e for e in pevs if isinstance(e, h2.events.TrailersReceived)).headers == RESP_TRAILERS
    assert srv.open_streams == 0 and srv.respond(sid, RESP_HEADERS) is False


def test_unary_client_against_h2_server():
    p = Pair(_h2.ClientConnection(), h2_server())
    cli, srv = p.ours, p.peer
    sid = cli.request(REQ_HEADERS, grpc_message(b"hello"))
    assert sid == 1 and cli.open_streams == 1
    _, pevs = p.pump()
    req = next(e for e in pevs if isinstance(e, h2.events.RequestReceived))
    assert req.headers == REQ_HEADERS and req.stream_id == sid
    assert next(e for e in pevs if isinstance(e, h2.events.DataReceived)).data == grpc_message(b"hello")
    assert any(isinstance(e, h2.events.StreamEnded) for e in pevs)
    srv.send_headers(sid, RESP_HEADERS)
    srv.send_data(sid, RESP_MSG)
    srv.send_headers(sid, RESP_TRAILERS, end_stream=True)
    evs, _ = p.pump()
    assert evs == [(HEAD, sid, RESP_HEADERS, False), (DATA, sid, RESP_MSG, False), (TRAILERS, sid, RESP_TRAILERS)]
    assert cli.open_streams == 0


def test_unary_native_both_sides_multiplexed():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sids = [cli.request(REQ_HEADERS, grpc_message(b"req %d" % i)) for i in range(60)]
    assert sids == list(range(1, 121, 2))
    got: dict[int, bytes] = {}
    answers: list = []
    for _ in range(50):
        oc = flush_bytes(cli)
        if oc:
            evs = srv.feed(oc)
            for ev in evs:
                if ev[0] == DATA:
                    got[ev[1]] = got.get(ev[1], b"") + ev[2]
            settle_unary(srv, evs)
        os_ = flush_bytes(srv)
        if os_:
            answers += cli.feed(os_)
        if not oc and not os_:
            break
    assert got == {sid: grpc_message(b"req %d" % i) for i, sid in enumerate(sids)}
    for sid in sids:
        mine = [e for e in answers if len(e) > 1 and e[1] == sid]
        assert mine == [(HEAD, sid, RESP_HEADERS, False), (DATA, sid, RESP_MSG, False), (TRAILERS, sid, RESP_TRAILERS)]
    assert not of_kind(answers, CLOSE)
    assert srv.open_streams == 0 and cli.open_streams == 0


def test_trailers_only_answer_is_one_headers_frame():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, grpc_message(b"x"))
    native_pump(srv, cli)
    status = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"5"),
              (b"grpc-message", b"nope")]
    assert srv.respond(sid, status) is True
    out = flush_bytes(srv)
    assert [(t, f & 1) for t, f, s, _ in frames_of(out) if s == sid] == [(1, 1)]  # HEADERS + END_STREAM
    assert cli.feed(out) == [(HEAD, sid, status, True)]
    assert cli.open_streams == 0


def test_respond_without_body_with_trailers():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"")
    native_pump(srv, cli)
    srv.respond(sid, RESP_HEADERS, None, RESP_TRAILERS)
    out = flush_bytes(srv)
    assert [(t, f & 1) for t, f, s, _ in frames_of(out) if s == sid] == [(1, 0), (1, 1)]
    assert cli.feed(out) == [(HEAD, sid, RESP_HEADERS, False), (TRAILERS, sid, RESP_TRAILERS)]


def test_request_without_body_and_get():
    p = Pair(_h2.ClientConnection(), h2_server())
    sid = p.ours.request([(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a"), (b":path", b"/")])
    _, pevs = p.pump()
    req = next(e for e in pevs if isinstance(e, h2.events.RequestReceived))
    assert req.stream_ended is not None and req.stream_id == sid


def test_respond_twice_and_bad_headers():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"x")
    native_pump(srv, cli)
    with pytest.raises(ValueError, match="name"):
        srv.respond(sid, [(b":status", b"200"), (b"Content-Type", b"x")])
    with pytest.raises(ValueError, match="value"):
        srv.respond(sid, [(b":status", b"200"), (b"grpc-message", b"a\r\nb: c")])
    with pytest.raises(TypeError):
        srv.respond(sid, [(":status", "200")])
    with pytest.raises(TypeError):
        srv.respond(sid, {b":status": b"200"})
    with pytest.raises(TypeError):
        srv.respond(sid, RESP_HEADERS, "text body")
    assert srv.respond(sid, RESP_HEADERS, RESP_MSG, RESP_TRAILERS)
    with pytest.raises(_h2.H2Error, match="already"):
        srv.respond(sid, RESP_HEADERS)
    with pytest.raises(_h2.H2Error, match="ended"):
        srv.send_data(sid, b"more")
    assert srv.respond(999, RESP_HEADERS) is False  # unknown stream: gone, not an error
    with pytest.raises(ValueError):
        srv.respond(0, RESP_HEADERS)


def test_many_headers_and_shared_names():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    many = REQ_HEADERS + [(b"x-h%d" % i, b"v%d" % i) for i in range(60)]
    a = cli.request(many, b"")
    b = cli.request(REQ_HEADERS, b"")
    evs, _ = native_pump(srv, cli)
    heads = of_kind(evs, HEAD)
    assert heads[0][2] == many
    # the names and values every gRPC message carries are shared objects, not new bytes each time
    assert heads[0][2][0][0] is heads[1][2][0][0] and heads[0][2][4][1] is heads[1][2][4][1]
    resp = [(b":status", b"200")] + [(b"x-r%d" % i, b"w" * i) for i in range(50)]
    srv.respond(a, resp)
    srv.respond(b, RESP_HEADERS)
    _, cevs = native_pump(srv, cli)
    assert of_kind(cevs, HEAD)[0][2] == resp


# --------------------------------------------------------------------------------------------
# flow control, large bodies, zero copy


def test_peer_cannot_send_past_the_window_without_consume():
    p = Pair(_h2.ServerConnection(), h2_client())
    p.pump()
    cli, srv = p.peer, p.ours
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    body = os.urandom(12 << 20)
    sent, consumed, ended = 0, 0, False
    received = bytearray()

    def send_what_the_window_allows():
        nonlocal sent
        n = min(cli.local_flow_control_window(sid), len(body) - sent)
        if n:
            h2_send(cli, sid, body[sent : sent + n], end_stream=sent + n == len(body))
            sent += n

    def receive():
        nonlocal ended
        evs, _ = p.pump()
        for ev in evs:
            if ev[0] == DATA:
                received.extend(ev[2])
                ended = ended or ev[3]

    for _ in range(5):
        send_what_the_window_allows()
        receive()
    # no consume(): the peer stopped at the stream's initial window
    assert len(received) == sent == 1 << 20
    assert cli.local_flow_control_window(sid) == 0
    # consume() reopens it (a WINDOW_UPDATE per half window), and everything arrives
    for _ in range(1000):
        srv.consume(sid, len(received) - consumed)
        consumed = len(received)
        receive()
        send_what_the_window_allows()
        receive()
        if ended:
            break
    assert ended and bytes(received) == body


def test_overrunning_the_window_is_a_flow_control_error():
    srv, enc = raw_server(initial_window_size=1000)
    srv.feed(frame(4, 1, 0))  # ACK our SETTINGS: the 1000-byte window now applies
    evs = srv.feed(raw_request(enc, 1))
    assert of_kind(evs, HEAD)
    evs = srv.feed(frame(0, 0, 1, b"a" * 1000))
    assert body_of(evs, 1) == b"a" * 1000
    srv.feed(frame(0, 0, 1, b"b"))  # one byte past the window
    out = flush_bytes(srv)
    assert resets_of(out) == {1: _h2.FLOW_CONTROL_ERROR} or goaway_of(out)[1] == _h2.FLOW_CONTROL_ERROR
    assert (CLOSE, 1, _h2.FLOW_CONTROL_ERROR) in srv.poll() + srv.feed(b"")


def test_connection_window_bounds_all_streams():
    p = Pair(_h2.ServerConnection(connection_window_size=3 << 20), h2_client())
    p.pump()
    cli = p.peer
    sids = []
    for _ in range(5):
        sid = cli.get_next_available_stream_id()
        cli.send_headers(sid, REQ_HEADERS)
        sids.append(sid)
    for sid in sids:  # each stream's window is 1 MiB, the connection's 3 MiB
        h2_send(cli, sid, b"z" * cli.local_flow_control_window(sid))
    assert cli.outbound_flow_control_window == 0
    evs, _ = p.pump()
    assert sum(len(e[2]) for e in evs if e[0] == DATA) == 3 << 20


def test_large_response_goes_out_zero_copy():
    p = Pair(_h2.ServerConnection(), h2_client())
    p.pump()
    cli, srv = p.peer, p.ours
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS, end_stream=True)
    p.pump()
    body = grpc_message(os.urandom(12 << 20))
    assert srv.respond(sid, RESP_HEADERS, body, RESP_TRAILERS)
    assert srv.buffered(sid) == len(body)
    got = bytearray()
    views = 0
    ended = False
    for _ in range(10000):
        out = srv.flush()
        if out:
            for item in out:
                if isinstance(item, memoryview):
                    views += 1
                    assert item.obj is body  # a slice of the very object handed in
            for ev in cli.receive_data(joined(out)):
                if isinstance(ev, h2.events.DataReceived):
                    got += ev.data
                    cli.acknowledge_received_data(ev.flow_controlled_length, sid)
                ended = ended or isinstance(ev, h2.events.StreamEnded)
        data = cli.data_to_send()
        if data:
            srv.feed(data)
        if ended:
            break
    assert ended and bytes(got) == body
    assert views >= len(body) // 16384
    assert srv.buffered(sid) == 0 and srv.open_streams == 0


def test_a_finished_body_gets_no_writable_event():
    srv = _h2.ServerConnection(write_low_water=1000)
    p = Pair(srv, h2_client())
    p.pump()
    cli = p.peer
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS, end_stream=True)
    p.pump()
    srv.respond(sid, RESP_HEADERS, b"r" * 200_000, RESP_TRAILERS)
    seen = []
    for _ in range(100):
        evs, pevs = p.pump()
        seen += evs
        for ev in pevs:
            if isinstance(ev, h2.events.DataReceived):
                cli.acknowledge_received_data(ev.flow_controlled_length, sid)
        if any(isinstance(ev, h2.events.StreamEnded) for ev in pevs):
            break
    assert seen == [] and srv.open_streams == 0


def test_small_body_is_copied_into_one_write():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"x")
    native_pump(srv, cli)
    srv.respond(sid, RESP_HEADERS, RESP_MSG, RESP_TRAILERS)
    out = srv.flush()
    assert len(out) == 1 and isinstance(out[0], bytes)


def test_native_12mib_both_ways_with_consume():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    req = grpc_message(os.urandom(12 << 20))
    sid = cli.request(REQ_HEADERS, bytearray(req))  # a bytearray: held pinned until sent
    got_req, got_resp = [], []
    done = False
    for _ in range(5000):
        oc = cli.flush()
        if oc:
            for ev in srv.feed(joined(oc)):
                if ev[0] == DATA:
                    got_req.append(ev[2])
                    srv.consume(sid, len(ev[2]))
                    if ev[3]:
                        srv.respond(sid, RESP_HEADERS, req, RESP_TRAILERS)
        os_ = srv.flush()
        if os_:
            for ev in cli.feed(joined(os_)):
                if ev[0] == DATA:
                    got_resp.append(ev[2])
                    cli.consume(sid, len(ev[2]))
                elif ev[0] == TRAILERS:
                    done = True
        if done:
            break
    assert done
    assert b"".join(got_req) == req and b"".join(got_resp) == req


def test_bytearray_is_pinned_while_queued():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"x")
    native_pump(srv, cli)
    buf = bytearray(b"q" * 100000)
    srv.send_headers(sid, RESP_HEADERS)
    srv.send_data(sid, buf, end=True)
    with pytest.raises(BufferError):
        buf.extend(b"more")  # the queue holds an export of it
    native_pump(srv, cli)
    assert srv.open_streams == 0
    buf.extend(b"more")  # released once sent


def test_memoryview_and_other_buffers():
    import array

    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"x")
    native_pump(srv, cli)
    srv.send_headers(sid, RESP_HEADERS)
    srv.send_data(sid, memoryview(b"0123456789")[2:5])
    srv.send_data(sid, array.array("i", [1, 2]))
    srv.send_data(sid, b"")
    with pytest.raises(BufferError):
        srv.send_data(sid, memoryview(b"abcdef")[::2])
    with pytest.raises(TypeError):
        srv.send_data(sid, "text")
    srv.send_data(sid, b"!", end=True)
    _, evs = native_pump(srv, cli)
    assert body_of(evs, sid) == b"234" + array.array("i", [1, 2]).tobytes() + b"!"


# --------------------------------------------------------------------------------------------
# streaming


def test_streaming_with_writable_and_trailers():
    srv = _h2.ServerConnection(write_low_water=100_000)
    p = Pair(srv, h2_client())
    p.pump()
    cli = p.peer
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    p.pump()
    with pytest.raises(_h2.H2Error, match="head first"):
        srv.send_data(sid, b"early")
    assert srv.send_headers(sid, RESP_HEADERS)
    assert srv.want_write
    p.pump()
    assert not srv.want_write  # the provider is parked until data comes
    chunk = os.urandom(300_000)
    assert srv.send_data(sid, chunk) and srv.buffered(sid) == 300_000
    # the client's window (65535) lets one part out; the rest stays queued, no WRITABLE yet
    evs, pevs = p.pump()
    assert WRITABLE not in [e[0] for e in evs]
    assert srv.buffered(sid) == 300_000 - 65535
    got = b"".join(e.data for e in pevs if isinstance(e, h2.events.DataReceived))
    writable_seen = 0
    sent_chunks = 1
    ended = False
    acked = 0
    for _ in range(1000):
        cli.acknowledge_received_data(len(got) - acked, sid)
        acked = len(got)
        evs, pevs = p.pump()
        for ev in evs:
            if ev == (WRITABLE, sid):
                writable_seen += 1
                assert srv.buffered(sid) <= 100_000
                if sent_chunks < 4:
                    srv.send_data(sid, chunk)
                    sent_chunks += 1
                else:
                    srv.send_trailers(sid, RESP_TRAILERS)
        for ev in pevs:
            if isinstance(ev, h2.events.DataReceived):
                got += ev.data
            if isinstance(ev, h2.events.TrailersReceived):
                assert ev.headers == RESP_TRAILERS
                ended = True
        if ended:
            break
    assert ended and writable_seen == 4 and got == chunk * 4


def test_client_streaming_request():
    p = Pair(_h2.ClientConnection(), h2_server())
    cli = p.ours
    sid = cli.request(REQ_HEADERS, end=False)
    _, pevs = p.pump()
    assert any(isinstance(e, h2.events.RequestReceived) for e in pevs)
    assert not any(isinstance(e, h2.events.StreamEnded) for e in pevs)
    for i in range(5):
        assert cli.send_data(sid, grpc_message(b"part %d" % i))
    assert cli.send_trailers(sid, [(b"x-end", b"1")])
    with pytest.raises(_h2.H2Error, match="ended"):
        cli.send_data(sid, b"late")
    _, pevs = p.pump()
    body = b"".join(e.data for e in pevs if isinstance(e, h2.events.DataReceived))
    assert body == b"".join(grpc_message(b"part %d" % i) for i in range(5))
    assert next(e for e in pevs if isinstance(e, h2.events.TrailersReceived)).headers == [(b"x-end", b"1")]


def test_send_headers_end_and_send_data_end():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    a = cli.request(REQ_HEADERS, b"")
    b = cli.request(REQ_HEADERS, b"")
    native_pump(srv, cli)
    srv.send_headers(a, [(b":status", b"204")], end=True)
    srv.send_headers(b, RESP_HEADERS)
    srv.send_data(b, b"last", end=True)
    _, evs = native_pump(srv, cli)
    assert (HEAD, a, [(b":status", b"204")], True) in evs
    assert (DATA, b, b"last", True) in evs
    assert srv.open_streams == 0 and cli.open_streams == 0


def test_flush_limit():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"")
    native_pump(srv, cli)
    srv.respond(sid, RESP_HEADERS, os.urandom(60000))
    first = srv.flush(20000)
    assert 20000 <= len(joined(first)) < 40000 and srv.want_write
    rest = srv.flush()
    evs = cli.feed(joined(first) + joined(rest))
    assert len(body_of(evs, sid)) == 60000


# --------------------------------------------------------------------------------------------
# resets


def test_reset_by_peer_is_a_close_event():
    p = Pair(_h2.ServerConnection(), h2_client())
    p.pump()
    cli, srv = p.peer, p.ours
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    cli.send_data(sid, b"partial")
    evs, _ = p.pump()
    assert body_of(evs, sid) == b"partial"
    cli.reset_stream(sid, error_code=8)
    evs, _ = p.pump()
    assert evs == [(CLOSE, sid, _h2.CANCEL)]
    assert srv.respond(sid, RESP_HEADERS) is False and srv.reset(sid) is False
    assert srv.open_streams == 0 and srv.counters()["rst_stream"] == 1 and srv.counters()["glitch"] == 0
    srv.consume(sid, 7)  # a closed stream: a no-op, its bytes went back when it closed


def test_data_then_reset_in_one_read_delivers_both():
    srv, enc = raw_server()
    evs = srv.feed(raw_request(enc, 1) + frame(0, 0, 1, b"abc") + frame(3, 0, 1, struct.pack(">I", 8)))
    assert evs[1:] == [(DATA, 1, b"abc", False), (CLOSE, 1, _h2.CANCEL)]


def test_reset_by_us():
    p = Pair(_h2.ServerConnection(), h2_client())
    p.pump()
    cli, srv = p.peer, p.ours
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    p.pump()
    srv.send_headers(sid, RESP_HEADERS)
    srv.send_data(sid, b"x" * 200000)
    assert srv.reset(sid, _h2.ENHANCE_YOUR_CALM) is True
    assert srv.reset(sid) is False  # never twice (nghttp2 < 1.66 would send a second RST_STREAM)
    assert srv.buffered(sid) == 0
    assert srv.send_data(sid, b"y") is False
    evs, pevs = p.pump()
    assert evs == []  # no CLOSE for a reset the app made
    rst = [e for e in pevs if isinstance(e, h2.events.StreamReset)]
    assert len(rst) == 1 and rst[0].error_code == _h2.ENHANCE_YOUR_CALM
    assert srv.counters()["glitch"] == 0 and srv.open_streams == 0


def test_client_reset_before_and_after_sending():
    p = Pair(_h2.ClientConnection(), h2_server())
    cli = p.ours
    a = cli.request(REQ_HEADERS, b"a")
    assert cli.reset(a) is True and cli.reset(a) is False
    b = cli.request(REQ_HEADERS, b"b", end=False)
    evs, pevs = p.pump()
    assert of_kind(evs, CLOSE) == []  # no CLOSE for a reset the app made
    reqs = [e.stream_id for e in pevs if isinstance(e, h2.events.RequestReceived)]
    assert reqs == [b]  # the reset request never went out
    assert cli.open_streams == 1
    assert cli.reset(b, _h2.CANCEL) is True
    evs, pevs = p.pump()
    assert [(e.stream_id, e.error_code) for e in pevs if isinstance(e, h2.events.StreamReset)] == [(b, 8)]
    assert of_kind(evs, CLOSE) == [] and cli.open_streams == 0


def test_server_reset_of_a_client_stream():
    p = Pair(_h2.ClientConnection(), h2_server())
    cli = p.ours
    sid = cli.request(REQ_HEADERS, b"x")
    p.pump()
    p.peer.reset_stream(sid, error_code=_h2.REFUSED_STREAM)
    evs, _ = p.pump()
    assert evs == [(CLOSE, sid, _h2.REFUSED_STREAM)]


# --------------------------------------------------------------------------------------------
# GOAWAY and drain


def test_graceful_drain_finishes_streams_in_flight():
    # the client is ours too: h2 stops sending on any GOAWAY, nghttp2 finishes its streams
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sids = [cli.request(REQ_HEADERS, end=False) for _ in range(3)]
    sevs, _ = native_pump(srv, cli)
    assert [e[1] for e in of_kind(sevs, HEAD)] == sids
    srv.shutdown_notice()
    _, cevs = native_pump(srv, cli)
    assert cevs == [(GOAWAY, 2**31 - 1, 0)]
    assert not cli.can_request()
    srv.ping(1)
    sevs, _ = native_pump(srv, cli)
    assert sevs == [(PING_ACK, 1)]
    srv.goaway()
    _, cevs = native_pump(srv, cli)
    assert cevs == [(GOAWAY, sids[-1], 0)]
    # a stream opened after the GOAWAY is ignored (raw: nghttp2 would not open one now)
    assert of_kind(srv.feed(frame(1, 0x5, 99, hpack.Encoder().encode(REQ_HEADERS))), HEAD) == []
    for sid in sids:
        cli.send_data(sid, grpc_message(b"late"), end=True)
    sevs, _ = native_pump(srv, cli)
    assert [e[1] for e in sevs if e[0] == DATA and e[3]] == sids
    settle_unary(srv, sevs)
    assert srv.want_read
    _, cevs = native_pump(srv, cli)
    assert [e[1] for e in of_kind(cevs, TRAILERS)] == sids
    assert not srv.want_read and not srv.want_write  # nothing left: close the connection
    assert not cli.want_read and not cli.want_write


def test_a_peer_connection_error_is_a_goaway_not_an_exception():
    srv, enc = raw_server()
    assert of_kind(srv.feed(raw_request(enc, 1)), HEAD)
    assert srv.feed(frame(0, 0, 0, b"data on stream 0")) == []  # RFC 9113 section 6.1: PROTOCOL_ERROR
    assert srv.want_write
    assert goaway_of(flush_bytes(srv)) == (1, _h2.PROTOCOL_ERROR)
    assert not srv.want_read and not srv.want_write
    assert srv.feed(raw_request(enc, 3)) == []


def test_outbound_queue_size_counts_unsent_frames():
    srv, _ = raw_server()
    srv.feed(b"".join(frame(6, 0, 0, b"%08d" % i) for i in range(10)))
    assert srv.outbound_queue_size == 10  # ten PING ACKs, not flushed yet
    flush_bytes(srv)
    assert srv.outbound_queue_size == 0


def test_goaway_with_error_terminates():
    srv, enc = raw_server()
    srv.feed(raw_request(enc, 1))
    srv.goaway(_h2.ENHANCE_YOUR_CALM)
    assert goaway_of(flush_bytes(srv)) == (1, _h2.ENHANCE_YOUR_CALM)
    assert not srv.want_read and not srv.want_write


def test_client_after_goaway_refuses_and_reports_refused_streams():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    s1 = cli.request(REQ_HEADERS, b"1")
    s3 = cli.request(REQ_HEADERS, b"3")
    native_pump(srv, cli)
    s5 = cli.request(REQ_HEADERS, b"5")  # queued, not flushed yet
    srv.goaway(last_sid=s1)
    evs = cli.feed(flush_bytes(srv))
    assert evs == [(GOAWAY, s1, 0), (CLOSE, s3, _h2.REFUSED_STREAM)]
    assert not cli.can_request()
    with pytest.raises(_h2.H2Error) as err:
        cli.request(REQ_HEADERS)
    assert err.value.code < 0
    srv.feed(flush_bytes(cli))
    assert cli.has_events
    assert cli.poll() == [(CLOSE, s5, _h2.REFUSED_STREAM)]  # never sent: safe to retry elsewhere
    assert not cli.has_events and cli.open_streams == 1  # s1 goes on
    srv.respond(s1, [(b":status", b"200")])
    assert cli.feed(flush_bytes(srv)) == [(HEAD, s1, [(b":status", b"200")], True)]
    assert not cli.want_read


def test_client_respects_max_concurrent_streams():
    srv, cli = _h2.ServerConnection(max_concurrent_streams=2), _h2.ClientConnection()
    native_pump(srv, cli)
    assert cli.remote_max_concurrent_streams == 2
    a, b = cli.request(REQ_HEADERS, b"a"), cli.request(REQ_HEADERS, b"b")
    assert not cli.can_request()
    with pytest.raises(_h2.H2Error):
        cli.request(REQ_HEADERS)
    sevs, _ = native_pump(srv, cli)
    assert [e[1] for e in of_kind(sevs, HEAD)] == [a, b]
    assert not cli.can_request()
    for sid in (a, b):
        srv.respond(sid, RESP_HEADERS)
    native_pump(srv, cli)
    assert cli.open_streams == 0 and cli.can_request()
    limited = _h2.ClientConnection(max_concurrent_streams=1)
    limited.request(REQ_HEADERS)
    assert not limited.can_request()


# --------------------------------------------------------------------------------------------
# header limits and HPACK


def test_huge_header_is_reset_before_any_head_event():
    srv, enc = raw_server()
    evs = srv.feed(raw_request(enc, 1, extra=[(b"x-big", b"v" * 20000)]))
    assert evs == []
    assert resets_of(flush_bytes(srv)) == {1: _h2.INTERNAL_ERROR}
    assert srv.counters()["header_resets"] == 1 and srv.counters()["glitch"] == 1
    assert srv.open_streams == 0 and srv.poll() == []
    # the connection goes on
    evs = srv.feed(raw_request(enc, 3, end_stream=True))
    assert evs == [(HEAD, 3, REQ_HEADERS, True)]


def test_header_list_size_counts_name_value_and_32():
    limit = sum(len(n) + len(v) + 32 for n, v in REQ_HEADERS) + len(b"x-pad") + 32 + 100
    srv, enc = raw_server(max_header_list_size=limit)
    assert of_kind(srv.feed(raw_request(enc, 1, True, [(b"x-pad", b"v" * 100)])), HEAD)  # exactly at the limit
    assert srv.feed(raw_request(enc, 3, True, [(b"x-pad", b"v" * 101)])) == []  # one byte over
    assert srv.counters()["header_resets"] == 1


def test_header_field_count_limit():
    srv, enc = raw_server(max_header_fields=20)
    assert srv.feed(raw_request(enc, 1, True, [(b"x-%d" % i, b"") for i in range(15)])) == []
    assert resets_of(flush_bytes(srv)) == {1: _h2.INTERNAL_ERROR}
    assert of_kind(srv.feed(raw_request(enc, 3, True, [(b"x-%d" % i, b"") for i in range(14)])), HEAD)


def test_oversized_trailers_close_a_known_stream():
    srv, enc = raw_server()
    assert of_kind(srv.feed(raw_request(enc, 1)), HEAD)
    big_trailers = enc.encode([(b"x-t", os.urandom(10000).hex().encode())])  # 20 KB, no Huffman gain
    evs = srv.feed(frame(0, 0, 1, b"body") + header_frames(1, big_trailers, True))
    assert evs == [(DATA, 1, b"body", False), (CLOSE, 1, _h2.INTERNAL_ERROR)]
    assert resets_of(flush_bytes(srv)) == {1: _h2.INTERNAL_ERROR}
    assert srv.poll() == [] and srv.open_streams == 0


def test_client_rejects_an_oversized_response_head():
    p = Pair(_h2.ClientConnection(max_header_list_size=4096), h2_server())
    sid = p.ours.request(REQ_HEADERS)
    p.pump()
    p.peer.send_headers(sid, [(b":status", b"200"), (b"x-big", b"b" * 5000)], end_stream=True)
    evs, _ = p.pump()
    assert evs == [(CLOSE, sid, _h2.INTERNAL_ERROR)]
    assert p.ours.counters()["header_resets"] == 1 and p.ours.open_streams == 0


def test_hpack_bomb_is_bounded():
    srv, _ = raw_server()
    enc = hpack.Encoder()
    first = enc.encode(REQ_HEADERS + [(b"x-bomb", b"b" * 4000)])  # puts x-bomb in the dynamic table
    # then one block that names it 4000 times by index: 16 MB decoded from ~4 KB on the wire
    index = 62  # the newest dynamic-table entry: an indexed field is one byte (RFC 7541 section 6.1)
    block = enc.encode(REQ_HEADERS) + bytes([0x80 | index]) * 4000
    assert len(block) < 16384
    assert of_kind(srv.feed(frame(1, 0x5, 1, first)), HEAD)  # 4 KB: under the 16 KiB limit
    flush_bytes(srv)
    tracemalloc.start()
    try:
        t0 = time.process_time()
        evs = srv.feed(frame(1, 0x5, 3, block))
        cpu = time.process_time() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert evs == [] and srv.counters()["header_resets"] == 1
    assert peak < 1 << 20 and cpu < 1.0
    assert resets_of(flush_bytes(srv)) == {3: _h2.INTERNAL_ERROR}


# --------------------------------------------------------------------------------------------
# floods


def test_continuation_flood_is_fatal():
    srv, enc = raw_server()
    block = enc.encode(REQ_HEADERS)
    data = frame(1, 0, 1, block[:5])  # HEADERS without END_HEADERS
    data += b"".join(frame(9, 0, 1, b"") for _ in range(20))
    with pytest.raises(_h2.H2Error, match="CONTINUATION"):
        srv.feed(data)
    assert goaway_of(flush_bytes(srv))[1] == _h2.ENHANCE_YOUR_CALM
    assert not srv.want_read


def test_max_continuations_is_configurable():
    def block_in(enc, n):
        """A request head in HEADERS + n CONTINUATION frames (the last one ends it)."""
        block = enc.encode(REQ_HEADERS)
        if n == 0:
            return frame(1, 0x4, 1, block)
        return frame(1, 0, 1, block[:3]) + b"".join(frame(9, 0, 1) for _ in range(n - 1)) + frame(9, 0x4, 1, block[3:])

    for limit in (0, 2, 5):
        srv, enc = raw_server(max_continuations=limit)
        assert of_kind(srv.feed(block_in(enc, limit)), HEAD)
        srv, enc = raw_server(max_continuations=limit)
        with pytest.raises(_h2.H2Error, match="CONTINUATION"):
            srv.feed(block_in(enc, limit + 1))
        assert goaway_of(flush_bytes(srv))[1] == _h2.ENHANCE_YOUR_CALM


def test_continuations_within_the_limit_are_fine():
    srv, enc = raw_server()
    block = enc.encode(REQ_HEADERS + [(b"x-%d" % i, b"v" * 100) for i in range(50)])
    parts = [block[i : i + 1000] for i in range(0, len(block), 1000)]
    assert len(parts) <= 9
    data = frame(1, 0x1, 1, parts[0]) + b"".join(
        frame(9, 0x4 if i == len(parts) - 1 else 0, 1, p) for i, p in enumerate(parts[1:], 1))
    assert of_kind(srv.feed(data), HEAD)


def assert_dead(srv, events, reason):
    events = events + srv.poll()
    out = flush_bytes(srv)
    events += srv.poll()
    assert (DEAD, reason) in events
    assert srv.dead == reason
    assert goaway_of(out)[1] == _h2.ENHANCE_YOUR_CALM
    assert not srv.want_read and not srv.want_write
    assert srv.feed(frame(6, 0, 0, b"12345678")) == []  # everything after is ignored


def test_rapid_reset_is_dead():
    srv, enc = raw_server()
    data = b"".join(raw_request(enc, sid) + frame(3, 0, sid, struct.pack(">I", 8)) for sid in range(1, 2202, 2))
    evs = srv.feed(data)
    # the 1001st RST_STREAM finds the bucket empty: its stream stays open, the rest is ignored
    assert len(of_kind(evs, HEAD)) == 1001 and len(of_kind(evs, CLOSE)) == 1000
    assert srv.counters()["rst_stream"] == 1001
    assert_dead(srv, evs, "rst_stream")


def test_rapid_reset_below_the_bucket_is_fine():
    srv, enc = raw_server(rst_stream_burst=0)  # bucket off: the library's backstop remains
    data = b"".join(raw_request(enc, sid) + frame(3, 0, sid, struct.pack(">I", 8)) for sid in range(1, 400, 2))
    evs = srv.feed(data)
    assert srv.dead is None and len(of_kind(evs, CLOSE)) == 200


def test_ping_flood_is_dead():
    srv, _ = raw_server()
    evs = srv.feed(b"".join(frame(6, 0, 0, b"%08d" % i) for i in range(1200)))
    assert srv.counters()["ping"] == 1001
    assert_dead(srv, evs, "ping")


def test_pings_that_refill_are_fine():
    srv, _ = raw_server(ping_burst=5, ping_rate=1_000_000)
    for i in range(50):
        srv.feed(frame(6, 0, 0, b"%08d" % i))
        time.sleep(0.0001)
    assert srv.dead is None
    acks = [f for f in frames_of(flush_bytes(srv)) if f[0] == 6 and f[1] & 1]
    assert len(acks) == 50


def test_settings_flood_is_dead():
    srv, _ = raw_server()
    evs = srv.feed(b"".join(frame(4, 0, 0) for _ in range(150)))
    assert_dead(srv, evs, "settings")


def test_window_update_flood_is_dead():
    srv, _ = raw_server()
    evs = srv.feed(b"".join(frame(8, 0, 0, struct.pack(">I", 1)) for _ in range(10050)))
    assert_dead(srv, evs, "window_update")


def test_priority_flood_is_dead():
    srv, _ = raw_server()
    evs = srv.feed(b"".join(frame(2, 0, sid, struct.pack(">IB", 0, 15)) for sid in range(1, 2100, 2)))
    assert_dead(srv, evs, "priority")


def test_empty_data_flood_is_dead():
    srv, enc = raw_server()
    evs = srv.feed(raw_request(enc, 1) + b"".join(frame(0, 0, 1) for _ in range(150)))
    assert_dead(srv, evs, "empty_data")


def test_padded_empty_data_counts_as_empty():
    srv, enc = raw_server(empty_data_burst=10)
    evs = srv.feed(raw_request(enc, 1) + b"".join(frame(0, 0x8, 1, b"\x03abc") for _ in range(12)))
    assert_dead(srv, evs, "empty_data")


def test_glitch_flood_resets_we_send_are_dead():
    # A WINDOW_UPDATE that overflows a stream's window is a stream error: nghttp2 answers
    # RST_STREAM(FLOW_CONTROL_ERROR), a reset the peer provoked (CVE-2025-8671).
    srv, enc = raw_server(glitch_burst=50, glitch_rate=0)
    evs = []
    for sid in range(1, 120, 2):
        evs += srv.feed(raw_request(enc, sid) + frame(8, 0, sid, struct.pack(">I", 2**31 - 1)))
        out = flush_bytes(srv)
        evs += srv.poll()
        if srv.dead:
            break
    assert resets_of(out) == {sid: _h2.FLOW_CONTROL_ERROR}
    assert (CLOSE, 1, _h2.FLOW_CONTROL_ERROR) in evs
    assert (DEAD, "glitch") in evs
    assert srv.counters()["glitch"] == 51 and srv.dead == "glitch"
    assert goaway_of(out)[1] == _h2.ENHANCE_YOUR_CALM
    assert not srv.want_read and not srv.want_write


def test_glitch_counts_header_limit_resets():
    srv, enc = raw_server(glitch_burst=5, glitch_rate=0)  # no refill: encoding 17 KB in Python is slow
    evs = []
    for sid in range(1, 20, 2):
        evs += srv.feed(raw_request(enc, sid, extra=[(b"x-big", b"v" * 17000)]))
        out = flush_bytes(srv)
        evs += srv.poll()
        if srv.dead:
            break
    assert (DEAD, "glitch") in evs and goaway_of(out)[1] == _h2.ENHANCE_YOUR_CALM
    assert srv.counters()["header_resets"] == 6


def test_stream_error_on_a_known_stream_closes_it():
    # content-length says 10, the body has 3: nghttp2's HTTP messaging resets the stream
    srv, enc = raw_server()
    evs = srv.feed(raw_request(enc, 1, extra=[(b"content-length", b"10")]) + frame(0, 1, 1, b"abc"))
    out = flush_bytes(srv)
    assert resets_of(out) == {1: _h2.PROTOCOL_ERROR}
    closes = of_kind(evs + srv.poll(), CLOSE)
    assert closes == [(CLOSE, 1, _h2.PROTOCOL_ERROR)]
    assert srv.counters()["glitch"] == 1


def test_max_stream_data_resets_the_stream():
    # a connection window of 2 x 65535: WINDOW_UPDATE goes out once half of it is consumed
    srv = _h2.ServerConnection(max_stream_data=100_000, connection_window_size=131070)
    p = Pair(srv, h2_client())
    p.pump()
    cli = p.peer
    sid = cli.get_next_available_stream_id()
    cli.send_headers(sid, REQ_HEADERS)
    h2_send(cli, sid, b"a" * 60_000)
    evs, _ = p.pump()
    assert body_of(evs, sid) == b"a" * 60_000
    h2_send(cli, sid, b"b" * 60_000)
    evs, pevs = p.pump()
    # what came before the limit in this read is delivered, then the stream closes
    assert [e[0] for e in evs] == [DATA, CLOSE] and evs[-1] == (CLOSE, sid, _h2.ENHANCE_YOUR_CALM)
    assert 100_000 - 60_000 - 16384 < len(evs[0][2]) <= 100_000 - 60_000
    assert [e.error_code for e in pevs if isinstance(e, h2.events.StreamReset)] == [_h2.ENHANCE_YOUR_CALM]
    assert srv.counters()["data_resets"] == 1 and srv.open_streams == 0
    # none of it was consume()d, yet all came back to the connection window when the stream closed
    assert cli.outbound_flow_control_window == 131070
    sid2 = cli.get_next_available_stream_id()
    cli.send_headers(sid2, REQ_HEADERS)
    h2_send(cli, sid2, b"c" * 50_000, end_stream=True)
    evs, _ = p.pump()
    assert body_of(evs, sid2) == b"c" * 50_000


def test_consume_checks():
    srv, enc = raw_server()
    srv.feed(raw_request(enc, 1) + frame(0, 0, 1, b"12345"))
    with pytest.raises(ValueError):
        srv.consume(1, 6)
    with pytest.raises(ValueError):
        srv.consume(1, -1)
    srv.consume(1, 5)
    with pytest.raises(ValueError):
        srv.consume(1, 1)
    srv.consume(77, 100)  # unknown stream: nothing to do


def test_ping_ack_and_settings_events():
    p = Pair(_h2.ClientConnection(), h2_server())
    p.pump()
    p.ours.ping(0xDEADBEEF01020304)
    evs, _ = p.pump()
    assert evs == [(PING_ACK, 0xDEADBEEF01020304)]
    p.peer.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 3})
    evs, _ = p.pump()
    assert evs == [(SETTINGS, 3)] and p.ours.remote_max_concurrent_streams == 3


def test_interim_response_is_dropped():
    p = Pair(_h2.ClientConnection(), h2_server())
    sid = p.ours.request(REQ_HEADERS)
    p.pump()
    p.peer.send_headers(sid, [(b":status", b"103"), (b"link", b"</a>")])
    p.peer.send_headers(sid, [(b":status", b"200")], end_stream=True)
    evs, _ = p.pump()
    assert evs == [(HEAD, sid, [(b":status", b"200")], True)]


# --------------------------------------------------------------------------------------------
# byte-stream splits and fuzzing


def recorded_client_stream() -> bytes:
    """A client's bytes with several interleaved streams, DATA, trailers, PING and SETTINGS."""
    cli = h2_client()
    enc_streams = []
    for i in range(3):
        sid = cli.get_next_available_stream_id()
        cli.send_headers(sid, REQ_HEADERS + [(b"x-i", b"%d" % i)])
        enc_streams.append(sid)
    for i, sid in enumerate(enc_streams):
        cli.send_data(sid, grpc_message(bytes([65 + i]) * (300 + 100 * i)))
    cli.ping(b"12345678")
    cli.send_data(enc_streams[0], b"tail", end_stream=True)
    cli.send_headers(enc_streams[1], [(b"x-trailer", b"t")], end_stream=True)
    cli.reset_stream(enc_streams[2], error_code=8)
    cli.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100000})
    return cli.data_to_send()


RECORDED = recorded_client_stream()


def normalized(events) -> dict:
    """Per stream, its events with consecutive DATA joined (coalescing depends on the split)."""
    per: dict = {}
    for ev in events:
        key = ev[1] if ev[0] in (HEAD, DATA, TRAILERS, CLOSE, WRITABLE) else "conn"
        seq = per.setdefault(key, [])
        if ev[0] == DATA and seq and seq[-1][0] == DATA and not seq[-1][3]:
            seq[-1] = (DATA, ev[1], seq[-1][2] + ev[2], ev[3])
        elif ev[0] == DATA and not ev[2] and not ev[3]:
            continue
        else:
            seq.append(ev)
    return per


def feed_in_pieces(pieces) -> dict:
    srv = _h2.ServerConnection()
    evs = []
    for piece in pieces:
        evs += srv.feed(piece)
        flush_bytes(srv)
        evs += srv.poll()
    return normalized(evs)


EXPECTED = feed_in_pieces([RECORDED])


def test_recorded_stream_events():
    assert sorted(k for k in EXPECTED if k != "conn") == [1, 3, 5]
    assert [e[0] for e in EXPECTED[1]] == [HEAD, DATA]
    assert EXPECTED[1][1][3] is True and EXPECTED[1][1][2].endswith(b"tail")
    assert [e[0] for e in EXPECTED[3]] == [HEAD, DATA, TRAILERS]
    assert [e[0] for e in EXPECTED[5]] == [HEAD, DATA, CLOSE]


def test_every_two_way_split_gives_the_same_events():
    for i in range(len(RECORDED) + 1):
        assert feed_in_pieces([RECORDED[:i], RECORDED[i:]]) == EXPECTED, i


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=len(RECORDED)), max_size=30))
def test_any_split_gives_the_same_events(cuts):
    cuts = sorted(set(cuts))
    bounds = [0, *cuts, len(RECORDED)]
    pieces = [RECORDED[a:b] for a, b in itertools.pairwise(bounds)]
    # also through memoryview and bytearray inputs
    pieces = [memoryview(p) if i % 3 == 1 else bytearray(p) if i % 3 == 2 else p for i, p in enumerate(pieces)]
    assert feed_in_pieces(pieces) == EXPECTED


def check_survives(conn, data: bytes) -> None:
    try:
        conn.feed(data)
    except _h2.H2Error:
        pass
    try:
        conn.flush()
    except _h2.H2Error:
        pass
    conn.poll()
    conn.counters()
    assert isinstance(conn.want_read, bool)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes_after_the_preface(junk):
    srv = _h2.ServerConnection()
    srv.feed(PREFACE + frame(4, 0, 0))
    check_survives(srv, junk)
    cli = _h2.ClientConnection()
    cli.request(REQ_HEADERS, b"body", end=False)
    flush_bytes(cli)
    cli.feed(frame(4, 0, 0))
    check_survives(cli, junk)


frames_strategy = st.lists(
    st.tuples(st.integers(0, 11), st.integers(0, 255), st.sampled_from([0, 1, 3, 5, 2, 7, 2**31 - 1]),
              st.binary(max_size=40)),
    max_size=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_strategy, st.booleans())
def test_fuzz_random_frames(frames, as_server):
    enc = hpack.Encoder()
    data = b"".join(
        frame(t, f, s, enc.encode(REQ_HEADERS) + p if t == 1 and p[:1] == b"\x00" else p) for t, f, s, p in frames)
    if as_server:
        conn = _h2.ServerConnection(max_stream_data=50)
        conn.feed(PREFACE + frame(4, 0, 0) + raw_request(hpack.Encoder(), 1))
        conn.respond(1, RESP_HEADERS, b"x" * 5000, RESP_TRAILERS)
    else:
        conn = _h2.ClientConnection()
        conn.request(REQ_HEADERS, b"body", end=False)
    flush_bytes(conn)
    check_survives(conn, data)
    try:
        conn.send_data(1, b"more", end=True)
    except _h2.H2Error:
        pass
    check_survives(conn, b"")


# --------------------------------------------------------------------------------------------
# memory


def unary_rounds(srv, cli, n, body, headers, trailers):
    for _ in range(n):
        sid = cli.request(REQ_HEADERS, body)
        for ev in srv.feed(joined(cli.flush())):
            if ev[0] == DATA:
                srv.consume(ev[1], len(ev[2]))
                if ev[3]:
                    srv.respond(ev[1], headers, body, trailers)
        for ev in cli.feed(joined(srv.flush())):
            if ev[0] == DATA:
                cli.consume(sid, len(ev[2]))


def test_refcounts_and_memory_are_stable():
    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    body = grpc_message(b"p" * 100)
    big = grpc_message(b"B" * 70000)  # goes out zero-copy
    headers, trailers = list(RESP_HEADERS), list(RESP_TRAILERS)
    unary_rounds(srv, cli, 50, body, headers, trailers)
    unary_rounds(srv, cli, 5, big, headers, trailers)
    gc.collect()
    refs = [sys.getrefcount(o) for o in (body, big, headers, trailers, headers[0][0], trailers[0][1])]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        unary_rounds(srv, cli, 1000, body, headers, trailers)
        unary_rounds(srv, cli, 50, big, headers, trailers)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(o) for o in (body, big, headers, trailers, headers[0][0], trailers[0][1])] == refs
    assert after - before < 64 * 1024, after - before
    assert srv.open_streams == 0 and cli.open_streams == 0


def test_dealloc_with_open_streams_and_queues():
    tracemalloc.start()
    try:
        for _ in range(3):
            srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
            for _ in range(20):
                cli.request(REQ_HEADERS, b"x" * 10000, end=False)
            native_pump(srv, cli, rounds=2)
            flush_bytes(cli)
            del srv, cli
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(30):
            srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
            for _ in range(20):
                sid = cli.request(REQ_HEADERS, b"x" * 10000, end=False)
            cli.send_data(sid, bytearray(100000))
            evs, _ = native_pump(srv, cli, rounds=2)
            for ev in of_kind(evs, HEAD)[:5]:
                srv.send_headers(ev[1], RESP_HEADERS)
                srv.send_data(ev[1], b"y" * 300000)
            flush_bytes(srv)
            del srv, cli, evs
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, grown


def test_a_reference_cycle_through_a_queued_buffer_is_collected():
    import weakref

    class Exporter(bytearray):
        pass

    srv, cli = _h2.ServerConnection(), _h2.ClientConnection()
    sid = cli.request(REQ_HEADERS, b"", end=False)
    native_pump(srv, cli)
    buf = Exporter(b"z" * 100)
    buf.conn = cli  # the buffer refers to the connection that queues it
    cli.send_data(sid, buf)
    ref = weakref.ref(buf)
    del cli, buf
    gc.collect()
    assert ref() is None


# --------------------------------------------------------------------------------------------
# a real socket: grpcio client, uvloop server


class GrpcProtocol(asyncio.BufferedProtocol):
    """A minimal gRPC unary server on ServerConnection: answers every call with ``answer(body)``."""

    def __init__(self, answer):
        self.answer = answer
        self.conn = _h2.ServerConnection()
        self.buf = bytearray(256 * 1024)
        self.bodies: dict[int, list[bytes]] = {}

    def connection_made(self, transport):
        self.transport = transport
        self.write()

    def get_buffer(self, sizehint):
        return self.buf

    def buffer_updated(self, nbytes):
        try:
            events = self.conn.feed(self.buf, nbytes)
        except _h2.H2Error:
            self.write()
            self.transport.close()
            return
        self.handle(events)
        self.write()

    def handle(self, events):
        conn = self.conn
        for ev in events:
            kind, sid = ev[0], ev[1]
            if kind == HEAD:
                self.bodies[sid] = []
                if ev[3]:
                    self.finish(sid)
            elif kind == DATA:
                self.bodies[sid].append(ev[2])
                conn.consume(sid, len(ev[2]))
                if ev[3]:
                    self.finish(sid)
            elif kind == TRAILERS:
                self.finish(sid)
            elif kind == CLOSE:
                self.bodies.pop(sid, None)

    def finish(self, sid):
        body = b"".join(self.bodies.pop(sid))
        self.conn.respond(sid, RESP_HEADERS, grpc_message(self.answer(body[5:])), RESP_TRAILERS)

    def write(self):
        while True:
            out = self.conn.flush()
            if out:
                self.transport.writelines(out)
            if not self.conn.has_events:
                break
            self.handle(self.conn.poll())
        if not self.conn.want_read and not self.conn.want_write:
            self.transport.close()

    def connection_lost(self, exc):
        self.conn = None


@pytest.fixture(scope="module")
def grpc_server():
    import uvloop

    loop = uvloop.new_event_loop()

    def answer(request: bytes) -> bytes:
        if request.startswith(b"big:"):
            return b"R" * int(request[4:])
        return b"fixed answer for " + request

    server = loop.run_until_complete(loop.create_server(lambda: GrpcProtocol(answer), "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def test_grpcio_unary_call_over_a_real_socket(grpc_server):
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{grpc_server}") as channel:
        call = channel.unary_unary(METHOD.decode(), request_serializer=None, response_deserializer=None)
        for i in range(20):
            assert call(b"request %d" % i, timeout=10) == b"fixed answer for request %d" % i


def test_grpcio_12mib_both_ways(grpc_server):
    import grpc

    n = 12 << 20
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server}", options=opts) as channel:
        call = channel.unary_unary(METHOD.decode(), request_serializer=None, response_deserializer=None)
        # a 12 MiB answer: zero-copy DATA, paced by grpcio's WINDOW_UPDATEs
        assert call(b"big:%d" % n, timeout=30) == b"R" * n
        # a 12 MiB request: consumed as it arrives, so the windows reopen
        upload = os.urandom(n)
        assert call(upload, timeout=30) == b"fixed answer for " + upload
