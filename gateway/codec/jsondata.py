"""A tensor's JSON ``data`` ↔ its raw little-endian bytes, for the HTTP codec (codec/http.py).

Reading checks every value against the datatype as strictly as Triton, in one numpy
conversion; writing gives the flat form Triton writes (floats widened to double).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidRequest
from ..model import Tensor
from .datatypes import (
    DatatypeInfo,
    bytes_values,
    datatype_info,
    element_count,
    serialize_bytes_elements,
    tensor_view,
    to_numpy,
)
from .jsonnum import bf16_to_float64, float64_to_bf16, float64_to_fp16, float_json

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
    httpencode._encode_tensors — and the element list returned is bytes, encoded there."""
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
                " (or, to an MLServer backend, set the backend's non_utf8_bytes: base64)"
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
