"""``inference.ModelInferRequest`` / ``ModelInferResponse`` wire bytes ↔ the neutral model.

Tensor bytes never go through protobuf-python, which copies a ``bytes`` field
on every read (DESIGN.md "The hot path"). Decoding scans the top-level fields
(:mod:`.wire`): ``raw_input_contents`` (request field 7) and
``raw_output_contents`` (response field 6) become memoryview slices of the
message, and only the other fields — names, shapes, parameters — are handed
to the generated protobuf. Encoding serialises that header with protobuf and
appends the raw fields written around the tensor memoryviews; protobuf field
order is free (a repeated field may appear anywhere, in order), so the one
``b"".join`` is the only copy of tensor bytes.

Spec "Tensor Data" (GRPC): raw contents, when present, hold one entry per
tensor in tensor order and exclude typed ``contents``. Typed
``InferTensorContents`` are still accepted on decode and turned into raw bytes
with numpy; encoding always writes raw contents, the only form tritonclient's
gRPC ``InferResult.as_numpy`` reads for non-BYTES outputs.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from .._pb import grpc_predict_v2_pb2 as pb
from ..errors import InvalidRequest, Unsupported
from ..model import InferRequest, InferResponse, Params, RequestedOutput, Tensor
from .datatypes import (
    INT64_MAX,
    DatatypeInfo,
    byte_view,
    bytes_values,
    datatype_info,
    element_count,
    serialize_bytes_elements,
    tensor_view,
    to_numpy,
    validate_tensor,
)
from .wire import encode_len_field, encode_varint, iter_fields

__all__ = ["HTTP_ONLY_PARAMS", "decode_request", "decode_response", "encode_request", "encode_response",
           "encode_stream_response", "uses_typed_contents"]

_REQUEST_RAW = 7  # ModelInferRequest.raw_input_contents
_RESPONSE_RAW = 6  # ModelInferResponse.raw_output_contents
_LEN = 2

# Parameters of Triton's HTTP binary-data extension; they describe one HTTP body
# and mean nothing to a gRPC server, so they are dropped when building gRPC messages.
HTTP_ONLY_PARAMS = frozenset({"binary_data", "binary_data_output", "binary_data_size"})

# datatype -> (InferTensorContents field, numpy dtype of that repeated field)
_TYPED: dict[str, tuple[str, str]] = {
    "BOOL": ("bool_contents", "|b1"),
    "INT8": ("int_contents", "<i4"),
    "INT16": ("int_contents", "<i4"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "UINT8": ("uint_contents", "<u4"),
    "UINT16": ("uint_contents", "<u4"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
    "BYTES": ("bytes_contents", "O"),
}


# ------------------------------------------------------------------- scanning
# Below this many raw bytes protobuf parses the whole message (its C copy of the raw
# fields is cheaper than re-encoding the header fields in Python); above it, only
# the re-encoded header goes to protobuf and the tensors are never copied.
_SMALL_RAW = 64 * 1024


def _split(message: bytes | bytearray | memoryview, raw_field: int, cls: Any) -> tuple[Any, list[memoryview]]:
    """Parse every field but ``raw_field`` with protobuf; return the raw entries as slices."""
    view = byte_view(message)
    raws: list[memoryview] = []
    fields: list[tuple[int, int, Any]] = []
    try:
        for fnum, wtype, value in iter_fields(view):
            if fnum != raw_field:
                fields.append((fnum, wtype, value))
            elif wtype == _LEN:
                raws.append(value)  # type: ignore[arg-type]
            else:
                raise InvalidRequest(f"malformed {cls.__name__}: raw contents with wire type {wtype}")
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message + _where_it_broke(cls, fields, raw_field, len(raws))) from exc
    try:
        small = sum(r.nbytes for r in raws) <= _SMALL_RAW
        msg = cls.FromString(view if small else _reencode(fields))
    except DecodeError as exc:
        raise InvalidRequest(f"malformed {cls.__name__}: {exc}") from exc
    return msg, raws


def _reencode(fields: list[tuple[int, int, Any]]) -> bytes:
    """Serialize scanned fields again (keys re-encoded, values as scanned)."""
    parts: list[bytes | memoryview] = []
    for fnum, wtype, value in fields:
        if wtype == _LEN:
            parts += (encode_len_field(fnum, len(value)), value)
        else:  # a varint int or a fixed-width slice
            parts += (encode_varint((fnum << 3) | wtype), encode_varint(value) if isinstance(value, int) else value)
    return b"".join(parts)


def _where_it_broke(cls: Any, fields: list[tuple[int, int, Any]], raw_field: int, seen: int) -> str:
    """Name the tensor whose raw contents a truncated message breaks off in, when known.

    Serialisers write fields in number order, so the tensor list (fields 5/6)
    normally precedes the raw contents and has already been scanned.
    """
    try:
        msg = cls.FromString(_reencode(fields))
    except DecodeError:
        return ""
    tensors = msg.inputs if raw_field == _REQUEST_RAW else msg.outputs
    if seen < len(tensors):
        return f" (at the raw contents of tensor '{tensors[seen].name}', {seen} of {len(tensors)} complete)"
    return ""


def _parts(header: bytes, raw_field: int, datas: Iterable[memoryview]) -> list[bytes | memoryview]:
    """A message as its pieces: the serialized fields, then each raw contents field's tag and
    length followed by the tensor's bytes themselves (views, not copies)."""
    parts: list[bytes | memoryview] = [header]
    for data in datas:
        parts.append(encode_len_field(raw_field, data.nbytes))
        parts.append(data)
    return parts


