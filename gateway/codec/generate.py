"""Triton's generate extension (docs/protocol/extension_generate.md) ↔ ModelInfer messages. No I/O.

HTTP backends take a generate request as it is (pass-through); a gRPC backend has no generate
endpoint, so the gateway does what Triton's HTTP front end does (``HandleGenerate`` in
src/http_server.cc, Triton 2.51 — the server nvidia-pytriton ships — and unchanged in
substance up to 2.73):

- **request** (``ConvertGenerateRequest`` / ``ExactMappingInput``): the body is one JSON
  object. A key naming a model input becomes that input tensor, its datatype and shape
  from the model's metadata; every other key becomes a request parameter (string, int,
  bool or double). The reserved key ``parameters`` holds an object whose keys follow the
  same rule (an input may be given there too). ``id`` is also the request id (and, as in
  Triton, a parameter). A tensor's value is one JSON value or a flat array; its shape is
  the metadata shape with the fixed dimensions dividing the element count, the innermost
  ``-1`` taking the rest and the other ``-1`` dimensions 1.
- **response** (``FinalizeResponse`` / ``ExactMappingOutput``): one flat object with
  ``id`` (when set), ``model_name``, ``model_version`` (a string), every response
  parameter, and every output — a single element as a bare value, else a flat array —
  keyed by name in byte order (Triton collects them in a ``std::map``); on a clash the
  first of id/name/version, parameters, outputs wins.
- **generate_stream** writes each response as one server-sent event, ``data: <json>\\n\\n``,
  an error as ``data: {"error": ...}\\n\\n``.

Nothing is changed on the way: a value that cannot travel as it is — an integer out of
its type's range, BYTES that are not UTF-8, a request parameter name that Triton's gRPC
front end would read as sequence control, priority or timeout — is refused with an error
naming it, where Triton itself would truncate, reinterpret or write invalid JSON.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from .._pb import grpc_predict_v2_pb2 as pb
from ..errors import BadUpstreamResponse, InvalidRequest, Unsupported
from ..model import Tensor
from .datatypes import INT64_MAX, bytes_values, datatype_info, element_count, serialize_bytes_elements, to_numpy
from .grpc import decode_response
from .jsonnum import float_json, float_token
from .wire import iter_fields

__all__ = [
    "EXACTLY_ONE",
    "GRPC_RESERVED_PARAMS",
    "SSE_CONTENT_TYPE",
    "InputSpec",
    "StreamAnswer",
    "answer_json",
    "error_json",
    "generate_to_grpc",
    "inputs_from_metadata",
    "parse_generate",
    "split_stream_answer",
    "sse_event",
    "tensor_shape",
]

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"

# Triton's body for /generate when a (decoupled) model answered 0 or several times
# (GenerateRequestClass::SendChunkResponse), sent with the first answer's status.
EXACTLY_ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
               "generates various number of responses")

# Request parameters Triton's gRPC front end interprets (src/grpc/infer_handler.cc,
# SetInferenceRequestMetadata) where generate passes them to the model as plain
# parameters: sent over gRPC they would change what the request means.
GRPC_RESERVED_PARAMS = {
    "sequence_id": "a sequence's correlation id",
    "sequence_start": "the start of a sequence",
    "sequence_end": "the end of a sequence",
    "priority": "the request's priority",
    "timeout": "the request's timeout",
}

# Added by Triton's gRPC stream to every answer; Triton's HTTP generate has no such key.
_STREAM_ONLY_PARAMS = frozenset({"triton_final_response"})

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_PARAMETERS = "parameters"


class _Obj(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order, duplicates kept (RapidJSON's
    ``Members`` sees them too), so a repeated key is an error rather than a lost value."""


