"""The first-generation inference server API ("v1") translated to V2 and back. No I/O.

Spec: ../shared/spec/legacy-v1-inference-server-api.txt ("the API text") and
legacy-v1-infer-request-header.proto.txt ("the header text"); messages in
proto/legacy_v1.proto. The front ends (frontend/v1_http.py, frontend/v1_grpc.py) fetch
what is needed from the data plane and call these functions:

- ``parse_header_text``: the ``NV-InferRequest`` header (text format) → InferRequestHeader.
- ``model_info``: a model's tensors and batching, from Triton's model configuration (V2
  ``ModelConfig``) or, for a backend without one, from the V2 model metadata.
- ``plan_inputs`` / ``split_body`` / ``build_request``: the v1 request as a V2
  ModelInferRequest (batch rules, byte sizes, sequence flags, priority, timeout).
- ``finish``: the V2 answer as an InferResponseHeader plus raw outputs (top-K classes
  computed here).
- ``server_status``, ``request_status``: status answers and the RequestStatus of an error.

Never a changed value: what cannot be expressed in the other form (a BF16 tensor, a
classification value a float cannot hold, a version that is not a number) is refused by name.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from .._pb import legacy_v1_pb2 as v1
from .._pb import model_config_pb2 as mc
from .._pb import triton_extensions_pb2 as tx
from ..errors import (
    SHARED_MEMORY_REFUSAL,
    BadUpstreamResponse,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoEndpointAvailable,
    PayloadTooLarge,
    Unsupported,
    UpstreamTimeout,
)
from ..model import InferRequest, Params, RequestedOutput, Tensor
from .content import is_count
from .datatypes import DATATYPES, INT64_MAX, byte_view, element_count, expected_nbytes
from .grpc import decode_response, encode_request

__all__ = ["InputPlan", "ModelInfo", "Plan", "TensorInfo", "build_request", "finish", "model_info", "parse_header_text",
           "plan_inputs", "request_status", "server_status", "split_body", "status_text", "v1_version"]

# V2 datatype ↔ v1 DataType (proto/legacy_v1.proto). BF16 came after the first generation.
_TO_V1 = {name: getattr(v1, f"TYPE_{'STRING' if name == 'BYTES' else name}") for name in DATATYPES if name != "BF16"}
# Triton's model configuration spells datatypes as its own DataType enum (TYPE_FP32, TYPE_STRING…).
_FROM_TRITON = {"TYPE_STRING": "BYTES", **{f"TYPE_{n}": n for n in DATATYPES if n != "BYTES"}}

_START = v1.InferRequestHeader.FLAG_SEQUENCE_START
_END = v1.InferRequestHeader.FLAG_SEQUENCE_END


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str  # V2 spelling; "" when unknown
    dims: tuple[int, ...]  # without the batch dimension of a batching model; -1: any
    label_filename: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the bridge must know of a model: batching (Triton's ``max_batch_size``: > 0 means
    the first dimension is the batch) and its tensors. ``from_config`` is False when only the
    V2 metadata was available (then the model is taken as not batching)."""

    name: str
    platform: str
    max_batch_size: int
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    from_config: bool = True


def model_info(config: bytes | None, metadata: Mapping[str, Any] | None, model: str) -> ModelInfo:
    """From a serialized Triton ModelConfigResponse when there is one, else from V2 metadata."""
    if config is not None:
        try:
            c = tx.ModelConfigResponse.FromString(config).config
        except DecodeError as exc:
            raise BadUpstreamResponse(f"model '{model}': unreadable model configuration: {exc}") from exc

        def tensor(t: Any, label: str = "") -> TensorInfo:
            return TensorInfo(t.name, _FROM_TRITON.get(mc.DataType.Name(t.data_type), ""), tuple(t.dims), label)

        return ModelInfo(c.name or model, c.platform or c.backend, c.max_batch_size,
                         {t.name: tensor(t) for t in c.input},
                         {t.name: tensor(t, t.label_filename) for t in c.output})
    meta = metadata or {}

    def from_meta(items: Any) -> dict[str, TensorInfo]:
        out = {}
        for t in items or ():
            name = str(t.get("name", ""))
            out[name] = TensorInfo(name, str(t.get("datatype", "")), tuple(int(d) for d in t.get("shape", ())))
        return out

    return ModelInfo(str(meta.get("name") or model), str(meta.get("platform") or ""), 0,
                     from_meta(meta.get("inputs")), from_meta(meta.get("outputs")), from_config=False)


# ------------------------------------------------------------------ the request header
# The API text's own example spells an input's size ``byte_size`` and gives outputs a
# ``byte_size``: the earliest header (where Input.byte_size was one batch entry's size and
# Output.byte_size a hint), before the header text's ``batch_byte_size``. Both spellings are
# read; the old one only in text form (its field numbers were reused since).
_LEGACY = re.compile(r"(?<![A-Za-z0-9_])byte_size(?![A-Za-z0-9_])")


