"""Triton's extension messages between its HTTP JSON and its gRPC protobuf. No I/O.

Triton answers HTTP ``/config`` and ``/stats`` with the JSON mapping of the protobuf
messages its gRPC ``ModelConfig`` / ``ModelStatistics`` RPCs answer (model_config.proto,
grpc_service.proto): the proto's own field names, every field printed (defaults
included; an unset sub-message left out), enums by name, map keys as strings — and,
unlike protobuf's canonical mapping, 64-bit integers as JSON *numbers* (Triton rewrites
the strings protobuf prints: model_config_utils.cc ``ModelConfigToJson``, all but three
fields; the statistics JSON is written by hand with numbers). Checked against the Triton
in nvidia-pytriton: the JSON built here equals Triton's own, key for key and value for
value (tests/integration/test_triton_extensions.py).

Never a changed value: a message with fields this gateway does not know (a newer
Triton) is refused with their numbers, never passed on without them; a JSON document
with a key the message has not is refused naming it.
"""
from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Iterable, Sequence
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

__all__ = [
    "config_from_json",
    "config_to_json",
    "control_from_json",
    "control_to_json",
    "log_to_json",
    "log_to_pb",
    "message_from_json",
    "message_to_json",
    "parse_message",
    "stats_from_json",
    "stats_from_pb",
    "stats_sum",
    "stats_to_json",
    "stats_to_pb",
    "trace_to_json",
    "trace_to_pb",
    "version_refusal",
]

M = TypeVar("M", bound=Message)
Fault = Callable[[str], GatewayError]

_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})
_FLOAT = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
_UINT64_MAX = (1 << 64) - 1


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


# -- statistics --------------------------------------------------------------------------------

def stats_from_pb(answer: bytes) -> tx.ModelStatisticsResponse:
    return parse_message(tx.ModelStatisticsResponse, answer, "model statistics")


def stats_from_json(body: bytes | bytearray) -> tx.ModelStatisticsResponse:
    what = "model statistics"
    return message_from_json(tx.ModelStatisticsResponse, _load(body, what, BadUpstreamResponse), what,
                             BadUpstreamResponse)


def stats_to_json(stats: tx.ModelStatisticsResponse) -> bytes:
    return orjson.dumps(message_to_json(stats))


def stats_to_pb(stats: tx.ModelStatisticsResponse) -> bytes:
    return stats.SerializeToString()


def _add(a: int, b: int, what: str) -> int:
    total = a + b
    if total > _UINT64_MAX:
        raise BadUpstreamResponse(f"model statistics: the sum of {what} over the pool's endpoints exceeds uint64")
    return total


def _add_durations(acc: Message, other: Message) -> None:
    """Every StatisticDuration field of ``other`` added into ``acc`` (count and ns)."""
    for field, value in other.ListFields():
        if field.message_type is None:
            continue  # batch_size: the key, not a duration
        target = getattr(acc, field.name)
        target.count = _add(target.count, value.count, f"{field.name}.count")
        target.ns = _add(target.ns, value.ns, f"{field.name}.ns")


def _keyed(items: Iterable[M], key: Callable[[M], Any]) -> dict[Any, M]:
    return {key(x): x for x in items}


def stats_sum(parts: Sequence[tx.ModelStatisticsResponse]) -> tx.ModelStatisticsResponse:
    """The statistics of several endpoints as one: per model and version, counts and
    durations summed, ``last_inference`` the latest, batch statistics summed per batch
    size, response statistics per key, memory usage per (type, id)."""
    if len(parts) == 1:
        return parts[0]
    out = tx.ModelStatisticsResponse()
    index: dict[tuple[str, str], tx.ModelStatistics] = {}
    for part in parts:
        for s in part.model_stats:
            acc = index.get((s.name, s.version))
            if acc is None:
                acc = out.model_stats.add()
                acc.CopyFrom(s)
                index[(s.name, s.version)] = acc
                continue
            acc.last_inference = max(acc.last_inference, s.last_inference)
            acc.inference_count = _add(acc.inference_count, s.inference_count, "inference_count")
            acc.execution_count = _add(acc.execution_count, s.execution_count, "execution_count")
            _add_durations(acc.inference_stats, s.inference_stats)
            batches = _keyed(acc.batch_stats, lambda b: b.batch_size)
            for b in s.batch_stats:
                if b.batch_size in batches:
                    _add_durations(batches[b.batch_size], b)
                else:
                    acc.batch_stats.add().CopyFrom(b)
            memory = _keyed(acc.memory_usage, lambda m: (m.type, m.id))
            for mu in s.memory_usage:
                if (mu.type, mu.id) in memory:
                    held = memory[(mu.type, mu.id)]
                    held.byte_size = _add(held.byte_size, mu.byte_size, "memory_usage.byte_size")
                else:
                    acc.memory_usage.add().CopyFrom(mu)
            for key, rs in s.response_stats.items():
                if key in acc.response_stats:
                    _add_durations(acc.response_stats[key], rs)
                else:
                    acc.response_stats[key].CopyFrom(rs)
    return out


