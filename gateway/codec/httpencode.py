"""The neutral model → HTTP inference bodies: body chunks and the
Inference-Header-Content-Length, as Triton writes them (codec/http.py's docstring).

Encoders trust their tensors, which came from a decoder or ``from_numpy``.
"""
from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import InvalidRequest
from ..model import InferRequest, InferResponse, Tensor
from .httpdecode import _without
from .jsondata import _json_data
from .jsonnum import params_json

__all__ = ["encode_request", "encode_response"]

_OPT = orjson.OPT_SERIALIZE_NUMPY
_NO_OVERRIDES: Mapping[str, bool] = {}


def _encode_tensors(tensors: tuple[Tensor, ...], binary_of: Any, chunks: list[bytes | memoryview],
                    base64_bytes: bool = False, empty_as_json: bool = False) -> list[Any]:
    """``empty_as_json``: a tensor with no elements goes as ``"data": []`` even where the others
    go binary — the one form every server reads (KServe reads ``binary_data_size: 0`` without
    a binary section as plain JSON and wants ``data``; Triton takes all three forms)."""
    out = []
    for t in tensors:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        params = _without(t.parameters, "binary_data_size")
        if empty_as_json and 0 in t.shape:
            if params:
                entry["parameters"] = params
            entry["data"] = []
        elif binary_of(t.name):
            entry["parameters"] = {**params, "binary_data_size": t.data.nbytes}
            if t.data.nbytes:
                chunks.append(t.data)
        else:
            data = _json_data(t, base64_bytes)
            if isinstance(data, list) and data and isinstance(data[0], bytes):
                # MLServer's base64 content type (mlserver/codecs/base64.py), per input: the
                # whole tensor goes base64, its elements' bytes unchanged once decoded.
                if "content_type" in params and params["content_type"] != "base64":
                    raise InvalidRequest(
                        f"tensor '{t.name}': BYTES data is not valid UTF-8, and its content_type "
                        f"'{params['content_type']}' leaves no way to send it base64 in JSON")
                params = {**params, "content_type": "base64"}
                data = [base64.b64encode(e).decode("ascii") for e in data]
            if params:
                entry["parameters"] = params
            entry["data"] = data
        out.append(entry)
    return out


def _finish(doc: dict[str, Any], chunks: list[bytes | memoryview]) -> tuple[list[bytes | memoryview], int | None]:
    # Parameters keep a non-finite double as its token (orjson would write null: a value
    # changed, then refused by the reader).
    for holder in (doc, *doc.get("inputs", ()), *doc.get("outputs", ())):
        if "parameters" in holder:
            holder["parameters"] = params_json(holder["parameters"])
    header = orjson.dumps(doc, option=_OPT)
    chunks[0] = header
    # Triton sets Inference-Header-Content-Length only when binary bytes follow: a
    # response whose binary outputs are all empty is plain JSON (http_server.cc,
    # SetResponseHeader(!ordered_buffers.empty(), ...)).
    return chunks, (len(header) if len(chunks) > 1 else None)


def _boolean_parameter(params: Mapping[str, Any], name: str, where: str) -> None:
    if name in params and not isinstance(params[name], bool):
        raise InvalidRequest(f"{where} parameter '{name}' must be a boolean (the HTTP binary-data extension), "
                             f"got {type(params[name]).__name__}")


def encode_request(req: InferRequest, *, binary: bool = True,
                   base64_bytes: bool = False) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks and Inference-Header-Content-Length of a request to a backend.

    ``binary=True`` sends every input in the binary section and asks for binary
    outputs: ``binary_data: true`` on each requested output without its own
    ``binary_data``, or request-level ``binary_data_output: true`` when no output
    is listed (what tritonclient sends). ``binary=False`` writes flat JSON ``data``.
    """
    doc: dict[str, Any] = {}
    if req.id:
        doc["id"] = req.id
    chunks: list[bytes | memoryview] = [b""]
    doc["inputs"] = _encode_tensors(req.inputs, lambda _name: binary, chunks, base64_bytes, empty_as_json=True)
    params = dict(req.parameters)
    # The binary-data extension's parameters take booleans only (Triton and decode_request
    # refuse others): one of another type from a gRPC client is refused by name, never dropped.
    _boolean_parameter(params, "binary_data_output", "request")
    if req.outputs:
        outs = []
        for o in req.outputs:
            oparams = dict(o.parameters)
            _boolean_parameter(oparams, "binary_data", f"output '{o.name}'")
            if binary:
                oparams.setdefault("binary_data", True)
            outs.append({"name": o.name, "parameters": oparams} if oparams else {"name": o.name})
        doc["outputs"] = outs
    elif binary:
        params.setdefault("binary_data_output", True)
    if params:
        doc["parameters"] = params
    return _finish(doc, chunks)


def encode_response(
    resp: InferResponse, *, default_binary: bool = False, overrides: Mapping[str, bool] = _NO_OVERRIDES
) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks and Inference-Header-Content-Length, as Triton's HTTP server writes them.

    Field order follows http_server.cc: ``id`` (only when set), ``model_name``,
    ``model_version``, ``parameters`` (only when set), ``outputs``; each output
    ``name``, ``datatype``, ``shape``, then ``parameters.binary_data_size`` (binary)
    or flat ``data`` (JSON). Binary bytes follow in output order; empty ones add
    nothing, and with no binary bytes at all the header length is None.
    """
    doc: dict[str, Any] = {}
    if resp.id:
        doc["id"] = resp.id
    doc["model_name"] = resp.model_name
    if resp.model_version:
        doc["model_version"] = resp.model_version
    if resp.parameters:
        doc["parameters"] = resp.parameters
    chunks: list[bytes | memoryview] = [b""]
    doc["outputs"] = _encode_tensors(resp.outputs, lambda name: overrides.get(name, default_binary), chunks)
    return _finish(doc, chunks)