def parse_header_text(text: str) -> tuple[v1.InferRequestHeader, dict[int, int]]:
    """The header and, per input index, a legacy per-entry ``byte_size`` found in it."""
    legacy: dict[int, int] = {}
    if _LEGACY.search(text):
        text, legacy = _strip_legacy(text)
    header = v1.InferRequestHeader()
    try:
        text_format.Parse(text, header)
    except text_format.ParseError as exc:
        raise InvalidRequest(f"malformed NV-InferRequest header: {exc}") from exc
    return header, legacy


def _strip_legacy(text: str) -> tuple[str, dict[int, int]]:
    """Remove ``byte_size: N`` from top-level ``input``/``output`` blocks, keeping the
    inputs' values. Token by token, so a string literal holding the words is left alone."""
    tok = text_format.Tokenizer(text.splitlines())
    out: list[str] = []
    stack: list[str] = []
    last = ""
    counts = {"input": -1, "output": -1}
    legacy: dict[int, int] = {}
    try:
        while not tok.AtEnd():
            token = tok.token
            if token in ("{", "<"):
                stack.append(last)
                if len(stack) == 1 and last in counts:
                    counts[last] += 1
            elif token in ("}", ">") and stack:
                stack.pop()
            elif token == "byte_size" and len(stack) == 1 and stack[0] in counts:
                tok.NextToken()
                tok.TryConsume(":")
                value = tok.ConsumeInteger()
                if stack[0] == "input":
                    legacy[counts["input"]] = value
                continue
            out.append(token)
            last = token
            tok.NextToken()
    except text_format.ParseError as exc:
        raise InvalidRequest(f"malformed NV-InferRequest header: {exc}") from exc
    return " ".join(out), legacy


# ------------------------------------------------------------------ request → V2
@dataclass(frozen=True, slots=True)
class InputPlan:
    name: str
    datatype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What the answer needs from the request: batching, the outputs in header order
    (with their class count, 0 for raw) and the header's id."""

    batching: bool
    batch_size: int
    outputs: tuple[tuple[str, int], ...]
    request_id: int
    version: int


def v1_version(version: int) -> str:
    """The V2 version string of a v1 version number: -1 (and 0, proto3's unset) the latest."""
    if version < -1:
        raise InvalidRequest(f"model version {version} is not a version number (-1: the latest)")
    return "" if version <= 0 else str(version)


def plan_inputs(header: v1.InferRequestHeader, info: ModelInfo, legacy: Mapping[int, int] | None = None
                ) -> tuple[bool, list[InputPlan]]:
    """Each input's datatype, full V2 shape and byte size (header text "InferRequestHeader"):
    dims exclude the batch dimension and ``batch_size`` prepends it for a batching model;
    a model that does not batch takes ``batch_size`` 1 and dims as its whole shape."""
    batching = info.max_batch_size > 0
    batch = header.batch_size
    if batch < 1:
        raise InvalidRequest("batch_size must be >= 1 (header text: InferRequestHeader.batch_size)")
    if not batching and batch != 1:
        raise InvalidRequest(f"model '{info.name}' does not support batching: batch_size must be 1, got {batch}")
    if batching and batch > info.max_batch_size:
        raise InvalidRequest(f"batch_size {batch} exceeds the maximum batch size {info.max_batch_size} of model "
                             f"'{info.name}'")
    plans: list[InputPlan] = []
    seen: set[str] = set()
    for i, inp in enumerate(header.input):
        name = inp.name
        if name in seen:
            raise InvalidRequest(f"input '{name}' is listed twice in the request header")
        seen.add(name)
        if inp.HasField("shared_memory"):
            raise Unsupported(f"input '{name}': {SHARED_MEMORY_REFUSAL}")
        model_in = info.inputs.get(name)
        if model_in is None or not model_in.datatype:
            raise InvalidRequest(f"unexpected inference input '{name}' for model '{info.name}'")
        dims = tuple(inp.dims) if inp.dims else model_in.dims
        if not inp.dims and any(d < 0 for d in dims):
            raise InvalidRequest(f"input '{name}': dims are required, the model's shape {list(model_in.dims)} "
                                 "has wildcard dimensions (header text: Input.dims)")
        if inp.dims and info.from_config and (
                len(dims) != len(model_in.dims) or any(m >= 0 and m != d for m, d in zip(model_in.dims, dims))):
            raise InvalidRequest(f"input '{name}': dims {list(dims)} do not match the model's {list(model_in.dims)}"
                                 + (" (dims exclude the batch dimension)" if batching else ""))
        shape = (batch, *dims) if batching else dims
        count = element_count(shape, name)
        fixed = expected_nbytes(model_in.datatype, shape, name)
        given = inp.batch_byte_size or None
        if legacy and i in legacy:
            per_entry = legacy[i] * batch
            if given is not None and given != per_entry:
                raise InvalidRequest(f"input '{name}': byte_size {legacy[i]} × batch_size {batch} disagrees with "
                                     f"batch_byte_size {given}")
            given = per_entry
        if fixed is None:  # BYTES: only the sender knows its size
            if given is None and count:
                raise InvalidRequest(f"input '{name}': batch_byte_size is required for a {model_in.datatype} "
                                     "input (header text: Input.batch_byte_size)")
            nbytes = given or 0
        else:
            if given is not None and given != fixed:
                raise InvalidRequest(f"input '{name}': batch_byte_size {given} but shape {list(shape)} of "
                                     f"{model_in.datatype} is {fixed} bytes")
            nbytes = fixed
        plans.append(InputPlan(name, model_in.datatype, shape, nbytes))
    return batching, plans


