"""The routing fields and hard limits of a serialized ModelInferRequest (grpc_predict_v2.proto),
read once per gRPC inference before it is routed. No I/O.

Two paths give one answer. The exact path is protobuf's: the message parsed by upb (which
refuses one that is not a ModelInferRequest: a string that is not UTF-8, a field cut short),
the limits read from the parsed objects — or, past PARSE_MAX, codec/wire.py's walk and
limits.check_pb, which skip tensor contents without copying them. It names every refusal.
The fast path (``InferScan._walked``) only accepts: one pass over the bytes, compiled with mypyc
where the install has a C compiler (setup.py), that returns the routing fields of a request it
can vouch for — every field well formed as upb requires, every string UTF-8, every limit held,
no ``parameters`` (a sequence_id is read as protobuf's map reads it, by the exact path) and no
typed ``contents`` (left unparsed, so unvouched) — and None for anything else, which the exact
path then decides. Why: reading the limits from the parsed message cost more than all the rest
of the gateway's own code on a small call (each tensor, name and shape touched is a Python
object upb makes), and parsing alone a tenth of it (benchmarks/instructions.py ``--body
grpc_small``). tests/unit/test_grpcscan.py and the fuzz target fuzz/grpc_wire.py hold the two
paths to one answer.
"""
from __future__ import annotations

from typing import Any, Final

from google.protobuf.message import DecodeError

from .._pb import grpc_predict_v2_pb2 as _pb
from ..config.security import Limits
from ..errors import InvalidRequest
from .bounds import limit_count, limit_id, limit_name, limit_shape
from .limits import check_pb
from .wire import scan_infer_routing

__all__ = ["PARSE_MAX", "InferScan", "scan_checked"]

_REQUEST: Any = _pb.ModelInferRequest

# The exact path parses messages up to this size with protobuf's C parser (upb), so one that is
# not a ModelInferRequest protobuf can read (a string field that is not UTF-8, a field cut short)
# is refused here, clearly, instead of being handed to a backend whose parser fails it with
# INTERNAL. Larger ones (tensors) are only walked: their contents are skipped, not copied.
PARSE_MAX: Final = 64 * 1024

# (Final: compiled, a module constant is a C constant, not a lookup in the module's dict.)
_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2
_I32: Final = 5
_FAIL: Final = -1  # a position past a fault: the walk gives the message to the exact path
_SHORT: Final = (1 << 62) - 1  # the largest integer mypyc keeps unboxed
_MAX_KEY: Final = ((1 << 29) - 1) << 3 | 7  # field numbers end at 2^29 - 1: upb refuses a larger tag


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; next position _FAIL when malformed."""
    result = 0
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    return 0, _FAIL


def _field(buf: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, start, stop) of the field at ``pos``: its value is
    buf[start:stop] (a length-delimited field's payload, or a varint / fixed-width value as
    written) and ``stop`` is where the next field begins; field number -1 for a malformed field,
    or a tag protobuf refuses (field number 0, past 2^29 - 1, or written in more than 5 bytes:
    upb refuses an overlong tag, though it holds a small number)."""
    at = pos
    key, pos = _varint(buf, pos, end)
    if pos == _FAIL or key < 8 or key > _MAX_KEY or pos - at > 5:
        return -1, 0, 0, 0
    wtype = key & 7
    start = pos
    if wtype == _VARINT:
        pos = _varint(buf, pos, end)[1]
    elif wtype == _I64:
        pos += 8
    elif wtype == _I32:
        pos += 4
    elif wtype == _LEN:
        length, start = _varint(buf, pos, end)
        pos = start + length if start != _FAIL else _FAIL
    else:
        pos = _FAIL  # groups (3, 4) and the unused 6, 7: left to the exact path
    if pos == _FAIL or pos > end:
        return -1, 0, 0, 0
    return key >> 3, wtype, start, pos


