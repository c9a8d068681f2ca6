"""HTTP inference bodies → the neutral model: the JSON header, its tensors and the binary
section they claim (the framing rules are in codec/http.py's docstring).

Decoders validate everything once (datatypes, shapes, sizes; errors name the tensor).
"""
from __future__ import annotations

import json
import re
from typing import Any

import orjson

from ..errors import GatewayError, InvalidRequest, Unsupported
from ..model import InferRequest, InferResponse, Params, RequestedOutput, Tensor
from .datatypes import DatatypeInfo, byte_view, datatype_info, element_count, validate_tensor
from .jsondata import _bool_tokens, _json_to_raw
from .jsondup import check_unique, members
from .jsonfast import DataSpan, Fallback, available, load, read_all, tensor_bytes

__all__ = ["binary_policy", "decode_request", "decode_response"]

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \uD800-\uDFFF, cheap to rule out


# --------------------------------------------------------------------- helpers
def _load_header(view: memoryview, header_length: int | None, what: str,
                 fast: bool = False) -> tuple[dict[str, Any], int, list[DataSpan]]:
    """(the JSON header, its length, its ``data`` arrays left in the text). ``fast``: read by
    codec/jsonfast.py (raises Fallback where that reading does not decide); else no spans."""
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
    if fast:
        doc, skeleton, spans = load(view[:hl])
        check_unique(skeleton, members(doc), what)
        return doc, hl, spans
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
    return doc, hl, []


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
            if type(data) is DataSpan:
                raw = tensor_bytes(info, shape, count, data)
                if raw is not None:
                    tensors.append(Tensor(name, info.name, shape, raw, params))
                    continue
                data = data.value()
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


# ------------------------------------------------------------------ public API
def decode_request(
    body: bytes | bytearray | memoryview, header_length: int | None, model_name: str, model_version: str = ""
) -> InferRequest:
    """Decode an inference request body; model and version come from the URL."""
    view = byte_view(body)
    if available():  # (codec/jsonfast.py: measured faster at every size, 177 bytes included)
        try:
            return _request(view, header_length, model_name, model_version, True)
        except (Fallback, GatewayError):  # (a refusal is worded by the plain reading, below)
            pass
    return _request(view, header_length, model_name, model_version, False)


def _request(view: memoryview, header_length: int | None, model_name: str, model_version: str,
             fast: bool) -> InferRequest:
    doc, hl, spans = _load_header(view, header_length, "inference request", fast)
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
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=_string(doc, "id", "request"),
        parameters=params,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )
    read_all(spans)
    return request


def decode_response(body: bytes | bytearray | memoryview, header_length: int | None) -> InferResponse:
    """Decode a backend's inference response body (Triton, OVMS, MLServer)."""
    view = byte_view(body)
    if available():
        try:
            return _response(view, header_length, True)
        except (Fallback, GatewayError):  # (a refusal is worded by the plain reading, below)
            pass
    return _response(view, header_length, False)


def _response(view: memoryview, header_length: int | None, fast: bool) -> InferResponse:
    doc, hl, spans = _load_header(view, header_length, "inference response", fast)
    version = doc.get("model_version")
    if version is None:
        version = ""  # KServe: "model_version": null for a model without versions
    elif isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    elif not isinstance(version, str):
        raise InvalidRequest("response: 'model_version' must be a string")
    outputs = _decode_tensors(view, hl, _array(doc, "outputs", "response", False), "output", False)
    response = InferResponse(
        model_name=_string(doc, "model_name", "response"),
        model_version=version,
        id=_string(doc, "id", "response"),
        parameters=_params(doc.get("parameters"), "response"),
        outputs=tuple(outputs),
    )
    read_all(spans)
    return response


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