def split_body(body: bytes | bytearray | memoryview, plans: Sequence[InputPlan]) -> list[memoryview]:
    """The HTTP body's raw inputs, in header order (API text "Inference"): slices, no copy."""
    view = byte_view(body)
    need = sum(p.nbytes for p in plans)
    if len(view) != need:
        which = "shorter" if len(view) < need else "longer"
        sizes = ", ".join(f"'{p.name}' {p.nbytes}" for p in plans) or "no inputs"
        raise InvalidRequest(f"request body is {which} than the inputs the header declares: {len(view)} bytes, "
                             f"expected {need} ({sizes})")
    out, pos = [], 0
    for p in plans:
        out.append(view[pos : pos + p.nbytes])
        pos += p.nbytes
    return out


def build_request(model: str, version: str, header: v1.InferRequestHeader, info: ModelInfo, batching: bool,
                  plans: Sequence[InputPlan], raws: Sequence[memoryview | bytes]) -> tuple[bytes, Plan, str | None]:
    """The serialized V2 ModelInferRequest, what ``finish`` needs, and the sequence affinity.

    Correlation id and flags become Triton's sequence parameters (``sequence_id``,
    ``sequence_start``, ``sequence_end``), priority and timeout its ``priority`` and
    ``timeout`` (microseconds) — header text ``correlation_id``, ``flags``, ``priority``,
    ``timeout_microseconds``."""
    if len(raws) != len(plans):
        raise InvalidRequest(f"{len(raws)} raw inputs for {len(plans)} inputs in the request header")
    tensors = []
    for p, raw in zip(plans, raws):
        data = byte_view(raw)
        if len(data) != p.nbytes:
            raise InvalidRequest(f"input '{p.name}': {len(data)} bytes of data, the header declares {p.nbytes}")
        tensors.append(Tensor(p.name, p.datatype, p.shape, data))
    if header.flags & ~(_START | _END):
        raise InvalidRequest(f"flags {header.flags} has bits other than FLAG_SEQUENCE_START (1) and "
                             "FLAG_SEQUENCE_END (2)")
    params: Params = {}
    if header.correlation_id:
        params["sequence_id"] = header.correlation_id
    if header.flags & _START:
        params["sequence_start"] = True
    if header.flags & _END:
        params["sequence_end"] = True
    if header.priority:
        params["priority"] = header.priority
    if header.timeout_microseconds:
        if header.timeout_microseconds > INT64_MAX:
            raise InvalidRequest(f"timeout_microseconds {header.timeout_microseconds} does not fit V2's int64 timeout")
        params["timeout"] = header.timeout_microseconds
    outputs: list[tuple[str, int]] = []
    for o in header.output:
        if o.HasField("shared_memory"):
            raise Unsupported(f"output '{o.name}': {SHARED_MEMORY_REFUSAL}")
        if any(o.name == n for n, _ in outputs):
            raise InvalidRequest(f"output '{o.name}' is requested twice in the request header")
        if info.from_config and o.name not in info.outputs:
            raise InvalidRequest(f"unexpected inference output '{o.name}' for model '{info.name}'")
        if o.HasField("cls") and o.cls.count < 1:
            raise InvalidRequest(f"output '{o.name}': cls.count must be >= 1")
        outputs.append((o.name, o.cls.count if o.HasField("cls") else 0))
    # V2 answers every output when none is named; v1 answers only those requested.
    request = InferRequest(model, version, str(header.id) if header.id else "", params, tuple(tensors),
                           tuple(RequestedOutput(n) for n, _ in outputs))
    affinity = str(header.correlation_id) if header.correlation_id else None
    plan = Plan(batching, header.batch_size, tuple(outputs), header.id, int(version) if version else 0)
    return encode_request(request), plan, affinity


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
