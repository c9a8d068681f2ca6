"""JSON inference bodies and the HTTP binary-data extension ↔ the neutral model.

Request and response bodies are the spec's "Inference Request/Response JSON
Object" (open-inference-protocol.txt, HTTP/REST "Inference"), optionally
followed by a binary section: the body starts with ``Inference-Header-Content-Length``
bytes of JSON, then the raw bytes of every tensor that carries
``parameters.binary_data_size``, in tensor order (ovms-kserve-rest-api-binary-extension.txt;
Triton's http_server.cc, which tritonclient matches). Binary slices stay
memoryviews of the body; JSON ``data`` is converted by numpy in one call.

The caller owns the HTTP headers. ``header_length`` in and out is the
``Inference-Header-Content-Length`` value: ``None`` means "the whole body is
JSON" (send ``Content-Type: application/json``); an int means "send
``application/octet-stream`` and this header", as Triton does. The body is
read by that length, never by content type: OVMS answers ``application/json``
with a binary section.

``binary_data`` (requested outputs) and ``binary_data_output`` (request) stay in
the decoded parameters: the front end passes the decoded request to
:func:`binary_policy` to choose the response form. :func:`encode_request` adds
``binary_data: true`` where they are absent (the gateway wants raw bytes back),
and ``grpc.encode_request`` drops them. Only ``binary_data_size`` is stripped on
decode, since it describes this one body.

Decoders validate everything once (datatypes, shapes, sizes; errors name the
tensor); encoders trust their tensors, which came from a decoder or ``from_numpy``.
"""
from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from ..errors import InvalidRequest, Unsupported
from ..model import InferRequest, InferResponse, Params, RequestedOutput, Tensor
from .datatypes import (
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
from .jsondup import check_unique, members
from .jsonnum import bf16_to_float64, float64_to_bf16, float64_to_fp16, float_json, params_json

__all__ = ["binary_policy", "decode_request", "decode_response", "encode_request", "encode_response"]

_OPT = orjson.OPT_SERIALIZE_NUMPY
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \uD800-\uDFFF, cheap to rule out
_NO_OVERRIDES: Mapping[str, bool] = {}


# --------------------------------------------------------------------- helpers
def _load_header(view: memoryview, header_length: int | None, what: str) -> tuple[dict[str, Any], int]:
    total = len(view)
    if header_length is None:
        hl = total
    else:
        # Triton: "inference header size should be in range (0, content length)".
        if isinstance(header_length, bool) or not isinstance(header_length, int) or not 0 <= header_length <= total:
            raise InvalidRequest(
                f"Inference-Header-Content-Length {header_length!r} is outside the body of {total} bytes"
            )
        hl = header_length
    try:
        doc = orjson.loads(view[:hl])
    except orjson.JSONDecodeError as exc:
        doc = _with_nonfinite(view[:hl])
        if doc is None:
            raise InvalidRequest(f"malformed JSON {what}: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the JSON {what} must be an object")
    # A repeated member name is refused, not read as the last of its values (codec/jsondup.py).
    check_unique(view[:hl], members(doc), what)
    return doc, hl


def _with_nonfinite(text: memoryview) -> Any:
    """A body orjson refused because it holds NaN / Infinity / -Infinity (Triton writes
    them so; codec/jsonnum.py): read by the standard library's parser, which takes those
    tokens. None when it is malformed for another reason."""
    raw = bytes(text)
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        doc = json.loads(raw)
        if _SURROGATE_ESCAPE.search(raw):
            # The standard library takes a lone surrogate escape ("\ud800"), which is no
            # character: orjson refuses it, and so must this (UnicodeEncodeError is a ValueError).
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        return doc
    except (ValueError, RecursionError):
        return None


def _params(value: Any, where: str) -> Params:
    # Spec "Parameters": $parameter = $string : $string | $number | $boolean.
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: 'parameters' must be a JSON object")
    for key, v in value.items():
        if not isinstance(v, (str, int, float)):
            raise InvalidRequest(f"{where}: parameter '{key}' must be a string, number or boolean")
    return value


def _string(doc: dict[str, Any], key: str, where: str) -> str:
    # null is "absent": KServe's server writes "model_version": null (and may write "id": null)
    # for a model with no version; the gRPC message has no null, only the empty string.
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}: '{key}' must be a string")
    return value


