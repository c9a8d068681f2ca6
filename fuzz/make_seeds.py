"""Write the seed corpora in fuzz/corpus/<target>/ (``python -m fuzz.make_seeds``).

Small valid inputs, so the fuzzer starts from realistic requests: V2 JSON, the binary-data
extension, gzip, a backend's answer; serialized ModelInferRequest / ModelInferResponse /
TraceSettingRequest; the example and demo configs; backends' HTTP/1.1 answers of every framing;
gRPC exchanges over HTTP/2 written by the ``h2`` package, a client's (unary, streaming,
trailers-only answers, GOAWAY, RST_STREAM, a message over several DATA frames, gzip) and a
backend's.
Files already there (crash reproducers
kept as regression seeds) are left alone.
"""
from __future__ import annotations

import gzip
import json
import pathlib
import struct
import zlib
from typing import Any

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway._pb import triton_extensions_pb2 as tx

ROOT = pathlib.Path(__file__).parent / "corpus"
REPO = pathlib.Path(__file__).parent.parent

_ADD_SUB = {"id": "1", "inputs": [
    {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    {"name": "INPUT1", "shape": [2, 2], "datatype": "FP32", "data": [[10, 20], [30, 40]]}],
    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
_BYTES = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES", "data": ["hello", "wörld"]}],
          "parameters": {"sequence_id": 42, "sequence_start": True}}
_TYPES = {"inputs": [{"name": f"I{i}", "shape": [2], "datatype": dt, "data": data} for i, (dt, data) in enumerate([
    ("BOOL", [True, False]), ("INT8", [-128, 127]), ("UINT64", [0, 18446744073709551615]),
    ("INT64", [-9223372036854775808, 1]), ("FP16", [0.5, 65504]), ("BF16", [1.5, -2]), ("FP64", [1e308, -0.0])])]}
_NAN = b'{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[NaN,-Infinity]}]}'


def _http() -> dict[str, bytes]:
    def body(doc: object) -> bytes:
        return json.dumps(doc, ensure_ascii=False).encode()

    binary_header = body({"inputs": [
        {"name": "INPUT0", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "INPUT1", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}],
        "parameters": {"binary_data_output": True}})
    tail = struct.pack("<2f", 1.5, -2.0) + struct.pack("<I", 3) + b"abc"
    open_header = body({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32"}]})
    response = body({"model_name": "add_sub", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "shape": [2], "datatype": "FP32", "data": [11.0, 22.0]},
        {"name": "OUTPUT1", "shape": [2], "datatype": "INT16", "parameters": {"binary_data_size": 4}}]})
    return {
        # flags byte (fuzz/http_body.py), depth/chunk byte, body
        "json_request": b"\x00\x35" + body(_ADD_SUB),
        "json_bytes_sequence": b"\x00\x02" + body(_BYTES),
        "json_all_types": b"\x00\x13" + body(_TYPES),
        "json_nan": b"\x00\x01" + _NAN,
        "binary_request": b"\x01\x22" + binary_header + b"\0" + tail,
        "binary_open_tensor": b"\x01\x01" + open_header + b"\0" + struct.pack("<2i", 7, -7),
        "binary_header_text": b"\x03\x04" + str(len(binary_header)).encode() + b"\0" + binary_header + tail,
        "gzip_request": b"\x08\x03" + body(_ADD_SUB),
        "deflate_binary": b"\x11\x41" + binary_header + b"\0" + tail,
        "json_response": b"\x05\x02" + response + b"\0" + struct.pack("<2h", 1, -1),
    }


def _grpc() -> dict[str, bytes]:
    req = pb.ModelInferRequest(model_name="add_sub", model_version="1", id="7")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="FP32", shape=[2])
        req.raw_input_contents.append(struct.pack("<2f", 1, 2))
        t.parameters["binary_data_size"].int64_param = 8
    req.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    req.parameters["sequence_id"].string_param = "session-1"
    typed = pb.ModelInferRequest(model_name="identity_INT8")
    typed.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3]).contents.int_contents.extend([-1, 0, 127])
    typed.inputs.add(name="INPUT1", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a", b"\xff"])
    typed.parameters["sequence_id"].uint64_param = 2**64 - 1
    resp = pb.ModelInferResponse(model_name="add_sub", model_version="1", id="7")
    resp.outputs.add(name="OUTPUT0", datatype="BF16", shape=[2])
    resp.outputs.add(name="OUTPUT1", datatype="BYTES", shape=[1])
    resp.raw_output_contents.extend([b"\x80\x3f\x00\x40", struct.pack("<I", 2) + b"hi"])
    trace = tx.TraceSettingRequest(model_name="add_sub")
    trace.settings["trace_rate"].value.append("10")
    return {"infer_raw": req.SerializeToString(), "infer_typed": typed.SerializeToString(),
            "response_raw": resp.SerializeToString(), "trace_setting": trace.SerializeToString()}


_DEMO = b"""# the demo's config (gateway/demo/serve.py demo_config), written as YAML
listen: {http: 127.0.0.1:8000, grpc: 127.0.0.1:8001, metrics: 127.0.0.1:8002}
health: {interval_s: 1.0, timeout_s: 1.0}
backends:
  demo-http: {protocol: http, endpoints: ["127.0.0.1:9000"]}
  demo-grpc: {protocol: grpc, endpoints: ["127.0.0.1:9001"]}
routes:
  - {model: add_sub, backend: demo-http}
  - {model: string_reverse, backend: demo-grpc}
  - {model: "identity_*", backend: demo-grpc}
"""
_SHAPING = b"""listen: {http: "[::1]:0", grpc: null}
max_inflight_bytes: 0
access_log: {sample: 0.5}
forward_headers: [x-request-id]
server: {name: gw, version: "1"}
dns: {nameservers: ["127.0.0.1:5353"], refresh_s: 5, timeout_s: 1}
backends:
  v1:
    protocol: grpc
    endpoints: [{dns: "triton.local:8001"}, {address: "10.0.0.1:8001", metrics_port: 8002}]
    balance: least_queue
    queue_metrics: {port: 8002, interval_s: 0.5}
    outlier: {consecutive_failures: 5, base_ejection_s: 30}
    tls: true
  v2:
    protocol: http
    endpoints: ["mlserver:8080"]
    binary_extension: false
    non_utf8_bytes: base64
    check_headers: {admin-key: {env: HOME}}
routes:
  - {model: resnet50, headers: {x-variant: canary}, backend: v2}
  - model: resnet50
    version: 2
    split: [{backend: v1, weight: 95}, {backend: v2, weight: 5}]
    mirror: {backend: v2, percent: 10, max_inflight: 32}
"""


def _h1() -> dict[str, bytes]:
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"outputs\": []}"
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: 1\r\n\r\n")
    return {
        # flags byte, three read-size bytes (fuzz/h1_answer.py), the backend's bytes
        "length": b"\x00\x00\x00\x00" + ok,
        "length_in_reads": b"\x03\x04\x10\x00" + ok,
        "chunked": b"\x02\x06\x00\x00" + chunked,
        "close_http10": b"\x00\x00\x00\x00HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nread to the end",
        "close_connection": b"\x01\x00\x00\x00HTTP/1.1 503 Unavailable\r\nConnection: close\r\n\r\nbusy",
        "interim": b"\x01\x00\x00\x00HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                   b"Link: </a>; rel=preload\r\n\r\n" + ok,
        "two_exchanges": b"\x30\x00\x00\x00" + ok + b"\0\0" + chunked,
        "streamed": b"\x07\x20\x03\x40HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n" + bytes(range(256)) + b"x" * 44,
        "small_limits": b"\x08\x00\x00\x00HTTP/1.1 404 Not Found\r\nServer: triton\r\nContent-Length: 9\r\n\r\nnot found",
        "no_content": b"\x10\x00\x00\x00HTTP/1.1 204 No Content\r\nServer: triton\r\n\r\n",
        "bytes_after": b"\x30\x00\x00\x00" + ok + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\0\0" + ok,
    }


_GRPC = "/inference.GRPCInferenceService/"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _message(payload: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


def _frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def _h2_peer(client: bool) -> Any:
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client, header_encoding=None))
    conn.initiate_connection()
    return conn


