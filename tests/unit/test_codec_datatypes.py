"""The datatype table, the shared validator and the numpy bridge (gateway.codec.datatypes)."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from gateway.codec import datatypes as dt
from gateway.errors import InvalidRequest
from gateway.model import Tensor

# name: (itemsize, numpy dtype str) — spec "Tensor Data Types". Every one may travel in JSON
# on converting paths (FP16/BF16 as numbers: codec/jsonnum.py).
TABLE = {
    "BOOL": (1, "|b1"),
    "UINT8": (1, "|u1"),
    "UINT16": (2, "<u2"),
    "UINT32": (4, "<u4"),
    "UINT64": (8, "<u8"),
    "INT8": (1, "|i1"),
    "INT16": (2, "<i2"),
    "INT32": (4, "<i4"),
    "INT64": (8, "<i8"),
    "FP16": (2, "<f2"),
    "BF16": (2, "<u2"),
    "FP32": (4, "<f4"),
    "FP64": (8, "<f8"),
    "BYTES": (None, "|O"),
}


def tensor(datatype: str, shape: tuple[int, ...], data: bytes, name: str = "t") -> Tensor:
    return Tensor(name, datatype, shape, memoryview(data))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_table(name: str) -> None:
    info = dt.DATATYPES[name]
    itemsize, dtype = TABLE[name]
    assert (info.itemsize, info.dtype.str) == (itemsize, dtype)


def test_table_is_complete() -> None:
    assert set(dt.DATATYPES) == set(TABLE)


@pytest.mark.parametrize("bad", ["fp32", "Fp32", "FLOAT", "", None, 3])
def test_unknown_datatype_names_tensor(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="'in0'"):
        dt.datatype_info(bad, "in0")  # type: ignore[arg-type]


def test_lower_case_datatype_hint() -> None:
    with pytest.raises(InvalidRequest, match="case-sensitive.*'FP32'"):
        dt.datatype_info("fp32", "x")


@pytest.mark.parametrize(
    ("shape", "count"), [((), 1), ((0,), 0), ((2, 0, 3), 0), ((2, 3, 4), 24), ((2**62, 1), 2**62)]
)
def test_element_count(shape: tuple[int, ...], count: int) -> None:
    assert dt.element_count(shape) == count


@pytest.mark.parametrize("shape", [(-1,), (2, -3), (2**32, 2**32), (2**63,), (True, 2), (2.0,), ("2",)])
def test_element_count_rejects(shape: tuple) -> None:
    with pytest.raises(InvalidRequest, match="'in7'"):
        dt.element_count(shape, "in7")


def test_expected_nbytes() -> None:
    assert dt.expected_nbytes("FP32", (2, 3)) == 24
    assert dt.expected_nbytes("BOOL", (5,)) == 5
    assert dt.expected_nbytes("BYTES", (5,)) is None
    with pytest.raises(InvalidRequest, match="'big'"):
        dt.expected_nbytes("FP64", (2**61,), "big")


def test_validate_fixed_size() -> None:
    dt.validate_tensor(tensor("INT32", (2, 2), bytes(16)))
    dt.validate_tensor(tensor("INT32", (0, 2), b""))
    with pytest.raises(InvalidRequest, match="'t'.*15 bytes.*needs 16"):
        dt.validate_tensor(tensor("INT32", (2, 2), bytes(15)))


BYTES_OK = serialize_byte_tensor(np.array([b"ab", b"", b"xyz"], dtype=object)).item()


@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ((3,), BYTES_OK[:-1]),  # last element overruns
        ((3,), BYTES_OK + b"\x00"),  # trailing byte after the elements
        ((2,), BYTES_OK),  # more elements than the shape
        ((4,), BYTES_OK),  # fewer elements than the shape
        ((1,), b"\x01\x00"),  # truncated length prefix
        ((0,), b"\x00\x00\x00\x00"),  # data for an empty tensor
    ],
)
def test_validate_bytes_rejects(shape: tuple[int, ...], data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="'s'"):
        dt.validate_tensor(tensor("BYTES", shape, data, "s"))


def test_validate_bytes_ok() -> None:
    dt.validate_tensor(tensor("BYTES", (3,), BYTES_OK))
    dt.validate_tensor(tensor("BYTES", (1, 3), BYTES_OK))
    dt.validate_tensor(tensor("BYTES", (0,), b""))


def test_bytes_elements_match_tritonclient() -> None:
    elems = [b"", b"a", "é".encode(), bytes(range(256)), b"\x00\x00"]
    ours = dt.serialize_bytes_elements(elems)
    theirs = serialize_byte_tensor(np.array(elems, dtype=object)).item()
    assert ours == theirs
    assert [bytes(e) for e in dt.bytes_elements(ours)] == elems
    assert list(deserialize_bytes_tensor(ours)) == elems
    assert dt.serialize_bytes_elements([]) == b""


def test_bytes_elements_are_slices() -> None:
    buf = dt.serialize_bytes_elements([b"abc", b"de"])
    view = memoryview(buf)
    elems = dt.bytes_elements(view)
    assert all(e.obj is buf for e in elems)


def test_to_numpy_is_zero_copy() -> None:
    buf = bytearray(np.arange(6, dtype="<i4").tobytes())
    arr = dt.to_numpy(Tensor("x", "INT32", (2, 3), memoryview(buf)))
    assert arr.shape == (2, 3) and arr.dtype == np.dtype("<i4")
    buf[0] = 42
    assert arr[0, 0] == 42


def test_to_numpy_bytes_and_bf16() -> None:
    arr = dt.to_numpy(tensor("BYTES", (1, 3), BYTES_OK))
    assert arr.dtype == object and arr.tolist() == [[b"ab", b"", b"xyz"]]
    bits = dt.to_numpy(tensor("BF16", (2,), b"\x80\x3f\x00\x40"))
    assert bits.dtype == np.dtype("<u2") and bits.tolist() == [0x3F80, 0x4000]


def test_to_numpy_rejects_size_mismatch() -> None:
    with pytest.raises(InvalidRequest, match="'t'"):
        dt.to_numpy(tensor("FP32", (3,), bytes(8)))
    with pytest.raises(InvalidRequest, match="'t'"):
        dt.to_numpy(tensor("FP32", (3,), bytes(7)))


@pytest.mark.parametrize(
    ("array", "datatype"),
    [
        (np.array([True, False, True]), "BOOL"),
        (np.arange(3, dtype=np.uint8), "UINT8"),
        (np.arange(3, dtype=">u2"), "UINT16"),
        (np.arange(3, dtype=np.uint32), "UINT32"),
        (np.arange(3, dtype=np.uint64), "UINT64"),
        (np.arange(3, dtype=np.int8), "INT8"),
        (np.arange(3, dtype=np.int16), "INT16"),
        (np.arange(3, dtype=">i4"), "INT32"),
        (np.arange(3, dtype=np.int64), "INT64"),
        (np.arange(3, dtype=np.float16), "FP16"),
        (np.arange(3, dtype=">f4"), "FP32"),
        (np.arange(3, dtype=np.float64), "FP64"),
    ],
)
def test_from_numpy_fixed(array: np.ndarray, datatype: str) -> None:
    t = dt.from_numpy("x", array.reshape(1, 3), parameters={"k": 1})
    assert (t.datatype, t.shape, t.parameters) == (datatype, (1, 3), {"k": 1})
    assert bytes(t.data) == array.astype(array.dtype.newbyteorder("<")).tobytes()
    dt.validate_tensor(t)


def test_from_numpy_bytes() -> None:
    t = dt.from_numpy("s", np.array([["ab", "é"], ["", "z"]], dtype=object))
    assert t.datatype == "BYTES" and t.shape == (2, 2)
    assert bytes(t.data) == serialize_byte_tensor(np.array([b"ab", "é".encode(), b"", b"z"], dtype=object)).item()
    assert dt.from_numpy("s", np.array([b"a", b"bc"])).datatype == "BYTES"
    assert bytes(dt.from_numpy("e", np.empty((0, 2), dtype=object)).data) == b""


def test_from_numpy_bf16() -> None:
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)
    assert bytes(dt.from_numpy("b", bits, "BF16").data) == b"\x80\x3f\x00\x40"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = dt.from_numpy("b", np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16))
    assert t.datatype == "BF16" and bytes(t.data) == b"\x80\x3f\x00\x40"
    with pytest.raises(InvalidRequest, match="'b'"):
        dt.from_numpy("b", np.array([1.0], dtype=np.float32), "BF16")


def test_from_numpy_scalar_and_cast() -> None:
    t = dt.from_numpy("s", np.float64(2.5))
    assert t.shape == () and dt.to_numpy(t) == 2.5
    t = dt.from_numpy("c", np.array([1, 2]), "FP32")
    assert bytes(t.data) == np.array([1, 2], "<f4").tobytes()
    with pytest.raises(InvalidRequest, match="'c'"):
        dt.from_numpy("c", np.array([1 + 2j]))