def _too_big(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidRequest(f"failed to parse the request JSON buffer: number {text} is beyond the range of a double")
    return value


def parse_generate(body: bytes | bytearray | memoryview) -> _Obj:
    """The generate request body → its top-level members. The standard library's parser:
    it keeps duplicate keys (object_pairs_hook) and reads ``NaN`` / ``Infinity`` as
    RapidJSON does; generate bodies are small, text-oriented JSON."""
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"failed to parse the request JSON buffer: not UTF-8 ({exc.reason} at {exc.start})") from exc
    try:
        doc = json.loads(text, object_pairs_hook=_Obj, parse_float=_too_big)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"failed to parse the request JSON buffer: {exc.msg} at {exc.pos}") from exc
    except RecursionError as exc:
        raise InvalidRequest("failed to parse the request JSON buffer: nested too deeply") from exc
    if not isinstance(doc, _Obj):
        raise InvalidRequest("the generate request must be a JSON object")
    return doc


# ----------------------------------------------------------------------- metadata
@dataclass(frozen=True, slots=True)
class InputSpec:
    """A model input as its metadata gives it (spec "Model Metadata Response JSON Object")."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def inputs_from_metadata(metadata: Mapping[str, Any], backend: str) -> dict[str, InputSpec]:
    """The model's inputs by name, from a backend's model metadata."""
    out: dict[str, InputSpec] = {}
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list):
        raise BadUpstreamResponse(f"backend '{backend}' sent model metadata without an 'inputs' array")
    for i in inputs:
        name, datatype, shape = (i.get(k) for k in ("name", "datatype", "shape")) if isinstance(i, dict) else (0,) * 3
        if not (isinstance(name, str) and isinstance(datatype, str) and isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
            raise BadUpstreamResponse(f"backend '{backend}' sent model metadata with a malformed input: {i!r}")
        out[name] = InputSpec(name, datatype, tuple(shape))
    return out


# ------------------------------------------------------------------------ request
def tensor_shape(name: str, dims: tuple[int, ...], count: int) -> tuple[int, ...]:
    """Triton's shape for ``count`` elements of an input with metadata ``dims``
    (ExactMappingInput): fixed dimensions divide the count, innermost first; the innermost
    ``-1`` takes what is left and every other ``-1`` becomes 1; nothing may remain."""
    left = count
    for d in reversed(dims):
        if d != -1:
            if d <= 0 or left % d:  # (a 0 dimension would divide by zero in Triton)
                raise InvalidRequest(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= d
    shape = list(dims)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], left = left, 1
    if left != 1:
        raise InvalidRequest(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def _raw_data(spec: InputSpec, values: list[Any]) -> bytes:
    """JSON values → the tensor's raw little-endian bytes, each value checked against the
    datatype (no bool for numbers, no float for integers, nothing out of range)."""
    name = spec.name
    info = datatype_info(spec.datatype, name)
    if info.name in ("FP16", "BF16"):
        raise InvalidRequest(f"receiving {info.name} data via JSON is not supported. Please use the binary data "
                             f"format for input {name}")
    kinds = set(map(type, values))
    if info.itemsize is None:
        if not kinds <= {str}:
            raise InvalidRequest(f"input '{name}' is BYTES: its value must be a string or an array of strings")
        try:
            return serialize_bytes_elements([v.encode("utf-8") for v in values], name)
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"input '{name}' holds a lone surrogate escape, which is not UTF-8 text") from exc
    if info.name == "BOOL":
        if not kinds <= {bool}:
            raise InvalidRequest(f"input '{name}' is BOOL: its value must be true/false or an array of them")
        return np.array(values, dtype=info.dtype).tobytes()
    if info.dtype.kind in "iu":
        if not kinds <= {int}:
            raise InvalidRequest(f"input '{name}' is {info.name}: its value must be an integer or an array of them")
        bounds = np.iinfo(info.dtype)
        if values and (min(values) < bounds.min or max(values) > bounds.max):
            bad = next(v for v in values if not bounds.min <= v <= bounds.max)
            raise InvalidRequest(f"input '{name}': {bad} is out of range for {info.name}")
        return np.array(values, dtype=info.dtype).tobytes()
    if not kinds <= {int, float}:
        raise InvalidRequest(f"input '{name}' is {info.name}: its value must be a number or an array of numbers")
    try:
        wide = np.array(values, dtype=np.float64)
    except OverflowError as exc:
        raise InvalidRequest(f"input '{name}': an integer beyond the range of {info.name}") from exc
    with np.errstate(all="ignore"):  # FP64 → FP32 overflow becomes inf, as Triton's C++ cast does
        return wide.astype(info.dtype).tobytes()


def _set_param(msg: Any, key: str, value: Any) -> None:
    """SetTritonParameterFromJsonParameter: string, int, bool or any other number (double)."""
    if key in GRPC_RESERVED_PARAMS or key.startswith("triton_"):
        meaning = GRPC_RESERVED_PARAMS.get(key, "reserved for Triton's own use (an error or a change of behaviour)")
        raise Unsupported(f"generate key '{key}' cannot be sent to a gRPC backend: Triton's gRPC front end reads a "
                          f"request parameter of that name as {meaning}, where generate passes it to the model "
                          "as a plain parameter; use an HTTP backend for this model")
    p = msg.parameters[key]
    if isinstance(value, str):
        try:
            p.string_param = value
        except ValueError as exc:  # protobuf strings are UTF-8: a lone surrogate escape is not
            raise InvalidRequest(f"parameter '{key}' holds a lone surrogate escape, which is not UTF-8 text") from exc
    elif isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise InvalidRequest(f"parameter '{key}' = {value} does not fit a 64-bit integer (as a double it "
                                 "would change value)")
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        del msg.parameters[key]
        raise InvalidRequest(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


class _Request:
    """One ModelInferRequest being filled from generate keys (Triton's ExactMappingInput)."""

    def __init__(self, model: str, version: str, inputs: Mapping[str, InputSpec]) -> None:
        self.msg = pb.ModelInferRequest(model_name=model, model_version=version)
        self.inputs = inputs
        self.seen: set[str] = set()

    def key(self, key: str, value: Any) -> None:
        spec = self.inputs.get(key)
        if spec is None:
            if key in self.msg.parameters:
                raise InvalidRequest(f"generate key '{key}' is given twice (a request has one parameter of a name)")
            _set_param(self.msg, key, value)
            return
        if key in self.seen:
            raise InvalidRequest(f"input '{key}' already exists in request")
        self.seen.add(key)
        values = value if isinstance(value, list) and not isinstance(value, _Obj) else [value]
        if any(isinstance(v, list) for v in values):
            raise InvalidRequest(f"input '{key}': generate takes one value or a flat array (nested arrays and "
                                 "objects cannot be shaped from the model's metadata)")
        shape = tensor_shape(key, spec.shape, len(values))
        raw = _raw_data(spec, values)
        t = self.msg.inputs.add()
        t.name, t.datatype = key, spec.datatype
        t.shape.extend(shape)
        self.msg.raw_input_contents.append(raw)


def generate_to_grpc(doc: _Obj, inputs: Mapping[str, InputSpec], model: str, version: str) -> bytes:
    """A parsed generate request → a serialized ModelInferRequest (raw input contents),
    following Triton's HandleGenerate key by key, in the body's order."""
    req = _Request(model, version, inputs)
    for key, value in doc:
        if key == "id":  # ParseJsonTritonRequestID; the key is still mapped below, as in Triton
            if not isinstance(value, str):
                raise InvalidRequest("Unable to parse 'id': the request id must be a string")
            req.msg.id = value
    for key, value in doc:
        if key != _PARAMETERS:
            req.key(key, value)
            continue
        if _PARAMETERS in inputs:
            raise InvalidRequest("Keyword 'parameters' for nested schema also given as input tensor name")
        if not isinstance(value, _Obj):
            raise InvalidRequest("Expected JSON object for keyword: 'parameters'")
        for k, v in value:
            try:
                req.key(k, v)
            except (InvalidRequest, Unsupported) as exc:
                raise type(exc)(f"Converting keyword: 'parameters': {exc.message}") from exc
    return req.msg.SerializeToString()


# ----------------------------------------------------------------------- response
def _output_value(t: Tensor) -> Any:
    """One output as Triton's generate writes it (WriteDataToJson): a flat array, or its
    only element bare."""
    info = datatype_info(t.datatype, t.name)
    if info.name in ("FP16", "BF16"):
        raise Unsupported(f"sending {info.name} data via JSON is not supported. Please use the binary data format "
                          f"for output (output '{t.name}')")
    count = element_count(t.shape, t.name)
    values: Any
    if info.itemsize is None:
        elems = bytes_values(t.data, t.name)
        if len(elems) != count:
            raise BadUpstreamResponse(f"output '{t.name}': {len(elems)} BYTES elements for shape {list(t.shape)}")
        try:
            values = [e.decode("utf-8") for e in elems]
        except UnicodeDecodeError as exc:
            raise Unsupported(f"output '{t.name}' holds bytes that are not UTF-8: a JSON string cannot carry them "
                              "unchanged (use the infer endpoint with binary outputs)") from exc
        return values[0] if count == 1 else values
    arr = to_numpy(t, flat=True)
    if info.name == "BOOL":
        arr = arr.view(np.uint8) != 0  # any non-zero byte is true (Triton: bool_base[e] != 0)
    elif info.dtype.kind == "f":
        wide = arr.astype(np.float64)  # Triton writes FP32 widened to double (AppendDouble)
        return float_token(float(wide[0])) if count == 1 else float_json(wide)
    return arr.tolist()[0] if count == 1 else arr.tolist()


def answer_json(answer: bytes | memoryview, backend: str) -> bytes:
    """A serialized ModelInferResponse → Triton's generate response JSON."""
    try:
        resp = decode_response(answer)
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"backend '{backend}' sent an unreadable response: {exc.message}") from exc
    fields: dict[str, Any] = {}
    if resp.id:
        fields["id"] = resp.id
    fields["model_name"] = resp.model_name
    fields["model_version"] = resp.model_version
    for key, value in resp.parameters.items():
        if key not in _STREAM_ONLY_PARAMS:
            fields.setdefault(key, float_token(value) if isinstance(value, float) else value)
    for t in resp.outputs:
        if t.name not in fields:
            fields[t.name] = _output_value(t)
    # std::map order: byte order of the UTF-8 keys, which is code point order.
    return orjson.dumps({k: fields[k] for k in sorted(fields)}, option=_NUMPY)