def _tensor_head(obj: Any, index: int, kind: str) -> tuple[str, DatatypeInfo, tuple[int, ...], int, Params]:
    """name, datatype, shape, element count and parameters of one input/output object."""
    if not isinstance(obj, dict):
        raise InvalidRequest(f"{kind} {index} must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str):
        raise InvalidRequest(f"{kind} {index}: 'name' must be a string")
    info = datatype_info(obj.get("datatype"), name)
    shape = obj.get("shape")
    if not isinstance(shape, list):
        raise InvalidRequest(f"tensor '{name}': 'shape' must be an array of integers")
    count = element_count(shape, name)
    params = _params(obj.get("parameters"), f"tensor '{name}'")
    if "shared_memory_region" in params:
        raise Unsupported(f"tensor '{name}': shared-memory tensors cannot cross the gateway")
    return name, info, tuple(shape), count, params


def _binary_size(params: Params, name: str) -> int | None:
    size = params.get("binary_data_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise InvalidRequest(f"tensor '{name}': binary_data_size must be a non-negative integer")
    return size


def _without(params: Params, key: str) -> Params:
    return {k: v for k, v in params.items() if k != key} if key in params else params


def _check_nesting(name: str, arr: np.ndarray, shape: tuple[int, ...], count: int) -> None:
    # Spec "Tensor Data": data is either nested exactly as the shape or flat.
    if arr.shape != shape and not (arr.ndim == 1 and arr.shape[0] == count):
        raise InvalidRequest(
            f"tensor '{name}': 'data' is nested as {list(arr.shape)} ({arr.size} elements) "
            f"but the shape is {list(shape)} ({count} elements)"
        )


def _json_to_raw(name: str, info: DatatypeInfo, shape: tuple[int, ...], count: int, data: Any,
                 bool_tokens: bool = True) -> memoryview:
    """JSON ``data`` → raw little-endian bytes, one numpy conversion (no per-element loop but BYTES).
    ``bool_tokens``: whether the JSON text has a ``true`` or ``false`` anywhere (False: ``data``
    cannot hold one, and the check for them is skipped)."""
    if not isinstance(data, list):
        raise InvalidRequest(f"tensor '{name}': 'data' must be a JSON array")
    try:
        arr = np.asarray(data, dtype=object if info.itemsize is None else None)
    except (ValueError, TypeError) as exc:  # ragged nesting
        raise InvalidRequest(f"tensor '{name}': 'data' nesting is ragged; it must match shape {list(shape)}") from exc
    _check_nesting(name, arr, shape, count)
    if info.itemsize is None:
        try:
            return memoryview(serialize_bytes_elements([s.encode("utf-8") for s in arr.reshape(-1).tolist()], name))
        except AttributeError as exc:
            raise InvalidRequest(f"tensor '{name}': BYTES 'data' elements must be strings") from exc
    if arr.size:
        arr = _typed_values(name, info, arr, data, bool_tokens)
    if info.name in ("FP16", "BF16"):
        values = arr.astype(np.float64).reshape(-1)
        half = float64_to_fp16(name, values) if info.name == "FP16" else float64_to_bf16(name, values)
        return tensor_view(half)
    with np.errstate(all="ignore"):  # FP64 → FP32 overflow becomes inf, as Triton's C++ cast does
        return tensor_view(arr.astype(info.dtype, copy=False))


def _typed_values(name: str, info: DatatypeInfo, arr: np.ndarray, data: list[Any],
                  bool_tokens: bool = True) -> np.ndarray:
    """Check numpy's reading of JSON numbers against the datatype, as strictly as Triton.

    BOOL takes only true/false; integer types only integers in range (no 1.0,
    no true); float types any number, and null as NaN — and no true/false either, also not
    beside numbers, where numpy reads them as 1 and 0 (Triton's reader refuses a JSON bool
    for a number: http_server.cc reads each element with AsDouble / AsInt / AsUInt).
    """
    target, kind = info.dtype, arr.dtype.kind
    if info.name in ("FP16", "BF16"):
        target = np.dtype(np.float64)  # read as numbers here, rounded by the caller
    ok = False
    if target.kind == "b":
        ok = kind == "b"
    elif target.kind in "iu":
        bounds = np.iinfo(target)
        if kind in "fO":
            # numpy promotes ints on both sides of 2**63 to float64 (or object); redo
            # such data exactly from the Python ints (C-level map/min/max, no Python loop).
            flat = np.asarray(data, dtype=object).reshape(-1).tolist()
            ok = set(map(type, flat)) <= {int}
            lo, hi = (min(flat), max(flat)) if ok else (0, 0)
        else:
            ok = kind in "iu"
            lo, hi = (int(arr.min()), int(arr.max())) if ok and not np.can_cast(arr.dtype, target) else (0, 0)
        if lo < bounds.min or hi > bounds.max:
            raise InvalidRequest(f"tensor '{name}': 'data' has values out of range for {info.name}")
        if kind in "fO" and ok:
            arr = np.array(flat, dtype=target)
    elif kind == "O":  # null elements: our encoder (orjson) writes NaN/Inf as null
        try:
            arr, ok = np.asarray(data, dtype=target), True
        except (ValueError, TypeError):
            pass
    else:
        ok = kind in "iuf"
    if not ok:
        raise InvalidRequest(f"tensor '{name}': 'data' values are not valid {info.name} values")
    if target.kind != "b" and bool_tokens and _holds_bool(data):
        raise InvalidRequest(f"tensor '{name}': 'data' holds true or false, which are not {info.name} values")
    return arr


def _holds_bool(data: list[Any]) -> bool:
    """Whether a JSON array, nested as it may be, holds a true or false: numpy promotes them to
    numbers beside numbers ([1.5, true] is float64 [1.5, 1.0]). C-level passes only (an object
    array's flattening, map, set), and run only when the text has such a token at all."""
    flat = np.asarray(data, dtype=object).reshape(-1).tolist()
    return bool in set(map(type, flat))


_E, _U, _R, _T, _S, _L, _A = b"eurtsla"


def _bool_tokens(header: memoryview) -> bool:
    """Whether JSON text has a ``true`` or ``false`` anywhere (strings included: then
    :func:`_holds_bool` decides)."""
    if len(header) <= 4096:
        text = bytes(header)
        return b"true" in text or b"false" in text
    # Large text: each "e" with what precedes it, vectorised — 0.15 ms per MiB where two
    # substring searches take 1.1 ms (most of a large body is digits, and numbers hold no "e"
    # but an exponent's).
    a = np.frombuffer(header, dtype=np.uint8)
    at = np.flatnonzero(a[3:] == _E) + 3
    if not at.size:
        return False
    p1, p2, p3 = a[at - 1], a[at - 2], a[at - 3]
    return bool(np.any(((p1 == _U) & (p2 == _R) & (p3 == _T)) | ((p1 == _S) & (p2 == _L) & (p3 == _A))))


def _json_data(t: Tensor, base64_bytes: bool = False) -> Any:
    """A tensor's flat JSON ``data`` (Triton writes it flat): an ndarray orjson serialises,
    or strings. BYTES that are not UTF-8 have no JSON form; with ``base64_bytes`` (a
    backend that reads MLServer's ``base64`` content type) they go base64 — see
    _encode_tensors — and the element list returned is bytes, encoded there."""
    info = datatype_info(t.datatype, t.name)
    if info.itemsize is None:
        elems = bytes_values(t.data, t.name)
        if len(elems) != element_count(t.shape, t.name):
            raise InvalidRequest(f"tensor '{t.name}': {len(elems)} BYTES elements do not fit shape {list(t.shape)}")
        try:
            return [e.decode("utf-8") for e in elems]
        except UnicodeDecodeError as exc:
            if base64_bytes:
                return elems
            raise InvalidRequest(
                f"tensor '{t.name}': BYTES data is not valid UTF-8 and cannot be sent as JSON; request it binary"
                " (or, to an MLServer pool, set the backend's non_utf8_bytes: base64)"
            ) from exc
    arr = to_numpy(t, flat=True)
    if info.name == "BOOL":
        return arr.view(np.uint8) != 0  # any non-zero byte is true (Triton: bool_base[e] != 0)
    if info.name in ("FP16", "FP32", "FP64"):
        # Triton writes FP32 widened to double (AppendDouble); readers parse a double
        # and narrow it, so the exact double round-trips every float bit for bit,
        # where a shortest-float32 string could be double-rounded. FP16 widens the same
        # way. NaN and ±Inf are written as Triton writes them (codec/jsonnum.py).
        return float_json(arr.astype(np.float64))
    if info.name == "BF16":
        return float_json(bf16_to_float64(arr))
    if not arr.dtype.isnative:  # orjson serialises native byte order only
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def _decode_tensors(
    view: memoryview, hl: int, items: list[Any], kind: str, infer_open: bool
) -> list[Tensor]:
    """Decode inputs or outputs: JSON ``data`` or a slice of the binary section, in order.

    ``infer_open`` (requests with a binary section) follows OVMS for a tensor with
    neither ``data`` nor ``binary_data_size``: a fixed-size one takes
    shape × itemsize bytes, and a single such BYTES tensor takes what is left.
    """
    heads: list[tuple[Any, ...]] = []
    claimed = 0
    open_index: int | None = None
    for i, obj in enumerate(items):
        name, info, shape, count, params = _tensor_head(obj, i, kind)
        size = _binary_size(params, name)
        has_data = "data" in obj
        if size is not None:
            if has_data:
                raise InvalidRequest(f"tensor '{name}': set either 'data' or binary_data_size, not both")
            params = _without(params, "binary_data_size")
        elif not has_data:
            if not infer_open:
                raise InvalidRequest(f"tensor '{name}': neither 'data' nor parameters.binary_data_size is set")
            if info.itemsize is not None:
                size = count * info.itemsize
            elif open_index is not None:
                raise InvalidRequest(
                    f"tensor '{name}': BYTES inputs '{heads[open_index][0]}' and '{name}' both lack "
                    "binary_data_size; their split of the binary data is ambiguous"
                )
            else:
                open_index, size = i, -1
        if size is not None and size >= 0:
            claimed += size
        heads.append((name, info, shape, count, params, size, obj.get("data")))
    end = len(view)
    if open_index is not None:
        size = max(end - hl - claimed, 0)
        heads[open_index] = heads[open_index][:5] + (size, None)
    pos = hl
    tensors = []
    last = None
    bool_tokens: bool | None = None  # (looked for once, and only for a numeric tensor's JSON data)
    for name, info, shape, count, params, size, data in heads:
        if size is None:
            if bool_tokens is None and info.itemsize is not None and info.name != "BOOL":
                bool_tokens = _bool_tokens(view[:hl])
            tensors.append(Tensor(name, info.name, shape,
                                  _json_to_raw(name, info, shape, count, data, bool_tokens is not False), params))
            continue
        if pos + size > end:
            raise InvalidRequest(
                f"tensor '{name}': binary_data_size {size} runs past the end of the body ({end - pos} bytes left)"
            )
        t = Tensor(name, info.name, shape, view[pos : pos + size], params)
        validate_tensor(t)
        tensors.append(t)
        pos += size
        last = name
    if pos != end:
        where = f"after the last binary tensor '{last}'" if last else "but no tensor has binary_data_size"
        raise InvalidRequest(f"the body has {end - pos} unclaimed bytes after the JSON header {where}")
    return tensors


def _array(doc: dict[str, Any], key: str, where: str, required: bool) -> list[Any]:
    value = doc.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: '{key}' must be a JSON array")
    return value


def _check_bool(params: Params, key: str, where: str) -> None:
    if key in params and not isinstance(params[key], bool):
        raise InvalidRequest(f"{where}: parameter '{key}' must be a boolean")


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


# ------------------------------------------------------------------ public API
def decode_request(
    body: bytes | bytearray | memoryview, header_length: int | None, model_name: str, model_version: str = ""
) -> InferRequest:
    """Decode an inference request body; model and version come from the URL."""
    view = byte_view(body)
    doc, hl = _load_header(view, header_length, "inference request")
    params = _params(doc.get("parameters"), "request")
    _check_bool(params, "binary_data_output", "request")
    inputs = _decode_tensors(view, hl, _array(doc, "inputs", "request", True), "input", header_length is not None)
    seen: set[str] = set()
    for t in inputs:
        if t.name in seen:
            raise InvalidRequest(f"tensor '{t.name}': input given more than once")
        seen.add(t.name)
    outputs = []
    for i, obj in enumerate(_array(doc, "outputs", "request", False)):
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise InvalidRequest(f"output {i}: must be an object with a string 'name'")
        where = f"output '{obj['name']}'"
        oparams = _params(obj.get("parameters"), where)
        if "shared_memory_region" in oparams:
            raise Unsupported(f"{where}: shared-memory outputs cannot cross the gateway")
        _check_bool(oparams, "binary_data", where)
        outputs.append(RequestedOutput(obj["name"], oparams))
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=_string(doc, "id", "request"),
        parameters=params,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )


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


def decode_response(body: bytes | bytearray | memoryview, header_length: int | None) -> InferResponse:
    """Decode a backend's inference response body (Triton, OVMS, MLServer)."""
    view = byte_view(body)
    doc, hl = _load_header(view, header_length, "inference response")
    version = doc.get("model_version")
    if version is None:
        version = ""  # KServe: "model_version": null for a model without versions
    elif isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    elif not isinstance(version, str):
        raise InvalidRequest("response: 'model_version' must be a string")
    outputs = _decode_tensors(view, hl, _array(doc, "outputs", "response", False), "output", False)
    return InferResponse(
        model_name=_string(doc, "model_name", "response"),
        model_version=version,
        id=_string(doc, "id", "response"),
        parameters=_params(doc.get("parameters"), "response"),
        outputs=tuple(outputs),
    )


def binary_policy(req: InferRequest) -> tuple[bool, dict[str, bool]]:
    """(request-level ``binary_data_output``, per-output ``binary_data``) of a decoded request.

    An output listed in the overrides uses its own value; every other output uses
    the default (Triton: ``binary_data_output`` sets the default output kind, and
    an output's ``binary_data`` wins over it).
    """
    default = req.parameters.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InvalidRequest("request: parameter 'binary_data_output' must be a boolean")
    overrides: dict[str, bool] = {}
    for o in req.outputs:
        value = o.parameters.get("binary_data")
        if value is not None:
            if not isinstance(value, bool):
                raise InvalidRequest(f"output '{o.name}': parameter 'binary_data' must be a boolean")
            overrides[o.name] = value
    return default, overrides


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