def _utf8(buf: bytes, start: int, stop: int) -> bool:
    """buf[start:stop] is UTF-8 as upb validates it (Python's strict decoder refuses what upb
    does: overlong forms, surrogates, code points past U+10FFFF)."""
    for i in range(start, stop):
        if buf[i] >= 0x80:
            try:
                buf[start:stop].decode("utf-8")
            except UnicodeDecodeError:
                return False
            return True
    return True


def _chars(buf: bytes, start: int, stop: int) -> int:
    """Characters of the UTF-8 text buf[start:stop]: its bytes that start one."""
    n = 0
    for i in range(start, stop):
        if buf[i] & 0xC0 != 0x80:
            n += 1
    return n


def _int64(d: int) -> int:
    """A varint read as protobuf's int64 (two's complement on the wire)."""
    d &= 0xFFFF_FFFF_FFFF_FFFF  # (a 10th byte's bits past 63 are dropped, as protobuf does)
    return d - (1 << 64) if d >= 1 << 63 else d


class _Shape:
    """A shape's dimensions as they are read: how many, and whether their product passes
    max_elements — its dimensions other than 0 — and has no negative one (``over`` either way:
    the exact path, bounds.limit_shape, names which)."""

    def __init__(self, max_elements: int) -> None:
        self.max_elements = max_elements
        self.ndims = 0
        self.elements = 1
        self.counting = True  # until a dimension ≤ 0
        self.over = False

    def add(self, d: int) -> None:
        self.ndims += 1
        if not self.counting:
            return
        if d > _SHORT:  # (rare: below it the comparisons are on native integers)
            d = _int64(d)
        if d <= 0:
            if d < 0:  # refused: the exact path names it (bounds.limit_shape)
                self.counting = False
                self.over = True
            return  # 0: the others still count (bounds._NONZERO)
        self.elements *= d
        if self.elements > self.max_elements:
            self.counting = False
            self.over = True


