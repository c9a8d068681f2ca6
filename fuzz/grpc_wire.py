"""Fuzz target: the gRPC wire scanner (codec/wire.py) and the gRPC codec (codec/grpc.py).

The input is a serialized message, taken as a ModelInferRequest, a ModelInferResponse and
a TraceSettingRequest in turn. Checks (any other exception, or a FuzzBug, is a bug):

- the scanners and the codec raise nothing but GatewayError;
- differential against protobuf's own parser: when the bytes parse as a ModelInferRequest,
  scan_infer_routing gives its model_name and model_version (last occurrence wins) and its
  ``sequence_id`` parameter as Triton reads it; scan_name_version the same name/version;
  the codec's decode_request the same tensors (names, datatypes, shapes, raw contents);
  settings_change never misses a TraceSettingRequest that sets something. The scanner may
  refuse what protobuf-python takes only for group wire types (3, 4; proto2 only, never in V2
  messages) and for varints over 5 bytes (a length upb truncates to 64 bits; C++ protobuf,
  which Triton uses, refuses it);
- gRPC → HTTP (codec/convert.py, binary and JSON) decodes back to the same tensors, and a
  decoded response re-encodes (raw and typed) to the same outputs.
"""
from __future__ import annotations

import re
from typing import Any

from fuzz._support import FuzzBug, check, instrumented, run

with instrumented(__name__ == "__main__", ("gateway",)):
    from google.protobuf.message import DecodeError
    from google.protobuf.unknown_fields import UnknownFieldSet

    from fuzz._compare import same_outputs, same_params, same_tensors
    from gateway._pb import grpc_predict_v2_pb2 as pb
    from gateway._pb import triton_extensions_pb2 as tx
    from gateway.codec import convert
    from gateway.codec import grpc as grpc_codec
    from gateway.codec import httpdecode
    from gateway.codec.grpcscan import PARSE_MAX, scan_checked
    from gateway.codec.wire import scan_infer_routing, scan_name_version, settings_change
    from gateway.config.security import Limits
    from gateway.errors import GatewayError, InvalidRequest, LimitExceeded, NegativeDimension

__all__ = ["one_input", "protobuf_sequence"]


