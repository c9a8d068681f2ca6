"""The workloads: one pre-generated request body per workload, written to a file the load
generator sends unchanged, plus a check that one real request gets a good answer.

* HTTP JSON (KServe V2 §"Inference request JSON"): ``POST /v2/models/<m>/infer``.
* HTTP binary extension (Triton's binary tensor data extension): a JSON header followed by the
  raw tensor bytes; ``Inference-Header-Content-Length`` gives the JSON header's length.
* gRPC: an HTTP/2 POST to ``/inference.GRPCInferenceService/ModelInfer`` whose body is one gRPC
  length-prefixed message (1 byte compressed flag = 0, 4 bytes big-endian length, then the
  serialized ``ModelInferRequest``), with ``content-type: application/grpc`` and ``te: trailers``.
  h2load sends that file as the request body; it only sees the HTTP status, so ``verify`` checks
  grpc-status with a real gRPC client.
"""
from __future__ import annotations

import http.client
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from gateway._pb import grpc_predict_v2_pb2 as pb

__all__ = ["GRPC_INFER_PATH", "WORKLOADS", "Workload", "verify", "write_bodies"]

GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
MiB = 1024 * 1024
_GRPC_MAX = 256 * MiB


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    protocol: str  # "http" (HTTP/1.1) or "grpc" (HTTP/2)
    model: str
    backend: str  # the gateway backend protocol this workload is routed to: "http" or "grpc"
    small: bool  # counts for the "small requests" targets
    headers: tuple[tuple[str, str], ...] = field(default=())

    @property
    def path(self) -> str:
        return GRPC_INFER_PATH if self.protocol == "grpc" else f"/v2/models/{self.model}/infer"


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("http_json_small", "HTTP JSON, 2×16 FP32 (add_sub)", "http", "add_sub", "http", True),
        Workload("http_bin_1m", "HTTP binary ext., 1 MiB UINT8 (identity)", "http", "identity_UINT8", "http", False),
        Workload("http_bin_16m", "HTTP binary ext., 16 MiB UINT8 (identity)", "http", "identity_UINT8", "http",
                 False),
        Workload("grpc_small", "gRPC, 2×16 FP32 (add_sub)", "grpc", "add_sub", "grpc", True),
        # The same call to two instances of the model (benchmarks/repository.py says why).
        Workload("grpc_small_x2", "gRPC, 2×16 FP32 (add_sub, 2 instances)", "grpc", "add_sub_x2", "grpc", True),
        Workload("grpc_16m", "gRPC, 16 MiB UINT8 (identity)", "grpc", "identity_UINT8", "grpc", False),
        Workload("http_json_to_grpc_1m", "HTTP JSON → gRPC backend, 1 MiB FP32 (identity)", "http", "identity_FP32",
                 "grpc", False),
        Workload("http_json_1m", "HTTP JSON, 1 MiB FP32 (identity)", "http", "identity_FP32", "http", False),
        Workload("http_json_to_grpc_small", "HTTP JSON → gRPC backend, 2×16 FP32 (add_sub)", "http", "add_sub",
                 "grpc", True),
    )
}


# ------------------------------------------------------------------------------------------- bodies


def _small_inputs() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16, dtype="<f4") * np.float32(0.5)
    b = np.full(16, 0.25, dtype="<f4")
    return a, b


def _json_small() -> bytes:
    a, b = _small_inputs()
    return orjson.dumps({
        "id": "bench",
        "inputs": [
            {"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": a.tolist()},
            {"name": "INPUT1", "shape": [16], "datatype": "FP32", "data": b.tolist()},
        ],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}],
    })


def _binary(nbytes: int) -> tuple[bytes, int]:
    """Binary-extension body (JSON header + raw bytes) and the JSON header's length."""
    raw = (np.arange(nbytes, dtype=np.uint32) % 251).astype(np.uint8).tobytes()
    header = orjson.dumps({
        "id": "bench",
        "inputs": [{
            "name": "INPUT0", "shape": [1, nbytes], "datatype": "UINT8",
            "parameters": {"binary_data_size": nbytes},
        }],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })
    return header + raw, len(header)


def _json_fp32(nbytes: int) -> bytes:
    n = nbytes // 4
    # Short decimal forms ("12.5") keep the JSON at ~2.6 bytes per value; the gateway still
    # parses every one of them into a float32 array.
    values = (np.arange(n, dtype=np.int64) % 200).astype("<f4") * np.float32(0.5)
    return orjson.dumps({
        "id": "bench",
        "inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32", "data": values.tolist()}],
        "outputs": [{"name": "OUTPUT0"}],
    })


