"""Protobuf messages ↔ Triton's JSON mapping of them (the rules: codec/triton.py's docstring),
both ways and refusing what would be lost; and the model configuration (``/config``) through it."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import orjson
from google.protobuf import json_format, unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from .._pb import model_config_pb2 as mc
from .._pb import triton_extensions_pb2 as tx
from ..errors import BadUpstreamResponse, GatewayError, InvalidRequest
from .jsondup import refuse_repeats

__all__ = ["config_from_json", "config_to_json", "message_from_json", "message_to_json", "parse_message"]

M = TypeVar("M", bound=Message)
Fault = Callable[[str], GatewayError]

_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})
_FLOAT = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})


# -- protobuf → Triton's JSON --------------------------------------------------------------

# 64-bit fields Triton's ModelConfigToJson leaves as protobuf prints them, strings: its
# rewrite list (model_config_utils.cc) does not reach them (initial_state's dims are
# looked up on the wrong object there). The gateway writes what Triton writes.
_TRITON_KEEPS_STRINGS = frozenset({
    "inference.ModelSequenceBatching.InitialState.dims",
    "inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape.dim",
    "inference.ModelInstanceGroup.SecondaryDevice.device_id",
})


def _number(v: Any, kind: int) -> Any:
    if kind in _INT64 and isinstance(v, str):
        return int(v)  # protobuf's JSON prints 64-bit integers as strings; Triton as numbers
    if kind in _FLOAT and isinstance(v, float) and math.isfinite(v) and v.is_integer() \
            and abs(v) < 2 ** 53 and not (v == 0 and math.copysign(1.0, v) < 0):
        return int(v)  # Triton (C++ protobuf) prints 1.0 as 1: the same number, the same text
    return v


def _to_float32(v: Any, kind: int) -> Any:
    """A JSON number bound for a ``float`` field, rounded to float32 first: what the field
    holds either way, but protobuf's Python parser refuses a double a hair beyond FLT_MAX
    (C++ prints FLT_MAX as 3.40282347e+38) that rounds to it."""
    if kind == FieldDescriptor.TYPE_FLOAT and isinstance(v, (int, float)) and not isinstance(v, bool):
        with np.errstate(over="ignore"):
            f32 = float(np.float32(v))
        return f32 if math.isfinite(f32) else v
    return v


def _fix(d: dict[str, Any], desc: Descriptor, number: Callable[[Any, int], Any] | None = None) -> dict[str, Any]:
    number = number or _number
    for f in desc.fields:
        if f.name not in d:
            continue
        v = d[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            if not isinstance(v, dict):
                continue  # the parser names what is wrong
            if value_field.message_type is not None:
                d[f.name] = {k: _fix(x, value_field.message_type, number) if isinstance(x, dict) else x
                             for k, x in v.items()}
            else:
                d[f.name] = {k: number(x, value_field.type) for k, x in v.items()}
        elif f.message_type is not None:
            if f.is_repeated and isinstance(v, list):
                d[f.name] = [_fix(x, f.message_type, number) if isinstance(x, dict) else x for x in v]
            elif isinstance(v, dict):
                d[f.name] = _fix(v, f.message_type, number)
        elif f.full_name in _TRITON_KEEPS_STRINGS and number is _number:
            continue
        elif f.is_repeated and isinstance(v, list):
            d[f.name] = [number(x, f.type) for x in v]
        else:
            d[f.name] = number(v, f.type)
    return d


def _unknown(msg: Message, path: str = "") -> list[str]:
    """Paths of fields in ``msg`` (recursively) that our descriptors do not know."""
    found = [f"{path or msg.DESCRIPTOR.name}#{f.field_number}" for f in unknown_fields.UnknownFieldSet(msg)]
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        where = f"{path or msg.DESCRIPTOR.name}.{field.name}"
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for k, x in value.items():
                    found += _unknown(x, f"{where}[{k}]")
        elif field.is_repeated:
            for i, x in enumerate(value):
                found += _unknown(x, f"{where}[{i}]")
        else:
            found += _unknown(value, where)
    return found


def message_to_json(msg: Message) -> dict[str, Any]:
    """``msg`` as Triton writes it in JSON (see the module doc)."""
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _fix(d, msg.DESCRIPTOR)


def parse_message(cls: type[M], data: bytes, what: str, fault: Fault = BadUpstreamResponse) -> M:
    """A serialized message, refused (``fault``) when it is malformed or carries fields
    the gateway would drop converting it."""
    try:
        msg = cls.FromString(data)
    except DecodeError as exc:
        raise fault(f"{what}: not a valid {cls.DESCRIPTOR.name}: {exc}") from exc
    unknown = _unknown(msg)
    if unknown:
        raise fault(f"{what} has fields this gateway does not know ({', '.join(unknown[:8])}); it cannot be "
                    "converted without losing them — use a listener of the backend's own protocol")
    return msg


# -- Triton's JSON → protobuf --------------------------------------------------------------

def message_from_json(cls: type[M], doc: Any, what: str, fault: Fault = InvalidRequest) -> M:
    """A JSON object (already parsed) as ``cls``; an unknown key, a wrong type or an
    integer out of its field's range is refused (``fault``), naming it."""
    if not isinstance(doc, dict):
        raise fault(f"{what} must be a JSON object")
    try:
        return json_format.ParseDict(_fix(doc, cls.DESCRIPTOR, _to_float32), cls(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise fault(f"{what}: {exc}") from exc


def _load(body: bytes | bytearray, what: str, fault: Fault) -> Any:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise fault(f"{what} is not valid JSON: {exc}") from exc
    # A repeated name: Triton reads the first, orjson kept the last (codec/jsondup.py).
    refuse_repeats(body, what, fault)
    return doc


# -- model configuration ---------------------------------------------------------------------

def config_to_json(answer: bytes) -> bytes:
    """A gRPC ModelConfigResponse → the HTTP ``/config`` body (the ModelConfig object)."""
    response = parse_message(tx.ModelConfigResponse, answer, "model configuration")
    return orjson.dumps(message_to_json(response.config))


def config_from_json(body: bytes | bytearray) -> bytes:
    """An HTTP ``/config`` body → a serialized gRPC ModelConfigResponse."""
    what = "model configuration"
    config = message_from_json(mc.ModelConfig, _load(body, what, BadUpstreamResponse), what, BadUpstreamResponse)
    return tx.ModelConfigResponse(config=config).SerializeToString()