# -- model control (load / unload) ----------------------------------------------------------
# HTTP: POST /v2/repository/models/{m}/load|unload with {"parameters": {k: v}}; gRPC:
# RepositoryModel{Load,Unload}Request.parameters, a map of ModelRepositoryParameter (one of
# bool / int64 / string / bytes). Triton's own rules: ``config`` is a string (a JSON model
# configuration), ``file:<path>`` carries a file's content — base64 text over HTTP, bytes
# over gRPC — and unload's ``unload_dependents`` a boolean (http_server.cc, grpc_server.cc
# HandleRepositoryModelLoad / Unload).
_FILE = "file:"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def control_to_json(message: bytes, unload: bool) -> tuple[str, bytes]:
    """A gRPC load/unload request → (model name, HTTP body)."""
    cls: type[Any] = tx.RepositoryModelUnloadRequest if unload else tx.RepositoryModelLoadRequest
    request = parse_message(cls, message, cls.DESCRIPTOR.name, InvalidRequest)
    params: dict[str, Any] = {}
    for key, p in request.parameters.items():
        kind = p.WhichOneof("parameter_choice")
        if kind == "bytes_param":
            if not key.startswith(_FILE):
                raise InvalidRequest(f"load parameter '{key}': only file: parameters can carry bytes over HTTP")
            params[key] = base64.b64encode(p.bytes_param).decode("ascii")
        elif kind is None:
            raise InvalidRequest(f"load parameter '{key}' has no value")
        else:
            params[key] = getattr(p, kind)
    return request.model_name, orjson.dumps({"parameters": params} if params else {})


def control_from_json(body: bytes | bytearray, model: str, unload: bool) -> bytes:
    """An HTTP load/unload body → a serialized gRPC request for ``model``."""
    cls: type[Any] = tx.RepositoryModelUnloadRequest if unload else tx.RepositoryModelLoadRequest
    request = cls(model_name=model)
    doc = _load(body, "model control request", InvalidRequest) if bytes(body).strip() else {}
    if not isinstance(doc, dict):
        raise InvalidRequest("model control request must be a JSON object")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequest("model control request: 'parameters' must be a JSON object")
    for key, v in params.items():
        p = request.parameters[key]
        if key.startswith(_FILE) and isinstance(v, str):
            try:
                p.bytes_param = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequest(f"load parameter '{key}' is not valid base64: {exc}") from exc
        elif isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int) and _INT64_MIN <= v <= _INT64_MAX:
            p.int64_param = v
        elif isinstance(v, str):
            p.string_param = v
        else:
            raise InvalidRequest(f"load parameter '{key}': {type(v).__name__} {v!r} has no form in gRPC "
                                 "(a string, a boolean or a 64-bit integer)")
    return request.SerializeToString()


# -- trace and log settings ------------------------------------------------------------------
# HTTP (http_server.cc HandleTrace / HandleLogging): a JSON object; trace values are strings
# but ``trace_level``, a list of strings, and null clears a trace setting; log values are
# booleans, an unsigned integer (log_verbose_level) or strings, and null is ignored. gRPC
# (grpc_server.cc TraceSetting / LogSettings): map<string, SettingValue>; a trace value is
# a list of strings (empty: clear), a log value one of bool / uint32 / string. A gRPC
# request with no settings reads them, as an HTTP GET does.
_TRACE_LISTS = frozenset({"trace_level"})
_UINT32_MAX = (1 << 32) - 1


def _settings_doc(body: bytes | bytearray, what: str, fault: Fault) -> dict[str, Any]:
    doc = _load(body, what, fault) if bytes(body).strip() else {}
    if not isinstance(doc, dict):
        raise fault(f"{what} must be a JSON object")
    return doc