def parts_length(parts: Iterable[bytes | memoryview]) -> int:
    """The bytes of a message given as its pieces (:func:`encode_request_parts`)."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


def _join(header: bytes, raw_field: int, datas: Iterable[memoryview]) -> bytes:
    return b"".join(_parts(header, raw_field, datas))  # the single copy of tensor bytes


# ----------------------------------------------------------------- parameters
def _params_from_pb(params: Mapping[str, Any], where: str) -> Params:
    out: Params = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidRequest(f"{where}: parameter '{key}' has no value")
        out[key] = getattr(p, which)
    return out


def _params_to_pb(target: Any, params: Params, where: str) -> None:
    """Python scalar → InferParameter: bool, int64 (uint64 above 2**63-1), double, string."""
    for key, value in params.items():
        if key in HTTP_ONLY_PARAMS:
            continue
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if -INT64_MAX - 1 <= value <= INT64_MAX:
                p.int64_param = value
            elif INT64_MAX < value < 2**64:
                p.uint64_param = value
            else:
                raise InvalidRequest(f"{where}: parameter '{key}' = {value} does not fit 64 bits")
        elif isinstance(value, float):
            p.double_param = value
        elif isinstance(value, str):
            p.string_param = value
        else:
            raise InvalidRequest(f"{where}: parameter '{key}' must be a bool, int, float or str")


# -------------------------------------------------------------------- tensors
def _typed_to_raw(name: str, info: DatatypeInfo, count: int, contents: Any) -> memoryview:
    """Typed ``InferTensorContents`` → raw little-endian bytes (numpy; per element only for BYTES)."""
    typed = _TYPED.get(info.name)
    if typed is None:  # FP16 / BF16 have no typed field (spec: "must be represented as raw content")
        if count == 0:
            return memoryview(b"")
        raise InvalidRequest(f"tensor '{name}': {info.name} data must be sent as raw contents")
    field, wire_dtype = typed
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidRequest(
            f"tensor '{name}': contents.{field} has {len(values)} values but the shape needs {count}"
        )
    if info.itemsize is None:
        return memoryview(serialize_bytes_elements(values, name))
    arr = np.fromiter(values, dtype=wire_dtype, count=count)
    if arr.dtype.itemsize > info.dtype.itemsize and arr.size:  # int_contents carries INT8/16, uint_contents UINT8/16
        bounds = np.iinfo(info.dtype)
        if int(arr.min()) < bounds.min or int(arr.max()) > bounds.max:
            raise InvalidRequest(f"tensor '{name}': contents.{field} has values out of range for {info.name}")
    return tensor_view(arr.astype(info.dtype, copy=False))


# The datatype Triton names for a typed contents field in its refusals (infer_handler.cc).
_FIELD_TYPE = {"bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
               "uint_contents": "UINT32", "uint64_contents": "UINT64", "fp32_contents": "FP32",
               "fp64_contents": "FP64", "bytes_contents": "BYTES"}


def _check_typed(name: str, info: DatatypeInfo, contents: Any, model: str) -> None:
    """Triton's refusals of typed contents (infer_handler.cc), word for word: a second typed
    field, or one that does not belong to the tensor's datatype."""
    fields = [f.name for f, _ in contents.ListFields()]
    if len(fields) > 1:
        raise InvalidRequest(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', "
                             "binary data was already supplied.")
    typed = _TYPED.get(info.name)
    if fields and (typed is None or fields[0] != typed[0]):
        raise InvalidRequest(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of "
                             f"type '{_FIELD_TYPE.get(fields[0], fields[0])}', expected datatype '{info.name}'")