def error_json(message: str) -> bytes:
    """Triton's error object (extension_generate.md "Generate Response JSON Error Object")."""
    return orjson.dumps({"error": message})


def sse_event(data: bytes) -> bytes:
    """One server-sent event as Triton writes it: a ``data:`` line and a blank line."""
    return b"data: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class StreamAnswer:
    """One ModelStreamInferResponse: an answer, or ``error`` — ``began`` says whether the
    request reached the model (Triton fills the error's infer_response with the model's
    name then; an error raised before inference leaves it empty)."""

    answer: memoryview | None
    error: str | None
    began: bool


def split_stream_answer(message: bytes | memoryview) -> StreamAnswer:
    """ModelStreamInferResponse (grpc_service.proto): ``error_message`` (1), ``infer_response`` (2)."""
    error: str | None = None
    answer: memoryview | None = None
    view = message if isinstance(message, memoryview) else memoryview(message)
    try:
        for fnum, wtype, value in iter_fields(view):
            if wtype == 2 and fnum == 1:
                error = bytes(value).decode("utf-8", "replace")
            elif wtype == 2 and fnum == 2:
                answer = value  # type: ignore[assignment]
        began = answer is not None and any(
            fnum == 1 and wtype == 2 and len(value) > 0  # type: ignore[arg-type]
            for fnum, wtype, value in iter_fields(answer))
    except InvalidRequest as exc:
        raise BadUpstreamResponse(f"unreadable ModelStreamInferResponse: {exc.message}") from exc
    if error:
        return StreamAnswer(None, error, began)
    return StreamAnswer(answer if answer is not None else memoryview(b""), None, True)
