"""Hard limits on what one inference request may hold (config ``limits``), checked on the
request as it arrives — the JSON part of an HTTP body, or the wire form of a gRPC
ModelInferRequest — before it is routed, pass-through included. No I/O.

Each refusal is a LimitExceeded (400 / INVALID_ARGUMENT) naming the limit's key; the checks of
one name, shape, count or id are codec/bounds.py's.
"""
from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Annotated, Any

import msgspec
import orjson

from ..config.security import Limits
from ..errors import InvalidRequest, LimitExceeded, NegativeDimension
from .bounds import limit_count, limit_id, limit_name, limit_shape
from .jsondup import check_unique, members
from .jsonscan import skeleton
from .wire import iter_fields, read_varint

__all__ = ["JSON_CHECK_MAX", "JsonCheck", "check_json", "check_pb"]

# JSON parts up to this size are checked as they are (a few microseconds for a typical
# request, and every binary-extension header); a larger one is checked on its skeleton
# (codec/jsonscan.py: the text without its tensors' data), which is what the limits read.
JSON_CHECK_MAX = 64 * 1024

_NO_DATA = msgspec.Raw()  # a tensor without "data" (binary extension: the bytes follow the JSON)

_VARINT, _LEN = 0, 2


class JsonCheck:
    """The limits on the JSON part of an HTTP inference request (spec "Inference Request JSON
    Object") for one ``Limits``, of any size (over JSON_CHECK_MAX bytes, its skeleton):
    ``check(part)`` raises LimitExceeded, or InvalidRequest for text that is not UTF-8 or an object that
    repeats a member name (codec/jsondup.py: the check would judge one value and the backend
    read another). Malformed JSON is left to the path that reads it (it has its own error).

    Built once per front end. The common case — ASCII text (nothing to validate as UTF-8) of
    the spec's form, within every limit — is proven so by a msgspec decoder whose types carry
    the limits (lengths of ids, names, tensor lists and shapes, each dimension from 1 to
    ``max_elements``): it skips each tensor's ``data`` unread (no float object per element)
    and checks the rest in C; what is left in Python is each shape's product and the count of
    members against the text's colons (no repeated name). Anything else —
    non-ASCII text, a member of another type, a value past a limit, malformed JSON — goes to
    the general path (:func:`_check_any`: parsed whole by orjson and walked), which decides,
    and names the limit. So both give the same answer by construction; a hypothesis test holds
    them to it (tests/unit/test_limits.py)."""

    __slots__ = ("_decode", "_limits", "_max_elements", "_max_id")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._max_elements = limits.max_elements
        self._max_id = limits.max_id_length
        ident = Annotated[str, msgspec.Meta(max_length=limits.max_id_length)]
        name = Annotated[str, msgspec.Meta(max_length=limits.max_name_length)]
        # ge=1: a 0 or a negative dimension goes to the general path, which multiplies the
        # others (a 0: _NONZERO) or refuses it (a negative one).
        dim = Annotated[int, msgspec.Meta(ge=1, le=limits.max_elements)]
        shape = Annotated[list[dim], msgspec.Meta(max_length=limits.max_dims)]
        params = dict[str, Any] | None
        # Every member the spec gives each object is a field (data unread: a Raw slice), and no
        # other is taken: the fields present are then all the members written, which the
        # repeated-name proof counts (codec/jsondup.py).
        strict = {"forbid_unknown_fields": True}
        tensor = msgspec.defstruct("Tensor", [("name", name), ("shape", shape), ("datatype", str),
                                              ("parameters", params, None), ("data", msgspec.Raw, _NO_DATA)],
                                   **strict)  # type: ignore[arg-type]
        output = msgspec.defstruct("Output", [("name", name), ("parameters", params, None)],
                                   **strict)  # type: ignore[arg-type]
        request = msgspec.defstruct("Request", [
            ("id", ident | None, None),
            ("parameters", params, None),
            ("inputs", Annotated[list[tensor], msgspec.Meta(max_length=limits.max_tensors)] | None,  # type: ignore[valid-type]
             None),
            ("outputs", Annotated[list[output], msgspec.Meta(max_length=limits.max_tensors)] | None,  # type: ignore[valid-type]
             None),
        ], **strict)  # type: ignore[arg-type]
        self._decode: Callable[[bytes | bytearray], Any] = msgspec.json.Decoder(request).decode

    def __call__(self, part: bytes | bytearray | memoryview) -> None:
        if len(part) > JSON_CHECK_MAX:
            # However large the data, the limits are on the rest: padding a request past a
            # size does not take it past its limits.
            part = skeleton(part if type(part) is bytes else bytes(part))
        self.check(part)

    def check(self, text: bytes | bytearray | memoryview) -> None:
        """The limits on a request's JSON text — or its skeleton, which reads the same to them
        (a streamed body's, built as it arrives: frontend/incoming.py)."""
        if type(text) is memoryview or not text.isascii() or not self._proven(text):
            _check_any(text, self._limits)

    def _proven(self, part: bytes | bytearray) -> bool:
        """Whether the typed decoder proves ``part`` within every limit, with no repeated
        member name; False is "not proven", for the general path to decide."""
        try:
            request = self._decode(part)
        except msgspec.DecodeError:  # (a ValidationError — a type, a limit — is one)
            return False
        # The members present, counted for the repeated-name proof (check_unique).
        n = 0 if request.id is None else 1
        params = request.parameters
        if params is not None:
            sid = params.get("sequence_id")
            if type(sid) is str and len(sid) > self._max_id:
                return False
            n += 1 + len(params)
        inputs = request.inputs
        if inputs is not None:
            n += 1
            max_elements = self._max_elements
            for t in inputs:
                # (each dimension is at most max_elements and there are at most max_dims)
                if prod(t.shape) > max_elements:
                    return False  # the general path names it
                n += 3 if t.data is _NO_DATA else 4  # name, shape, datatype (required), data
                tp = t.parameters
                if tp is not None:
                    n += 1 + len(tp)
        outputs = request.outputs
        if outputs is not None:
            n += 1 + len(outputs)
            for o in outputs:
                op = o.parameters
                if op is not None:
                    n += 1 + len(op)
        return part.count(b":") == n