def _tensors(pb_tensors: Sequence[Any], raws: list[memoryview], what: str, model: str | None = None) -> list[Tensor]:
    """Tensors of a request (``model``: its model's name) or a response. A request is held
    to Triton's own rules, with its wording (infer_handler.cc): typed contents and
    raw_input_contents never together, a raw entry for every input (extra entries are
    ignored, as Triton ignores them)."""
    if model is None and raws and len(raws) != len(pb_tensors):
        raise InvalidRequest(
            f"{what}: {len(raws)} raw contents for {len(pb_tensors)} tensors; "
            "raw contents must hold one entry per tensor"
        )
    tensors = []
    for i, pt in enumerate(pb_tensors):
        name = pt.name
        info = datatype_info(pt.datatype, name)
        shape = tuple(pt.shape)
        count = element_count(shape, name)
        params = _params_from_pb(pt.parameters, f"tensor '{name}'")
        if "shared_memory_region" in params:
            raise Unsupported(f"tensor '{name}': shared-memory tensors cannot cross the gateway")
        if raws:
            if pt.HasField("contents"):
                if model is not None:
                    raise InvalidRequest(f"contents field must not be specified when using raw_input_contents "
                                         f"for '{name}' for model '{model}'")
                if pt.contents.ByteSize():
                    raise InvalidRequest(f"tensor '{name}': typed contents are not allowed with raw contents")
            if i >= len(raws):
                raise InvalidRequest(f"unable to find data for input tensor '{name}' for model '{model}' in request.")
            t = Tensor(name, info.name, shape, raws[i], params)
            validate_tensor(t)
        else:
            if model is not None:
                _check_typed(name, info, pt.contents, model)
            t = Tensor(name, info.name, shape, _typed_to_raw(name, info, count, pt.contents), params)
        tensors.append(t)
    return tensors


def _fill_tensor(target: Any, t: Tensor) -> None:
    target.name = t.name
    target.datatype = t.datatype
    target.shape.extend(t.shape)
    _params_to_pb(target.parameters, t.parameters, f"tensor '{t.name}'")


# ------------------------------------------------------------------ public API
def decode_request(message: bytes | bytearray | memoryview) -> InferRequest:
    """Decode a serialized ModelInferRequest; input data are slices of ``message``."""
    msg, raws = _split(message, _REQUEST_RAW, pb.ModelInferRequest)
    inputs = _tensors(msg.inputs, raws, "ModelInferRequest", msg.model_name)
    # Triton refuses a repeated input over gRPC and HTTP alike (InferenceRequest::AddOriginalInput),
    # and so does http.decode_request: one sent on to an HTTP backend would come back a 400 there.
    names: set[str] = set()
    for t in inputs:
        if t.name in names:
            raise InvalidRequest(f"input '{t.name}' already exists in request")
        names.add(t.name)
    outputs = tuple(
        RequestedOutput(o.name, _params_from_pb(o.parameters, f"output '{o.name}'")) for o in msg.outputs
    )
    for o in outputs:
        if "shared_memory_region" in o.parameters:
            raise Unsupported(f"output '{o.name}': shared-memory outputs cannot cross the gateway")
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        parameters=_params_from_pb(msg.parameters, "request"),
        inputs=tuple(inputs),
        outputs=outputs,
    )


