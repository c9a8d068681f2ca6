"""Request bodies, built once per tensor size so the client's own cost stays out of the timings.

Every body carries one FP32 tensor ``INPUT0`` of shape ``[1, n]`` for the ``identity_FP32``
model of tests/models/triton (dims ``[-1, -1]``), whose answer ``OUTPUT0`` is the same tensor.

* HTTP binary: the binary-data extension — a JSON header (``binary_data_size``, and
  ``binary_data: true`` on the requested output) followed by the raw tensor bytes;
  ``Inference-Header-Content-Length`` gives the header length.
* HTTP JSON: the tensor as flat JSON ``data``; no ``outputs``, so the answer is JSON too.
* gRPC: a serialized ``ModelInferRequest`` with one ``raw_input_contents`` entry.

The values are ``k/8`` for ``k`` in ``0..79`` (``0.0`` … ``9.875``): exact in FP32 and at
most five characters in JSON, so a 64 MB tensor is a ~95 MB JSON body rather than the
~320 MB that random floats (about 19 characters each) would take — past the gateway's
default 256 MiB message limit and minutes of parsing on 2 vCPUs. Both sides of the
JSON comparison (gateway and Triton) parse and print the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from gateway._pb import grpc_predict_v2_pb2 as pb

__all__ = ["MODEL", "Bodies", "build", "tensor"]

MODEL = "identity_FP32"


def tensor(nbytes: int) -> np.ndarray:
    """A ``[1, nbytes/4]`` little-endian FP32 tensor of short decimal values."""
    n = nbytes // 4
    return ((np.arange(n, dtype=np.int64) % 80).astype("<f4") / np.float32(8)).reshape(1, n)


@dataclass(frozen=True)
class Bodies:
    nbytes: int  # tensor bytes: the "payload" the ratios divide by
    raw: bytes  # the tensor's raw bytes, to check answers against
    http_binary: bytes
    http_binary_header_length: int
    http_json: bytes
    grpc: bytes

    def http_headers(self, form: str) -> dict[str, str]:
        if form == "json":
            return {"Content-Type": "application/json"}
        return {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(self.http_binary_header_length),
        }

    def http_body(self, form: str) -> bytes:
        return self.http_json if form == "json" else self.http_binary


def build(nbytes: int, *, json: bool = True) -> Bodies:
    arr = tensor(nbytes)
    raw = arr.tobytes()
    shape = list(arr.shape)
    header = orjson.dumps({
        "inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })
    json_body = b""
    if json:
        json_body = orjson.dumps(
            {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": arr.reshape(-1)}]},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
    msg = pb.ModelInferRequest(model_name=MODEL)
    t = msg.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend(shape)
    msg.raw_input_contents.append(raw)
    return Bodies(len(raw), raw, header + raw, len(header), json_body, msg.SerializeToString())