def check_json(part: bytes | bytearray | memoryview, limits: Limits) -> None:
    """:class:`JsonCheck` once (it builds a decoder: a front end keeps one instead)."""
    JsonCheck(limits)(part)


def _check_any(part: bytes | bytearray | memoryview, limits: Limits) -> None:
    """The limits on JSON of any form: parsed whole, members of unexpected types skipped."""
    try:
        doc: Any = orjson.loads(part)
    except orjson.JSONDecodeError as exc:
        if "UTF-8" in str(exc):
            # A name, id or string with bytes that are not UTF-8 (JSON text is UTF-8, RFC 8259
            # section 8.1): refused here rather than relayed to a parser that may take it.
            raise InvalidRequest("request JSON is not valid UTF-8") from None
        return  # other malformed JSON: the path that reads it says so in its own words
    if type(doc) is not dict:
        return
    check_unique(part, members(doc), "request")
    # Plain loops, type() checks and inline comparisons (a helper is called only to refuse).
    # JSON strings are str, never bytes.
    max_id = limits.max_id_length
    rid = doc.get("id")
    if type(rid) is str and len(rid) > max_id:
        limit_id("request id", rid, limits)
    params = doc.get("parameters")
    if type(params) is dict:
        sid = params.get("sequence_id")
        if type(sid) is str and len(sid) > max_id:
            limit_id("sequence_id", sid, limits)
    max_name = limits.max_name_length
    inputs = doc.get("inputs")
    if type(inputs) is list:
        if len(inputs) > limits.max_tensors:
            limit_count("input", len(inputs), limits)
        max_dims, max_elements = limits.max_dims, limits.max_elements
        for t in inputs:
            if type(t) is not dict:
                continue
            name = t.get("name")
            if type(name) is str and len(name) > max_name:
                limit_name(name, limits)
            shape = t.get("shape")
            if type(shape) is not list:
                continue
            if len(shape) > max_dims:
                limit_shape(name, [0] * len(shape), limits)
            elements = 1
            for d in shape:
                if type(d) is not int:
                    break  # not a count: the codec / backend says so
                if d < 0:
                    limit_shape(name, shape, limits)  # (raises: negative)
                if d == 0:
                    continue  # (see _NONZERO)
                elements *= d
                if elements > max_elements:
                    limit_shape(name, shape, limits)
    outputs = doc.get("outputs")
    if type(outputs) is list:
        if len(outputs) > limits.max_tensors:
            limit_count("output", len(outputs), limits)
        for t in outputs:
            if type(t) is dict:
                name = t.get("name")
                if type(name) is str and len(name) > max_name:
                    limit_name(name, limits)


def _packed_dims(value: memoryview, limits: Limits) -> list[int]:
    dims: list[int] = []
    pos, end = 0, len(value)
    while pos < end:
        d, pos = read_varint(value, pos)
        dims.append(d - (1 << 64) if d >= 1 << 63 else d)  # int64, two's complement on the wire
        if len(dims) > limits.max_dims:
            break
    return dims


def _input_pb(view: memoryview, limits: Limits) -> None:
    """ModelInferRequest.InferInputTensor: name (1), shape (3, packed or not)."""
    name: memoryview | str = ""
    dims: list[int] = []
    for fnum, wtype, value in iter_fields(view):
        if fnum == 1 and wtype == _LEN:
            name = value  # type: ignore[assignment]
        elif fnum == 3 and wtype == _LEN:
            dims += _packed_dims(value, limits)  # type: ignore[arg-type]
        elif fnum == 3 and wtype == _VARINT:
            d = int(value)
            dims.append(d - (1 << 64) if d >= 1 << 63 else d)
        if len(dims) > limits.max_dims:
            break
    limit_name(name, limits)
    shown = bytes(name).decode("utf-8", "replace") if isinstance(name, memoryview) else name
    limit_shape(shown, dims, limits)


def check_pb(message: bytes | memoryview, limits: Limits) -> None:
    """The limits on a serialized ModelInferRequest (grpc_predict_v2.proto): id (3),
    inputs (5), outputs (6), without parsing the tensors' contents."""
    view = message if isinstance(message, memoryview) else memoryview(message)
    inputs = outputs = 0
    try:
        for fnum, wtype, value in iter_fields(view):
            if wtype != _LEN:
                continue
            if fnum == 5:
                inputs += 1
                limit_count("input", inputs, limits)
                _input_pb(value, limits)  # type: ignore[arg-type]
            elif fnum == 6:
                outputs += 1
                limit_count("output", outputs, limits)
                for f, w, v in iter_fields(value):  # type: ignore[arg-type]
                    if f == 1 and w == _LEN:
                        limit_name(v, limits)
            elif fnum == 3:
                limit_id("request id", value, limits)
    except (LimitExceeded, NegativeDimension):
        raise
    except InvalidRequest:
        return  # malformed: the path that parses it says so in its own words