def _parse(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError:
        return None


def protobuf_sequence(msg: Any) -> str | None:
    """The affinity key Triton's sequence batcher reads from a parsed request: the
    ``sequence_id`` parameter as int64, uint64 or string; None when absent, 0 or ""."""
    if "sequence_id" not in msg.parameters:
        return None
    p = msg.parameters["sequence_id"]
    which = p.WhichOneof("parameter_choice")
    if which in ("int64_param", "uint64_param"):
        value = getattr(p, which)
        return str(value) if value else None
    if which == "string_param":
        return p.string_param or None
    return None


def _group_refusal(exc: InvalidRequest) -> bool:
    return exc.message.endswith(("wire type 3", "wire type 4"))


_LONG_VARINT = re.compile(rb"[\x80-\xff]{5}")


def _overlong_varint(data: bytes) -> bool:
    """A varint of more than 5 bytes somewhere: upb truncates a 10-byte length to 64 bits and
    takes it, C++ protobuf (Triton) refuses a length of more than 5 bytes, as the scanner may."""
    return _LONG_VARINT.search(data) is not None


def _check_routing(data: bytes, msg: Any) -> None:
    try:
        routing = scan_infer_routing(data)
        name_version = scan_name_version(data)
    except InvalidRequest as exc:
        if msg is None or _group_refusal(exc) or _overlong_varint(data):
            return
        raise FuzzBug(f"the scanner refused a ModelInferRequest protobuf parses: {exc.message}") from exc
    if msg is None:
        return
    expected = (msg.model_name, msg.model_version, protobuf_sequence(msg))
    if any(f.field_number == 4 for f in UnknownFieldSet(msg)):
        # upb moves a parameters map entry that holds an unknown field into the unknown fields;
        # C++ protobuf (Triton) keeps the entry, as the scanner does: no reference for the sequence.
        routing, expected = routing[:2], expected[:2]  # type: ignore[assignment]
    check(routing == expected, f"scan_infer_routing {routing} != protobuf {expected}")
    check(name_version == expected[:2], f"scan_name_version {name_version} != protobuf {expected[:2]}")


_LIMITS = Limits(max_tensors=4, max_dims=6, max_elements=1000, max_name_length=16, max_id_length=16)


def _check_limits(data: bytes, msg: Any) -> None:
    """scan_checked (the gRPC front end's routing + hard limits): a message protobuf parses
    is refused only by a limit or a negative dimension, and otherwise routed as protobuf reads
    it; one it cannot parse (up to PARSE_MAX bytes) is refused."""
    try:
        routing = scan_checked(data, _LIMITS)
    except (LimitExceeded, NegativeDimension):
        return
    except InvalidRequest as exc:
        check(msg is None or _group_refusal(exc) or _overlong_varint(data),
              f"scan_checked refused a ModelInferRequest protobuf parses: {exc.message}")
        return
    check(msg is not None or len(data) > PARSE_MAX, "scan_checked took bytes protobuf cannot parse")
    if msg is not None and len(data) <= PARSE_MAX:
        expected = (msg.model_name, msg.model_version, protobuf_sequence(msg))
        check(routing == expected, f"scan_checked {routing} != protobuf {expected}")


def _check_request(data: bytes, msg: Any) -> None:
    try:
        req = grpc_codec.decode_request(data)
    except GatewayError:
        return
    check(msg is not None, "decode_request took a message protobuf refuses")
    # The answer's form (typed or raw) of a request the gateway converts (codec/convert.py).
    typed = grpc_codec.uses_typed_contents(data)
    check(typed == (bool(msg.inputs) and not msg.raw_input_contents),
          f"uses_typed_contents {typed} for {len(msg.inputs)} inputs, {len(msg.raw_input_contents)} raw")
    check((req.model_name, req.model_version, req.id) == (msg.model_name, msg.model_version, msg.id),
          "decode_request: model, version or id differs from protobuf's")
    check([t.name for t in req.inputs] == [t.name for t in msg.inputs], "decode_request: input names differ")
    for t, pt in zip(req.inputs, msg.inputs):
        check((t.datatype, t.shape) == (pt.datatype, tuple(pt.shape)), f"input {t.name!r}: datatype/shape differ")
    for t, raw in zip(req.inputs, msg.raw_input_contents):
        check(bytes(t.data) == raw, f"input {t.name!r}: raw contents differ from protobuf's")
    for binary in (True, False):
        try:
            chunks, headers, _typed = convert.grpc_request_to_http(data, binary=binary)
        except InvalidRequest as exc:
            # Refused by name: a binary-data extension parameter that is not a boolean.
            check(not binary or "must be a boolean" in exc.message,
                  f"grpc_request_to_http(binary=True) refused a decoded request: {exc.message}")
            continue
        hl = headers.get("inference-header-content-length")
        again = httpdecode.decode_request(b"".join(chunks), None if hl is None else int(hl), "", "")
        where = f"gRPC -> HTTP (binary={binary})"
        same_tensors(req.inputs, again.inputs, where, exact=binary)
        same_outputs(req.outputs, again.outputs, where)
        same_params(dict(req.parameters), dict(again.parameters), where)
        check(again.id == req.id, f"{where}: id differs")


def _check_response(data: bytes) -> None:
    try:
        resp = grpc_codec.decode_response(data)
    except GatewayError:
        return
    for typed in (False, True):
        again = grpc_codec.decode_response(grpc_codec.encode_response(resp, typed=typed))
        same_tensors(resp.outputs, again.outputs, f"gRPC response re-encoded (typed={typed})", exact=not typed)
    form = convert.AnswerForm(default_binary=True, overrides={}, accept_encoding=None)
    try:
        chunks, headers = convert.grpc_answer_to_http(data, form, "b")
    except GatewayError as exc:
        raise FuzzBug(f"a decodable response was refused on its way to HTTP: {exc}") from exc
    hl = headers.get("inference-header-content-length")
    back = httpdecode.decode_response(b"".join(chunks), None if hl is None else int(hl))
    same_tensors(resp.outputs, back.outputs, "gRPC -> HTTP response")


def one_input(data: bytes) -> None:
    msg = _parse(pb.ModelInferRequest, data)
    _check_routing(data, msg)
    _check_limits(data, msg)
    _check_request(data, msg)
    _check_response(data)
    trace = _parse(tx.TraceSettingRequest, data)
    try:
        changes = settings_change(data)
    except InvalidRequest:
        return
    if trace is not None and trace.settings:
        check(changes, "settings_change missed a TraceSettingRequest that sets something")


if __name__ == "__main__":
    run(one_input)
