"""Equality of decoded requests/responses across wire forms (the differential checks)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.codec.datatypes import bytes_values, to_numpy
from gateway.codec.grpc import HTTP_ONLY_PARAMS
from gateway.codec.jsonnum import bf16_to_float64
from gateway.model import RequestedOutput, Tensor

from ._support import check, same_value

__all__ = ["same_outputs", "same_params", "same_tensors"]


def same_params(a: dict[str, Any], b: dict[str, Any], where: str, drop_http: bool = True) -> None:
    """Parameters equal; ``drop_http``: the binary-extension ones (gRPC drops them) ignored."""
    if drop_http:
        a = {k: v for k, v in a.items() if k not in HTTP_ONLY_PARAMS}
        b = {k: v for k, v in b.items() if k not in HTTP_ONLY_PARAMS}
    check(a.keys() == b.keys(), f"{where}: parameter keys {sorted(a)} != {sorted(b)}")
    for k in a:
        # JSON has one number type for 1 and 1.0 only when both sides read it alike: types must match.
        check(same_value(a[k], b[k]), f"{where}: parameter {k!r}: {a[k]!r} != {b[k]!r}")


def _values(t: Tensor) -> Any:
    if t.datatype == "BYTES":
        return bytes_values(t.data, t.name)
    arr = to_numpy(t, flat=True)
    if t.datatype == "BOOL":
        return arr.view(np.uint8) != 0  # any non-zero byte is true (Triton)
    if t.datatype == "BF16":
        return bf16_to_float64(arr)  # (its bit patterns: compared as numbers, NaN equal to NaN)
    return arr


def same_tensors(a: Sequence[Tensor], b: Sequence[Tensor], where: str, exact: bool = True) -> None:
    """Same names, datatypes, shapes, parameters and data: byte for byte when ``exact``,
    else by value (a trip through JSON: NaN payloads and BOOL bytes other than 0/1 differ)."""
    check(len(a) == len(b), f"{where}: {len(a)} tensors != {len(b)}")
    for x, y in zip(a, b):
        w = f"{where}: tensor {x.name!r}"
        check((x.name, x.datatype, x.shape) == (y.name, y.datatype, y.shape),
              f"{w}: {(x.name, x.datatype, x.shape)} != {(y.name, y.datatype, y.shape)}")
        same_params(dict(x.parameters), dict(y.parameters), w)
        if exact:
            check(bytes(x.data) == bytes(y.data), f"{w}: data differs")
            continue
        vx, vy = _values(x), _values(y)
        if isinstance(vx, list):
            check(vx == vy, f"{w}: BYTES elements differ")
        else:
            check(bool(np.array_equal(vx, vy, equal_nan=vx.dtype.kind == "f")), f"{w}: values differ")


def same_outputs(a: Sequence[RequestedOutput], b: Sequence[RequestedOutput], where: str) -> None:
    check([o.name for o in a] == [o.name for o in b], f"{where}: requested outputs differ")
    for x, y in zip(a, b):
        same_params(dict(x.parameters), dict(y.parameters), f"{where}: output {x.name!r}")