class InferScan:
    """scan_checked for one ``Limits``, read into native integers once (the front end keeps one)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.max_tensors: int = limits.max_tensors
        self.max_dims: int = limits.max_dims
        self.max_elements: int = limits.max_elements
        self.max_name: int = limits.max_name_length
        self.max_id: int = limits.max_id_length

    def scan(self, message: bytes) -> tuple[str, str, str | None]:
        """(model_name, model_version, sequence_id) of a serialized ModelInferRequest, after
        checking its limits (LimitExceeded naming the limit; InvalidRequest for a malformed one)."""
        walked = self._walked(message)
        if walked is not None:
            return walked[0], walked[1], None
        if len(message) <= PARSE_MAX:
            return _checked_parse(_parsed(message), self.limits)
        routing = scan_infer_routing(message)
        check_pb(message, self.limits)
        return routing

    def _text(self, buf: bytes, start: int, stop: int, limit: int) -> bool:
        """A string field: UTF-8, and at most ``limit`` characters (bytes bound them; past 4 bytes
        a character, it is too long whatever it holds — not read at all, however large)."""
        n = stop - start
        if n > 4 * limit:
            return False
        return _utf8(buf, start, stop) and (n <= limit or _chars(buf, start, stop) <= limit)

    def _walked(self, buf: bytes) -> tuple[str, str] | None:
        """(model_name, model_version) of a request the walk vouches for; None: the exact path decides."""
        end = len(buf)
        pos = 0
        model_at = model_end = version_at = version_end = 0
        inputs = outputs = 0
        while pos < end:
            fnum, wtype, start, pos = _field(buf, pos, end)
            if fnum < 0:
                return None
            if wtype != _LEN:  # (a known field with another wire type is an unknown field to protobuf)
                continue
            if fnum == 1 or fnum == 2 or fnum == 3:
                # Each occurrence is parsed (and validated) by protobuf; the last one wins.
                if not self._text(buf, start, pos, self.max_id if fnum == 3 else pos - start):
                    return None
                if fnum == 1:
                    model_at, model_end = start, pos
                elif fnum == 2:
                    version_at, version_end = start, pos
            elif fnum == 4:
                return None  # parameters
            elif fnum == 5:
                inputs += 1
                if inputs > self.max_tensors or not self._input(buf, start, pos):
                    return None
            elif fnum == 6:
                outputs += 1
                if outputs > self.max_tensors or not self._output(buf, start, pos):
                    return None
            # (7, raw_input_contents, and unknown fields: bytes, unread)
        return buf[model_at:model_end].decode("utf-8"), buf[version_at:version_end].decode("utf-8")

    def _input(self, buf: bytes, pos: int, end: int) -> bool:
        """One InferInputTensor at buf[pos:end] is vouched for: name (1) and datatype (2)
        UTF-8, the name and the shape (3, packed or not) within the limits, no parameters (4) or
        typed contents (5)."""
        shape = _Shape(self.max_elements)
        while pos < end:
            fnum, wtype, start, pos = _field(buf, pos, end)
            if fnum < 0:
                return False
            if fnum == 3 and wtype == _VARINT:
                shape.add(_varint(buf, start, pos)[0])
            elif wtype != _LEN:
                continue
            elif fnum == 1 or fnum == 2:
                if not self._text(buf, start, pos, self.max_name if fnum == 1 else pos - start):
                    return False
            elif fnum == 3:
                while start < pos:
                    d, start = _varint(buf, start, pos)
                    if start == _FAIL:
                        return False
                    shape.add(d)
            elif fnum == 4 or fnum == 5:
                return False
        return not shape.over and shape.ndims <= self.max_dims

    def _output(self, buf: bytes, pos: int, end: int) -> bool:
        """One InferRequestedOutputTensor at buf[pos:end] is vouched for: its name (1) UTF-8 and
        within max_name_length, no parameters (2)."""
        while pos < end:
            fnum, wtype, start, pos = _field(buf, pos, end)
            if fnum < 0:
                return False
            if wtype == _LEN and (fnum == 2 or (fnum == 1 and not self._text(buf, start, pos, self.max_name))):
                return False  # (2, parameters: left to the exact path)
        return True


def scan_checked(message: bytes, limits: Limits) -> tuple[str, str, str | None]:
    """(model_name, model_version, sequence_id) of a serialized ModelInferRequest, after
    checking ``limits`` (InferScan.scan; a front end keeps an InferScan)."""
    return InferScan(limits).scan(message)


def _parsed(message: bytes) -> Any:
    try:
        return _REQUEST.FromString(message)
    except DecodeError:
        scan_infer_routing(message)  # (names the routing fields' own faults first)
        raise InvalidRequest("malformed ModelInferRequest: protobuf cannot parse it (a string field that "
                             "is not valid UTF-8, or a field cut short)") from None


def _sequence(param: Any) -> str | None:
    """ModelInferRequest.parameters["sequence_id"] as scan_infer_routing reads it."""
    which = param.WhichOneof("parameter_choice")
    if which == "int64_param" or which == "uint64_param":
        number = getattr(param, which)
        return str(number) if number else None
    if which == "string_param":
        return param.string_param or None
    return None


def _checked_parse(req: Any, limits: Limits) -> tuple[str, str, str | None]:
    """The limits read from protobuf's parsed message: for a small message with request
    parameters (its sequence_id as protobuf's map reads it)."""
    inputs = req.inputs
    limit_count("input", len(inputs), limits)
    for t in inputs:
        limit_name(t.name, limits)
        limit_shape(t.name, list(t.shape), limits)
    outputs = req.outputs
    limit_count("output", len(outputs), limits)
    for o in outputs:
        limit_name(o.name, limits)
    limit_id("request id", req.id, limits)
    sequence: str | None = None
    param = req.parameters.get("sequence_id")
    if param is not None:
        sequence = _sequence(param)
        if sequence is not None and param.WhichOneof("parameter_choice") == "string_param":
            limit_id("sequence_id", sequence, limits)
    return req.model_name, req.model_version, sequence
