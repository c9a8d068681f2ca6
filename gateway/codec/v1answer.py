"""V2 answers as the first generation gives them (codec/v1.py): the InferResponseHeader with
raw outputs or top-K classes, server status, and the RequestStatus of an error."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import text_format

from .._pb import legacy_v1_pb2 as v1
from ..errors import (
    BadUpstreamResponse,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoEndpointAvailable,
    PayloadTooLarge,
    Unsupported,
    UpstreamTimeout,
)
from ..model import Tensor
from .content import is_count
from .datatypes import DATATYPES
from .grpc import decode_response
from .v1model import _TO_V1, ModelInfo
from .v1request import Plan

__all__ = ["finish", "request_status", "server_status", "status_text"]


# ------------------------------------------------------------------ V2 answer → v1
def finish(answer: bytes, plan: Plan, info: ModelInfo, labels: Mapping[str, Sequence[str]] | None = None
           ) -> tuple[v1.InferResponseHeader, list[memoryview]]:
    """The InferResponseHeader and raw outputs (header order) of a V2 ModelInferResponse."""
    response = decode_response(answer)
    version = plan.version
    if response.model_version:
        if not is_count(response.model_version.lstrip("-")):
            raise BadUpstreamResponse(f"model version '{response.model_version}' is not a number: the first-"
                                      "generation API carries versions as int64")
        version = int(response.model_version)
    header = v1.InferResponseHeader(model_name=response.model_name or info.name, model_version=version,
                                    batch_size=plan.batch_size, id=plan.request_id)
    by_name = {t.name: t for t in response.outputs}
    raws: list[memoryview] = []
    for name, count in plan.outputs:
        t = by_name.get(name)
        if t is None:
            raise BadUpstreamResponse(f"the backend's answer has no output '{name}'")
        if t.datatype not in _TO_V1:
            raise Unsupported(f"output '{name}' is {t.datatype}, which the first-generation API has no type for")
        out = header.output.add(name=name, data_type=_TO_V1[t.datatype])
        if plan.batching and (not t.shape or t.shape[0] != plan.batch_size):
            raise BadUpstreamResponse(f"output '{name}' has shape {list(t.shape)}: no batch dimension of "
                                      f"{plan.batch_size} first")
        if count:
            _classes(out, t, count, plan, (labels or {}).get(name) or ())
        else:
            out.raw.dims.extend(t.shape[1:] if plan.batching else t.shape)
            out.raw.batch_byte_size = len(t.data)
            raws.append(t.data)
    return header, raws


def _classes(out: Any, t: Tensor, count: int, plan: Plan, labels: Sequence[str]) -> None:
    """Top ``count`` classes per batch entry (header text "Classes"): the entry's values
    as probabilities, highest first, equal values by lower index."""
    info = DATATYPES[t.datatype]
    if info.itemsize is None:
        raise InvalidRequest(f"output '{t.name}' is BYTES: it cannot be returned as a classification")
    entries = plan.batch_size if plan.batching else 1
    values = np.frombuffer(t.data, dtype=info.dtype).reshape(entries, -1) if len(t.data) else \
        np.zeros((entries, 0), dtype=info.dtype)
    n = values.shape[1]
    for row in values:
        order = n - 1 - np.argsort(row[::-1], kind="stable")[::-1][: min(count, n)]
        picked = row[order]
        as_float = picked.astype(np.float32)
        same = as_float.astype(picked.dtype) == picked
        if picked.dtype.kind == "f":
            same |= np.isnan(picked)
        if not bool(np.all(same)):
            raise Unsupported(f"output '{t.name}': a class value of {t.datatype} does not fit the 32-bit float of "
                              "InferResponseHeader.Output.Class.value; request it raw")
        classes = out.batch_classes.add()
        for idx, value in zip(order.tolist(), as_float.tolist()):
            classes.cls.add(idx=idx, value=value, label=labels[idx] if idx < len(labels) else "")


# ------------------------------------------------------------------ status
_STATES = {"READY": v1.MODEL_READY, "LOADING": v1.MODEL_LOADING, "UNLOADING": v1.MODEL_UNLOADING,
           "UNAVAILABLE": v1.MODEL_UNAVAILABLE}


def _model_config(info: ModelInfo) -> tuple[v1.ModelConfig, str]:
    """The v1 ModelConfig subset of a model, and a note when a tensor has no v1 datatype."""
    config = v1.ModelConfig(name=info.name, platform=info.platform, max_batch_size=info.max_batch_size)
    note = ""
    for t in info.inputs.values():
        config.input.add(name=t.name, data_type=_TO_V1.get(t.datatype, v1.TYPE_INVALID), dims=t.dims)
    for t in info.outputs.values():
        config.output.add(name=t.name, data_type=_TO_V1.get(t.datatype, v1.TYPE_INVALID), dims=t.dims,
                          label_filename=t.label_filename)
    odd = [t.name for t in (*info.inputs.values(), *info.outputs.values()) if t.datatype not in _TO_V1]
    if odd:
        note = (f"tensor(s) {', '.join(repr(n) for n in odd)} have a datatype the first-generation API cannot "
                "express (TYPE_INVALID here); inference with them is refused")
    return config, note


def server_status(server_id: str, version: str, uptime_ns: int, ready: bool,
                  models: Sequence[tuple[ModelInfo, Sequence[tuple[str, str, str]]]]) -> v1.ServerStatus:
    """ServerStatus (API text "Status"): per model its configuration and, per version
    ``(version, state, reason)`` (V2 repository index states), its ready state."""
    status = v1.ServerStatus(id=server_id, version=version, uptime_ns=uptime_ns,
                             ready_state=v1.SERVER_READY if ready else v1.SERVER_INITIALIZING)
    for info, versions in models:
        entry = status.model_status[info.name]
        config, note = _model_config(info)
        entry.config.CopyFrom(config)
        for ver, state, reason in versions:
            if not is_count(ver):
                continue  # a version the first-generation API cannot number is not listed
            vs = entry.version_status[int(ver)]
            vs.ready_state = _STATES.get(state, v1.MODEL_UNKNOWN)
            if reason or note:
                vs.ready_state_reason.message = "; ".join(x for x in (reason, note) if x)
    return status


def status_text(message: Any, *, one_line: bool = False) -> str:
    """Text format as the first-generation server wrote it (protobuf's; one line for NV-Status).
    Non-ASCII is escaped, so the text is a valid HTTP header value."""
    text = text_format.MessageToString(message, as_one_line=one_line)
    if text.isascii():
        return text
    # protobuf prints UTF-8 as is; a header value must be ASCII. Non-ASCII appears only inside
    # string literals, where octal escapes of its UTF-8 bytes read back as the same text.
    return "".join(c if c.isascii() else "".join(f"\\{b:03o}" for b in c.encode("utf-8")) for c in text)


# ------------------------------------------------------------------ errors
_BY_GRPC = {"INVALID_ARGUMENT": v1.INVALID_ARG, "OUT_OF_RANGE": v1.INVALID_ARG, "FAILED_PRECONDITION": v1.INVALID_ARG,
            "NOT_FOUND": v1.NOT_FOUND, "UNAVAILABLE": v1.UNAVAILABLE, "DEADLINE_EXCEEDED": v1.UNAVAILABLE,
            "RESOURCE_EXHAUSTED": v1.UNAVAILABLE, "UNIMPLEMENTED": v1.UNSUPPORTED,
            "ALREADY_EXISTS": v1.ALREADY_EXISTS, "INTERNAL": v1.INTERNAL, "UNKNOWN": v1.UNKNOWN}


def request_status(err: GatewayError | None, request_id: int, server_id: str) -> v1.RequestStatus:
    """The RequestStatus of an answer: SUCCESS, or the v1 code of a gateway error (the v1
    codes are coarser: a timeout or an overload is UNAVAILABLE, as "retry later")."""
    if err is None:
        return v1.RequestStatus(code=v1.SUCCESS, server_id=server_id, request_id=request_id)
    if isinstance(err, Unsupported):
        code = v1.UNSUPPORTED
    elif isinstance(err, (InvalidRequest, PayloadTooLarge)):
        code = v1.INVALID_ARG
    elif isinstance(err, ModelNotFound):
        code = v1.NOT_FOUND
    elif isinstance(err, (NoEndpointAvailable, UpstreamTimeout)):
        code = v1.UNAVAILABLE
    else:
        code = _BY_GRPC.get(err.grpc_code, v1.INTERNAL)
    return v1.RequestStatus(code=code, msg=err.message, server_id=server_id, request_id=request_id)
