"""Triton's model control and server settings between HTTP JSON and gRPC (codec/triton.py):
model load / unload, trace and log settings, and the refusal of a model version string."""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import orjson

from .._pb import triton_extensions_pb2 as tx
from ..errors import BadUpstreamResponse, InvalidRequest
from .tritonjson import Fault, _load, parse_message

__all__ = ["control_from_json", "control_to_json", "log_to_json", "log_to_pb", "trace_to_json", "trace_to_pb",
           "version_refusal"]


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