def trace_to_pb(body: bytes | bytearray, model: str, *, answer: bool) -> bytes:
    """HTTP trace settings (request or answer) → TraceSettingRequest / Response."""
    what = "trace settings"
    fault: Fault = BadUpstreamResponse if answer else InvalidRequest
    msg: Any = tx.TraceSettingResponse() if answer else tx.TraceSettingRequest(model_name=model)
    for key, v in _settings_doc(body, what, fault).items():
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            if not v and not answer:
                continue  # HTTP's [] leaves a setting as it is; gRPC's empty list would clear it
            msg.settings[key].value.extend(v)
        elif isinstance(v, str):
            msg.settings[key].value.append(v)
        elif v is None:
            msg.settings[key].SetInParent()  # no values: clear it
        else:
            raise fault(f"{what}: '{key}' must be a string, a list of strings or null, not {type(v).__name__}")
    return msg.SerializeToString()


def trace_to_json(message: bytes, *, answer: bool) -> tuple[str, bytes | None]:
    """TraceSettingRequest / Response → (model name, HTTP JSON); the JSON is None for a
    request that sets nothing (an HTTP GET)."""
    cls: type[Any] = tx.TraceSettingResponse if answer else tx.TraceSettingRequest
    msg = parse_message(cls, message, "trace settings", BadUpstreamResponse if answer else InvalidRequest)
    doc: dict[str, Any] = {}
    for key, sv in msg.settings.items():
        values = list(sv.value)
        doc[key] = values if key in _TRACE_LISTS or len(values) > 1 else (values[0] if values else None)
    model = "" if answer else msg.model_name
    if not answer and not doc:
        return model, None
    return model, orjson.dumps(doc)


def log_to_pb(body: bytes | bytearray, *, answer: bool) -> bytes:
    """HTTP log settings (request or answer) → LogSettingsRequest / Response."""
    what = "log settings"
    fault: Fault = BadUpstreamResponse if answer else InvalidRequest
    msg: Any = tx.LogSettingsResponse() if answer else tx.LogSettingsRequest()
    for key, v in _settings_doc(body, what, fault).items():
        if v is None:
            continue  # HTTP ignores a null log setting; leaving it out does the same over gRPC
        if isinstance(v, bool):
            msg.settings[key].bool_param = v
        elif isinstance(v, int) and 0 <= v <= _UINT32_MAX:
            msg.settings[key].uint32_param = v
        elif isinstance(v, str):
            msg.settings[key].string_param = v
        else:
            raise fault(f"{what}: '{key}' must be a boolean, an unsigned 32-bit integer or a string, not {v!r}")
    return msg.SerializeToString()


def log_to_json(message: bytes, *, answer: bool) -> bytes | None:
    """LogSettingsRequest / Response → HTTP JSON; None for a request that sets nothing."""
    cls: type[Any] = tx.LogSettingsResponse if answer else tx.LogSettingsRequest
    msg = parse_message(cls, message, "log settings", BadUpstreamResponse if answer else InvalidRequest)
    doc: dict[str, Any] = {}
    for key, sv in msg.settings.items():
        kind = sv.WhichOneof("parameter_choice")
        doc[key] = None if kind is None else getattr(sv, kind)
    if not answer and not doc:
        return None
    return orjson.dumps(doc)


# -- model versions --------------------------------------------------------------------------
_VERSION_DIGITS = re.compile(r"[0-9]+")
_VERSION_PREFIX = re.compile(r"\s*([+-]?[0-9]+)")


def version_refusal(version: str) -> str | None:
    """Triton's gRPC refusal of a model version string, word for word (server common.cc
    GetModelVersionFromString: ``std::stol``, then > 0), or None when Triton takes it.
    Triton's HTTP routes take only digits (anything else: 404 "Not Found"), so a converting
    path uses this to answer as the client's protocol would have."""
    if not version or _VERSION_DIGITS.fullmatch(version):
        return None
    m = _VERSION_PREFIX.match(version)
    if m is None:
        return (f"failed to get model version from specified version string '{version}' (details: stol), "
                "version should be an integral value > 0")
    if int(m.group(1)) < 0:
        return f"invalid model version specified '{version}' , version should be an integral value > 0"
    return None