def _h2_send(conn: Any, sid: int, data: bytes, end: bool = False) -> None:
    """DATA frames of at most 16384 bytes (h2 takes no more in one call)."""
    step = 16384
    for i in range(0, max(len(data), 1), step):
        conn.send_data(sid, data[i:i + step], end_stream=end and i + step >= len(data))


def _request_head(method: str, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", (_GRPC + method).encode()),
            (b":authority", b"gateway:8001"), (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra]


def _h2_listen() -> dict[str, bytes]:
    """A gRPC client's bytes (h2 as the client), after the flags byte and three read sizes of
    fuzz/h2_listen.py. Flag bit 2 puts the preface first: those seeds leave h2's own out."""
    def client(with_preface: bool = False) -> Any:
        c = _h2_peer(True)
        if not with_preface:
            c.data_to_send()
        return c

    seeds: dict[str, bytes] = {}
    c = client(True)
    c.send_headers(1, _request_head("ModelInfer"))
    c.send_data(1, _message(b"\x0a\x07add_sub"), end_stream=True)
    seeds["unary_own_preface"] = b"\x00\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer", (b"x-request-id", b"r-1")))
    c.send_data(1, _message(b"hello"), end_stream=True)
    unary = c.data_to_send()
    seeds["unary"] = b"\x04\x00\x00\x00" + unary
    seeds["unary_frames"] = b"\x05\x00\x00\x00" + unary
    seeds["unary_in_reads"] = b"\x07\x08\x01\x1f" + unary

    c = client()
    c.send_headers(1, _request_head("ModelStreamInfer", (b"trace-bin", b"AAEC")))
    c.send_data(1, _message(b"one") + _message(b"two")[:3])
    c.send_data(1, _message(b"two")[3:] + _message(b""))
    c.send_data(1, _message(b"three"), end_stream=True)
    seeds["stream"] = b"\x05\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ServerLive"))
    c.send_data(1, _message(b""))
    c.send_headers(1, [(b"x-trailer", b"1")], end_stream=True)  # request trailers end it
    c.send_headers(3, _request_head("Nope"), end_stream=True)
    c.send_headers(5, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/x"), (b":authority", b"gw"),
                       (b"content-type", b"text/plain")], end_stream=True)
    seeds["trailers_only_answers"] = b"\x04\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer"))
    c.send_data(1, _message(b"bye"), end_stream=True)
    c.close_connection()
    seeds["goaway"] = b"\x04\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelReady"))
    c.send_data(1, _message(b"x"), end_stream=True)
    c.send_headers(3, _request_head("ModelInfer"))
    c.send_data(3, _message(b"abc")[:4])
    c.reset_stream(1, 8)
    c.reset_stream(3, 8)
    seeds["rst_stream"] = b"\x05\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer"))
    _h2_send(c, 1, _message(bytes(range(256)) * 80), end=True)  # 20480 bytes: two DATA frames
    seeds["large_message"] = b"\x05\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer", (b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"gzip")))
    c.send_data(1, _message(gzip.compress(b"compressed " * 20, mtime=0), 1), end_stream=True)
    c.send_headers(3, _request_head("ModelInfer", (b"grpc-encoding", b"deflate")))
    c.send_data(3, _message(zlib.compress(b"deflated"), 1), end_stream=True)
    seeds["compressed"] = b"\x04\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer"))
    c.send_data(1, _message(b"x" * 100), end_stream=True)  # over the small limit (64)
    c.send_headers(3, _request_head("ModelInfer"))
    c.send_data(3, _message(b"y" * 10) + _message(b"z"), end_stream=True)  # two messages in a unary call
    seeds["small_limits"] = b"\x0c\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelReady", (b"grpc-timeout", b"1500m")))
    c.send_data(1, _message(b"wait"), end_stream=True)
    c.send_headers(3, _request_head("ModelInfer"))
    c.send_data(3, _message(b"never ends")[:7])
    seeds["deadline_and_stall"] = b"\x2c\x00\x00\x00" + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer"))
    c.send_data(1, _message(b"slow")[:3])
    c.ping(b"12345678")
    c.send_data(1, _message(b"slow")[3:], end_stream=True)
    seeds["slow_body_clock"] = b"\x1d\x00\x00\x00" + c.data_to_send()

    c = client()
    c.update_settings({4: 0, 1: 0})  # INITIAL_WINDOW_SIZE 0, HEADER_TABLE_SIZE 0: answers wait for the window
    c.send_headers(1, _request_head("ModelStreamInfer"))
    c.send_data(1, b"".join(_message(bytes([i]) * 3000) for i in range(3)), end_stream=True)
    settings = c.data_to_send()
    c.increment_flow_control_window(65535)
    c.increment_flow_control_window(65535, 1)
    seeds["backpressure"] = b"\x45\x00\x00\x00" + settings + c.data_to_send()

    c = client()
    c.send_headers(1, _request_head("ModelInfer"))
    c.send_data(1, _message(b"in flight"), end_stream=True)
    drain_ack = _frame(6, 1, 0, (0x6F69702D64726169).to_bytes(8, "big"))  # fuzz/h2_listen.py: the drain's PING
    seeds["drain"] = b"\x85\x00\x00\x00" + c.data_to_send() + drain_ack + _frame(4, 1, 0)
    return seeds


