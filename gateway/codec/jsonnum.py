"""Floating-point tensor values in JSON, without changing a value. No I/O.

- **NaN and ±Inf.** JSON has no token for them; orjson writes ``null``, which a reader
  takes for NaN or refuses — a silent value change. Triton's HTTP server (rapidjson)
  writes ``NaN``, ``Infinity`` and ``-Infinity``, and reads them back; MLServer's Python
  ``json`` reads the same three tokens. So a float tensor holding any of them is written
  with those tokens (the rest of its text is orjson's), and a JSON body holding them is
  read (by the standard library's parser, only when orjson refuses such a body).
- **FP16 and BF16** travel as JSON numbers on converting paths (MLServer takes FP16 as
  numbers). Writing widens them to float64 exactly (every FP16 and BF16 value is a float64,
  and the shortest repr of a float64 reads back to the same float64). Reading rounds each
  number to the nearest representable value, ties to even (IEEE 754's default) — a number
  the client wrote with more digits than the type holds is rounded as any FP16/BF16 cast
  rounds it — and refuses a finite number beyond the type's range rather than turn it into
  an infinity.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from ..errors import InvalidRequest

__all__ = ["bf16_to_float64", "float64_to_bf16", "float64_to_fp16", "float_json", "float_token", "params_json"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def float_json(values: np.ndarray) -> np.ndarray | orjson.Fragment:
    """A flat float64 array as JSON ``data``: the array itself (orjson writes it) when
    every value is finite, else the text with ``NaN`` / ``Infinity`` / ``-Infinity``."""
    finite = np.isfinite(values)
    if finite.all():
        return values
    text = orjson.dumps(np.where(finite, values, np.nan), option=_NUMPY)  # non-finite → null
    odd = values[~finite]
    tokens = np.where(np.isnan(odd), "NaN", np.where(odd > 0, "Infinity", "-Infinity")).tolist()
    pieces = text.split(b"null")
    assert len(pieces) == len(tokens) + 1  # a numeric array's text holds no other "null"
    out = [pieces[0]]
    for token, piece in zip(tokens, pieces[1:]):
        out.append(token.encode())
        out.append(piece)
    return orjson.Fragment(b"".join(out))


def float_token(value: float) -> float | orjson.Fragment:
    """One float as JSON: itself, or the ``NaN`` / ``Infinity`` / ``-Infinity`` token."""
    if math.isfinite(value):
        return value
    return orjson.Fragment(b"NaN" if math.isnan(value) else b"Infinity" if value > 0 else b"-Infinity")


def params_json(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as JSON writes them: a non-finite double parameter (a gRPC client's
    ``double_param``) keeps its value as a token, where orjson would write ``null``."""
    if not any(isinstance(v, float) and not math.isfinite(v) for v in params.values()):
        return params
    return {k: float_token(v) if isinstance(v, float) else v for k, v in params.items()}


def bf16_to_float64(raw: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) → their exact float64 values."""
    return (raw.astype("<u4") << 16).view("<f4").astype(np.float64)


_BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], "<u4").tobytes(), "<f4")[0])  # 3.3895314e38


def _check_range(name: str, kind: str, values: np.ndarray, rounded: np.ndarray) -> None:
    overflow = np.isfinite(values) & ~np.isfinite(rounded)
    if overflow.any():
        raise InvalidRequest(f"tensor '{name}': {float(values[overflow][0])!r} is beyond the range of {kind}")


def float64_to_fp16(name: str, values: np.ndarray) -> np.ndarray:
    """Round to FP16, nearest with ties to even (numpy converts float64 to half directly,
    one rounding)."""
    with np.errstate(over="ignore"):
        rounded = values.astype("<f2")
    _check_range(name, "FP16", values, rounded)
    return rounded


def float64_to_bf16(name: str, values: np.ndarray) -> np.ndarray:
    """Round to BF16 (8 significant bits, float32's exponent range), nearest with ties to
    even, in one rounding from float64 (going through float32 would round twice); returns
    the uint16 bit patterns."""
    v = np.asarray(values, dtype=np.float64)
    mantissa, exponent = np.frexp(v)  # v = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
    normal = np.ldexp(np.round(np.ldexp(mantissa, 8)), exponent - 8)  # np.round: ties to even
    tiny = np.round(np.ldexp(v, 133)) * 2.0**-133  # BF16 subnormals: a fixed quantum of 2**-133
    with np.errstate(invalid="ignore"):
        rounded = np.where(np.abs(v) >= 2.0**-126, normal, tiny)
    rounded = np.where(np.isfinite(v), rounded, v)
    with np.errstate(over="ignore"):
        big = np.isfinite(rounded) & (np.abs(rounded) > _BF16_MAX)
    if big.any():
        raise InvalidRequest(f"tensor '{name}': {float(v[big][0])!r} is beyond the range of BF16")
    bits = rounded.astype("<f4").view("<u4")  # exact: every rounded value is a float32
    nan = np.isnan(v)
    out = (bits >> 16).astype("<u2")
    out[nan] = 0x7FC0
    return out