def encode_request(req: InferRequest) -> bytes:
    """Serialize a ModelInferRequest with raw_input_contents; HTTP-only parameters dropped."""
    return b"".join(encode_request_parts(req))


def encode_request_parts(req: InferRequest) -> list[bytes | memoryview]:
    """:func:`encode_request` as the message's pieces, in order: the tensors' bytes are not
    copied (a sender that writes pieces, the gateway's own HTTP/2 client, sends them as they are)."""
    msg = pb.ModelInferRequest(model_name=req.model_name, model_version=req.model_version, id=req.id)
    _params_to_pb(msg.parameters, req.parameters, "request")
    for t in req.inputs:
        _fill_tensor(msg.inputs.add(), t)
    for o in req.outputs:
        out = msg.outputs.add()
        out.name = o.name
        _params_to_pb(out.parameters, o.parameters, f"output '{o.name}'")
    return _parts(msg.SerializeToString(), _REQUEST_RAW, (t.data for t in req.inputs))


def decode_response(message: bytes | memoryview) -> InferResponse:
    """Decode a serialized ModelInferResponse; output data are slices of ``message``."""
    msg, raws = _split(message, _RESPONSE_RAW, pb.ModelInferResponse)
    outputs = _tensors(msg.outputs, raws, "ModelInferResponse")
    return InferResponse(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        parameters=_params_from_pb(msg.parameters, "response"),
        outputs=tuple(outputs),
    )


def encode_stream_response(answer: bytes | None = None, error: str | None = None) -> bytes:
    """Triton's ModelStreamInferResponse (grpc_service.proto): ``error_message`` (1) or
    ``infer_response`` (2, a serialized ModelInferResponse) — how a stream carries each
    message's outcome, errors included, without ending the stream."""
    out = b""
    if error is not None:
        data = error.encode("utf-8")
        out += encode_len_field(1, len(data)) + data
    if answer is not None:
        out += encode_len_field(2, len(answer)) + answer
    return out


def uses_typed_contents(message: bytes | bytearray | memoryview) -> bool:
    """A ModelInferRequest with inputs and no ``raw_input_contents``: its data came typed
    (``contents.fp32_contents``…), so its answer goes back typed (MLServer's own rule;
    tritonclient sends raw and reads raw). One walk over the top-level fields."""
    view = message if isinstance(message, memoryview) else memoryview(message)
    has_inputs = False
    for fnum, wtype, _ in iter_fields(view):
        if fnum == _REQUEST_RAW:
            return False
        # ModelInferRequest.inputs; with another wire type it is an unknown field to protobuf.
        has_inputs = has_inputs or (fnum == 5 and wtype == _LEN)
    return has_inputs


def encode_response(resp: InferResponse, *, typed: bool = False) -> bytes:
    """Serialize a ModelInferResponse: outputs in raw_output_contents, or — ``typed``, and
    every output has a typed field (FP16/BF16 have none: then all go raw, since the spec
    takes raw contents for all outputs or none) — in each output's ``contents``."""
    parts = encode_response_parts(resp, typed=typed)
    return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)


def encode_response_parts(resp: InferResponse, *, typed: bool = False) -> list[bytes | memoryview]:
    """:func:`encode_response` as the message's pieces: raw outputs' bytes are not copied."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    _params_to_pb(msg.parameters, resp.parameters, "response")
    typed = typed and all(t.datatype in _TYPED for t in resp.outputs)
    for t in resp.outputs:
        target = msg.outputs.add()
        _fill_tensor(target, t)
        if typed:
            field, wire_dtype = _TYPED[t.datatype]
            if t.datatype == "BYTES":
                values: list[Any] = bytes_values(t.data, t.name)
            else:
                values = to_numpy(t, flat=True).astype(wire_dtype).tolist()
            getattr(target.contents, field).extend(values)
    if typed:
        return [msg.SerializeToString()]
    return _parts(msg.SerializeToString(), _RESPONSE_RAW, (t.data for t in resp.outputs))