def _grpc_frame(req: pb.ModelInferRequest) -> bytes:
    msg = req.SerializeToString()
    return struct.pack(">BI", 0, len(msg)) + msg


def _grpc_small(model: str = "add_sub") -> bytes:
    a, b = _small_inputs()
    req = pb.ModelInferRequest(model_name=model, id="bench")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(16)
    req.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    return _grpc_frame(req)


def _grpc_bytes(nbytes: int) -> bytes:
    raw = (np.arange(nbytes, dtype=np.uint32) % 251).astype(np.uint8).tobytes()
    req = pb.ModelInferRequest(model_name="identity_UINT8", id="bench")
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "UINT8"
    t.shape.extend([1, nbytes])
    req.raw_input_contents.append(raw)
    return _grpc_frame(req)


def write_bodies(names: list[str], directory: Path) -> dict[str, tuple[Path, tuple[tuple[str, str], ...]]]:
    """Write each workload's body file; return {name: (file, extra request headers)}."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, tuple[Path, tuple[tuple[str, str], ...]]] = {}
    for name in names:
        headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
        if name in ("http_json_small", "http_json_to_grpc_small"):
            body = _json_small()
        elif name in ("http_bin_1m", "http_bin_16m"):
            body, hlen = _binary(MiB if name == "http_bin_1m" else 16 * MiB)
            headers = (("content-type", "application/octet-stream"),
                       ("inference-header-content-length", str(hlen)))
        elif name in ("grpc_small", "grpc_small_x2"):
            body = _grpc_small(WORKLOADS[name].model)
            headers = (("content-type", "application/grpc"), ("te", "trailers"))
        elif name == "grpc_16m":
            body = _grpc_bytes(16 * MiB)
            headers = (("content-type", "application/grpc"), ("te", "trailers"))
        elif name in ("http_json_to_grpc_1m", "http_json_1m"):
            body = _json_fp32(MiB)
        else:
            raise KeyError(name)
        path = directory / f"{name}.body"
        path.write_bytes(body)
        out[name] = (path, headers)
    return out


# ------------------------------------------------------------------------------------------- verify


def _verify_http(wl: Workload, host_port: str, body: bytes, headers: tuple[tuple[str, str], ...]) -> str:
    host, port = host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", wl.path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        return f"HTTP {resp.status}: {data[:300]!r}"
    hlen = resp.getheader("Inference-Header-Content-Length")
    head = orjson.loads(data[: int(hlen)] if hlen else data)
    outputs = {o["name"]: o for o in head.get("outputs", [])}
    if "OUTPUT0" not in outputs:
        return f"no OUTPUT0 in the answer: {str(head)[:300]}"
    if wl.name in ("http_json_small", "http_json_to_grpc_small"):
        a, b = _small_inputs()
        got = np.asarray(outputs["OUTPUT0"]["data"], dtype="<f4")
        if not np.array_equal(got, a + b):
            return f"wrong OUTPUT0: {got}"
    if hlen:
        size = outputs["OUTPUT0"].get("parameters", {}).get("binary_data_size")
        if size != len(data) - int(hlen):
            return f"binary output size {size} != {len(data) - int(hlen)}"
    return ""


def _verify_grpc(host_port: str, body: bytes) -> str:
    import grpc

    opts = [("grpc.max_send_message_length", _GRPC_MAX), ("grpc.max_receive_message_length", _GRPC_MAX)]
    with grpc.insecure_channel(host_port, options=opts) as channel:
        call = channel.unary_unary(GRPC_INFER_PATH, request_serializer=None,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        try:
            resp = call(body[5:], timeout=60)  # the raw message, without the 5-byte frame prefix
        except grpc.RpcError as exc:
            return f"grpc-status {exc.code()}: {exc.details()}"
    if not resp.outputs or resp.outputs[0].name not in ("OUTPUT0", "OUTPUT1"):
        return f"unexpected answer: {str(resp)[:300]}"
    return ""


def verify(wl: Workload, host_port: str, body_file: Path, headers: tuple[tuple[str, str], ...]) -> str:
    """One real request to ``host_port``: "" when it answers 200 / grpc-status 0 with outputs, else why not."""
    body = body_file.read_bytes()
    try:
        if wl.protocol == "grpc":
            return _verify_grpc(host_port, body)
        return _verify_http(wl, host_port, body, headers)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
