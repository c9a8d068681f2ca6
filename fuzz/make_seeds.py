"""Write the seed corpora in fuzz/corpus/<target>/ (``python -m fuzz.make_seeds``).

Small valid inputs, so the fuzzer starts from realistic requests: V2 JSON, the binary-data
extension, gzip, a backend's answer; serialized ModelInferRequest / ModelInferResponse /
TraceSettingRequest; the example and demo configs; backends' HTTP/1.1 answers of every framing.
Files already there (crash reproducers
kept as regression seeds) are left alone.
"""
from __future__ import annotations

import json
import pathlib
import struct

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


def main() -> None:
    seeds = {"http_body": _http(), "grpc_wire": _grpc(), "config": {
        "example": (REPO / "config" / "example.yaml").read_bytes(), "demo": _DEMO, "shaping": _SHAPING},
        "h1_answer": _h1()}
    for target, files in seeds.items():
        folder = ROOT / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / f"seed-{name}").write_bytes(data)


if __name__ == "__main__":
    main()
