"""A first-generation request as V2 (codec/v1.py): the ``NV-InferRequest`` header text, batch
rules, byte sizes, sequence flags, priority and timeout → a serialized ModelInferRequest."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import text_format

from .._pb import legacy_v1_pb2 as v1
from ..errors import SHARED_MEMORY_REFUSAL, InvalidRequest, Unsupported
from ..model import InferRequest, Params, RequestedOutput, Tensor
from .datatypes import INT64_MAX, byte_view, element_count, expected_nbytes
from .grpc import encode_request
from .v1model import ModelInfo

__all__ = ["InputPlan", "Plan", "build_request", "parse_header_text", "plan_inputs", "split_body", "v1_version"]

_START = v1.InferRequestHeader.FLAG_SEQUENCE_START
_END = v1.InferRequestHeader.FLAG_SEQUENCE_END


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