def _h2_answer() -> dict[str, bytes]:
    """A gRPC backend's bytes (h2 as the server, after reading the requests the harness's calls
    make on streams 1 and 3), after the flags byte and three read sizes of fuzz/h2_answer.py.
    Flag bit 2 puts a SETTINGS and its ACK first: those seeds leave h2's own out."""
    def server(calls: int, with_preface: bool = False) -> Any:
        c = _h2_peer(True)
        for sid in (1, 3, 5)[:calls]:
            c.send_headers(sid, _request_head("ModelInfer"))
            c.send_data(sid, _message(b"\x0a\x07add_sub"), end_stream=True)
        s = _h2_peer(False)
        s.receive_data(c.data_to_send())
        if not with_preface:
            s.data_to_send()
        return s

    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    done = [(b"grpc-status", b"0")]
    seeds: dict[str, bytes] = {}
    s = server(1, True)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"\x0a\x07add_sub\x12\x011"))
    s.send_headers(1, done, end_stream=True)
    seeds["unary_own_preface"] = b"\x00\x00\x00\x00" + s.data_to_send()

    s = server(1)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"answer"))
    s.send_headers(1, done, end_stream=True)
    unary = s.data_to_send()
    seeds["unary"] = b"\x04\x00\x00\x00" + unary
    seeds["unary_frames"] = b"\x05\x00\x00\x00" + unary
    seeds["unary_in_reads"] = b"\x07\x05\x02\x3f" + unary

    s = server(2)
    s.send_headers(3, ok)
    s.send_headers(1, ok + [(b"grpc-encoding", b"identity")])
    s.send_data(3, _message(b"second")[:4])
    s.send_data(1, _message(b"first"))
    s.send_data(3, _message(b"second")[4:])
    s.send_headers(1, done, end_stream=True)
    s.send_headers(3, [(b"grpc-status", b"0"), (b"grpc-message", b"fine")], end_stream=True)
    seeds["two_calls"] = b"\x15\x00\x00\x00" + s.data_to_send()

    s = server(2)
    s.send_headers(1, ok + [(b"grpc-status", b"5"), (b"grpc-message", b"model %C3%A9 not found")], end_stream=True)
    s.send_headers(3, ok)
    s.send_headers(3, [(b"grpc-status", b"3"), (b"grpc-message", b"bad"),
                       (b"grpc-status-details-bin", b"CAMSA2JhZA")], end_stream=True)
    seeds["trailers_only"] = b"\x14\x00\x00\x00" + s.data_to_send()

    s = server(2)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"last one"))
    s.send_headers(1, done, end_stream=True)
    s.close_connection(0, last_stream_id=1)  # stream 3 was not processed
    seeds["goaway"] = b"\x15\x00\x00\x00" + s.data_to_send()

    s = server(2)
    s.reset_stream(1, 7)  # REFUSED_STREAM: the call goes again, on stream 3
    s.send_headers(3, ok)
    s.send_data(3, _message(b"on the retry"))
    s.send_headers(3, done, end_stream=True)
    seeds["rst_refused_then_retry"] = b"\x05\x00\x00\x00" + s.data_to_send()

    s = server(2)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"cut short")[:6])
    s.reset_stream(1, 8)
    s.reset_stream(3, 2)
    seeds["rst_stream"] = b"\x15\x00\x00\x00" + s.data_to_send()

    s = server(1)
    s.send_headers(1, ok)
    _h2_send(s, 1, _message(bytes(range(256)) * 80))  # 20480 bytes: two DATA frames
    s.send_headers(1, done, end_stream=True)
    seeds["large_message"] = b"\x05\x00\x00\x00" + s.data_to_send()

    s = server(2)
    z = gzip.compress(b"\x0a\x07add_sub" * 30, mtime=0)
    s.send_headers(1, ok + [(b"grpc-encoding", b"gzip")])
    s.send_data(1, _message(z, 1))
    s.send_headers(1, done, end_stream=True)
    s.send_headers(3, ok + [(b"grpc-encoding", b"br")])
    s.send_data(3, _message(b"??", 1))
    s.send_headers(3, done, end_stream=True)
    seeds["compressed"] = b"\x14\x00\x00\x00" + s.data_to_send()

    s = server(1)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"m" * 100))  # over the small limit (64)
    s.send_headers(1, done, end_stream=True)
    seeds["small_limit"] = b"\x0c\x00\x00\x00" + s.data_to_send()

    s = server(1)
    s.ping(b"backend!")
    s.send_headers(1, [(b":status", b"100")])
    s.send_headers(1, ok)
    seeds["ping_interim_then_silence"] = b"\x84\x00\x00\x00" + s.data_to_send()

    s = server(2)
    s.update_settings({3: 1, 4: 0})  # MAX_CONCURRENT_STREAMS 1, INITIAL_WINDOW_SIZE 0
    s.send_headers(1, ok)
    seeds["deadline"] = b"\xb4\x00\x00\x00" + s.data_to_send()

    s = server(1)
    s.send_headers(1, ok)
    s.send_data(1, _message(b"no status"), end_stream=True)
    seeds["no_status"] = b"\x04\x00\x00\x00" + s.data_to_send()
    return seeds


def main() -> None:
    seeds = {"http_body": _http(), "grpc_wire": _grpc(), "config": {
        "example": (REPO / "config" / "example.yaml").read_bytes(), "demo": _DEMO, "shaping": _SHAPING},
        "h1_answer": _h1(), "h2_listen": _h2_listen(), "h2_answer": _h2_answer()}
    for target, files in seeds.items():
        folder = ROOT / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / f"seed-{name}").write_bytes(data)


if __name__ == "__main__":
    main()
