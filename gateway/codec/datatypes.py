"""The tensor datatype table and the one tensor validator every codec shares.

Spec "Tensor Data Types" (open-inference-protocol.txt; the size table is in
kserve-v2-data-plane.zh.txt): twelve fixed-size types plus BYTES, names
case-sensitive. Raw tensor bytes are little-endian and row-major; a BYTES
element is a 4-byte little-endian length followed by its bytes (the binary
extension and ``raw_input_contents`` use the same form), so every numpy dtype
here names its byte order explicitly (DESIGN.md habit 6).

BF16 has no numpy dtype (``ml_dtypes`` is a tritonclient dependency, not ours):
the gateway carries it as ``'<u2'`` bit patterns, which is enough to move it
between wire forms bit for bit. FP16 and BF16 cannot travel in JSON ``data``
(spec "Tensor Data": "fp16 is problematic to communicate explicitly";
Triton's http_server.cc rejects both in both directions).
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidRequest
from ..model import Params, Tensor

__all__ = [
    "DATATYPES",
    "INT64_MAX",
    "DatatypeInfo",
    "byte_view",
    "bytes_elements",
    "bytes_values",
    "datatype_info",
    "element_count",
    "expected_nbytes",
    "from_numpy",
    "serialize_bytes_elements",
    "tensor_view",
    "to_numpy",
    "validate_tensor",
]

INT64_MAX = 2**63 - 1  # shape dims are int64 in the gRPC API; Triton caps counts and sizes at INT64_MAX


@dataclass(frozen=True, slots=True)
class DatatypeInfo:
    name: str
    itemsize: int | None  # bytes per element; None for BYTES (variable length)
    dtype: np.dtype  # explicit byte order; object for BYTES, '<u2' for BF16


def _info(name: str, itemsize: int | None, dtype: str) -> DatatypeInfo:
    return DatatypeInfo(name, itemsize, np.dtype(dtype))


DATATYPES: dict[str, DatatypeInfo] = {
    d.name: d
    for d in (
        _info("BOOL", 1, "|b1"),
        _info("UINT8", 1, "|u1"),
        _info("UINT16", 2, "<u2"),
        _info("UINT32", 4, "<u4"),
        _info("UINT64", 8, "<u8"),
        _info("INT8", 1, "|i1"),
        _info("INT16", 2, "<i2"),
        _info("INT32", 4, "<i4"),
        _info("INT64", 8, "<i8"),
        # FP16 / BF16 as JSON numbers: codec/jsonnum.py (Triton itself refuses them in
        # JSON; MLServer takes FP16 numbers, so converting paths carry them).
        _info("FP16", 2, "<f2"),
        _info("BF16", 2, "<u2"),
        _info("FP32", 4, "<f4"),
        _info("FP64", 8, "<f8"),
        _info("BYTES", None, "O"),
    )
}

# (numpy kind, itemsize) -> datatype name, for from_numpy without an explicit datatype.
_FROM_NUMPY = {
    (d.dtype.kind, d.dtype.itemsize): d.name for d in DATATYPES.values() if d.name not in ("BF16", "BYTES")
}

_U32 = struct.Struct("<I")


def datatype_info(datatype: object, tensor: str) -> DatatypeInfo:
    """The table entry for ``datatype``; InvalidRequest naming ``tensor`` otherwise."""
    info = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if info is None:
        hint = ""
        if isinstance(datatype, str) and datatype.upper() in DATATYPES:
            hint = f" (datatypes are case-sensitive: use '{datatype.upper()}')"
        raise InvalidRequest(f"tensor '{tensor}': unknown datatype {datatype!r}{hint}")
    return info


def element_count(shape: Sequence[int], name: str = "") -> int:
    """Product of ``shape``. Dims must be non-negative ints and the count must fit int64."""
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):  # JSON 2.0 is not a dim
            raise InvalidRequest(f"tensor '{name}': shape {list(shape)} has a non-integer dimension")
        if dim < 0:
            raise InvalidRequest(f"tensor '{name}': shape {list(shape)} has a negative dimension")
        if dim > INT64_MAX:
            raise InvalidRequest(f"tensor '{name}': shape {list(shape)} has a dimension above 2**63-1")
        count *= dim
    if count > INT64_MAX:
        raise InvalidRequest(f"tensor '{name}': shape {list(shape)} has more than 2**63-1 elements")
    return count


def expected_nbytes(datatype: str, shape: Sequence[int], name: str = "") -> int | None:
    """Byte size of a fixed-size tensor; None for BYTES (known only by walking it)."""
    info = datatype_info(datatype, name)
    count = element_count(shape, name)
    if info.itemsize is None:
        return None
    nbytes = count * info.itemsize
    if nbytes > INT64_MAX:
        raise InvalidRequest(f"tensor '{name}': {count} elements of {datatype} exceed 2**63-1 bytes")
    return nbytes


def _walk_bytes(buf: memoryview, count: int, name: str) -> None:
    """Check ``buf`` holds exactly ``count`` length-prefixed elements, without slicing them."""
    end = len(buf)
    if count * 4 > end:
        raise InvalidRequest(f"tensor '{name}': {end} bytes cannot hold {count} BYTES elements")
    unpack = _U32.unpack_from
    pos = 0
    for _ in range(count):
        if pos + 4 > end:
            raise InvalidRequest(f"tensor '{name}': BYTES data ends inside an element length")
        pos += 4 + unpack(buf, pos)[0]
        if pos > end:
            raise InvalidRequest(f"tensor '{name}': BYTES element overruns the tensor data")
    if pos != end:
        raise InvalidRequest(
            f"tensor '{name}': BYTES data has {end - pos} bytes after the {count} elements of its shape"
        )


def validate_tensor(tensor: Tensor) -> None:
    """The one size check of every decoder: datatype known, shape sane, bytes match the shape.

    Fixed-size types: ``len(data) == element count * itemsize``. BYTES: the length
    prefixes walk to exactly the end of ``data`` and give one element per shape entry.
    """
    info = datatype_info(tensor.datatype, tensor.name)
    count = element_count(tensor.shape, tensor.name)
    nbytes = tensor.data.nbytes
    if info.itemsize is None:
        _walk_bytes(tensor.data, count, tensor.name)
    elif nbytes != count * info.itemsize:
        raise InvalidRequest(
            f"tensor '{tensor.name}': {nbytes} bytes of data, but shape {list(tensor.shape)} of "
            f"{tensor.datatype} needs {count * info.itemsize}"
        )


def _elements(src: Any, name: str) -> list[Any]:
    end = len(src)
    unpack = _U32.unpack_from
    out: list[Any] = []
    append = out.append
    pos = 0
    while pos < end:
        if pos + 4 > end:
            raise InvalidRequest(f"tensor '{name}': BYTES data ends inside an element length")
        n = unpack(src, pos)[0]
        pos += 4
        if pos + n > end:
            raise InvalidRequest(f"tensor '{name}': BYTES element overruns the tensor data")
        append(src[pos : pos + n])
        pos += n
    return out


def bytes_elements(buf: memoryview | bytes, name: str = "") -> list[memoryview]:
    """Split length-prefixed BYTES data into element slices of ``buf`` (no copy)."""
    return _elements(byte_view(buf), name)


def bytes_values(buf: memoryview | bytes, name: str = "") -> list[bytes]:
    """Split length-prefixed BYTES data into ``bytes`` elements.

    For consumers that need ``bytes``/``str`` anyway (JSON, object arrays): one copy
    of the buffer, then bytes slices, ~5x cheaper per element than memoryview slices.
    """
    return _elements(bytes(buf), name)


def serialize_bytes_elements(elements: Iterable[bytes | bytearray | memoryview], name: str = "") -> bytes:
    """Length-prefix and join BYTES elements (tritonclient's ``serialize_byte_tensor`` layout)."""
    pack = _U32.pack
    parts: list[bytes | bytearray | memoryview] = []
    append = parts.append
    try:
        for e in elements:
            append(pack(len(e)))
            append(e)
    except struct.error as exc:  # an element of 4 GiB or more cannot be length-prefixed
        raise InvalidRequest(f"tensor '{name}': a BYTES element is too large") from exc
    return b"".join(parts)


def byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of a received buffer; slices of it keep ``.obj`` = the buffer."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def tensor_view(array: np.ndarray) -> memoryview:
    """A flat unsigned-byte memoryview of a C-contiguous array (no copy)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def to_numpy(tensor: Tensor, *, flat: bool = False) -> np.ndarray:
    """The tensor as an ndarray of its shape: zero-copy frombuffer for fixed types
    (read-only when the buffer is), an object array of ``bytes`` for BYTES. ``flat``: one
    dimension, its element count checked against the shape — for encoders, and for an empty
    tensor whose other dimensions multiply past what numpy can shape ([2**62, 4, 0])."""
    info = datatype_info(tensor.datatype, tensor.name)
    shape = tensor.shape
    if info.itemsize is None:
        elems = bytes_values(tensor.data, tensor.name)
        arr = np.empty(len(elems), dtype=object)
        arr[:] = elems
    else:
        if tensor.data.nbytes % info.itemsize:
            raise InvalidRequest(f"tensor '{tensor.name}': data is not a whole number of {tensor.datatype}")
        arr = np.frombuffer(tensor.data, dtype=info.dtype)
    if flat and arr.size == element_count(shape, tensor.name):
        return arr
    try:
        return arr.reshape(shape)
    except ValueError as exc:
        raise InvalidRequest(
            f"tensor '{tensor.name}': {arr.size} elements do not fit shape {list(shape)}"
        ) from exc


def _datatype_of(array: np.ndarray, name: str) -> str:
    dt = array.dtype
    if dt.kind in "OSU":
        return "BYTES"
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16, recognised without importing ml_dtypes
        return "BF16"
    found = _FROM_NUMPY.get((dt.kind, dt.itemsize))
    if found is None:
        raise InvalidRequest(f"tensor '{name}': numpy dtype {dt} has no V2 datatype")
    return found


def from_numpy(
    name: str, array: np.ndarray, datatype: str | None = None, parameters: Params | None = None
) -> Tensor:
    """Build a Tensor from an ndarray. ``datatype`` defaults to the array's own type.

    An explicit fixed-size ``datatype`` converts the values (``astype``); BF16 takes
    uint16 bit patterns or an ``ml_dtypes.bfloat16`` array. BYTES takes object, bytes
    (``S``) or str (``U``) arrays; str elements are encoded UTF-8, other objects via
    ``str()`` as tritonclient does.
    """
    array = np.asarray(array)
    if datatype is None:
        datatype = _datatype_of(array, name)
    info = datatype_info(datatype, name)
    shape = tuple(array.shape)
    if info.itemsize is None:
        elems = [
            e if isinstance(e, bytes) else e.encode("utf-8") if isinstance(e, str) else str(e).encode("utf-8")
            for e in array.reshape(-1).tolist()
        ]
        data = memoryview(serialize_bytes_elements(elems, name))
    elif datatype == "BF16":
        if array.dtype.name == "bfloat16":
            bits = array.view(np.uint16)  # ml_dtypes arrays are native-endian
        elif array.dtype.kind == "u" and array.dtype.itemsize == 2:
            bits = array
        else:
            raise InvalidRequest(f"tensor '{name}': BF16 needs uint16 bit patterns or ml_dtypes.bfloat16")
        data = tensor_view(bits.astype("<u2", copy=False))
    else:
        data = tensor_view(array.astype(info.dtype, copy=False))
    return Tensor(name=name, datatype=datatype, shape=shape, data=data, parameters=dict(parameters or {}))
