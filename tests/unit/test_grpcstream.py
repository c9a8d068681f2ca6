"""codec/grpcstream.py: a ModelInferRequest's head found, and its tail checked however it is
split, against protobuf's own serializer and parser."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec.grpcstream import TailWalker, head_end


def _request(raws: list[bytes], model: str = "m") -> bytes:
    r = pb.ModelInferRequest(model_name=model, model_version="2", id="x")
    r.parameters["sequence_id"].int64_param = 7
    for i, raw in enumerate(raws):
        t = r.inputs.add()
        t.name, t.datatype = f"IN{i}", "UINT8"
        t.shape.append(len(raw))
        r.raw_input_contents.append(raw)
    r.outputs.add().name = "OUT"
    return r.SerializeToString()


def _walk(tail: bytes, cuts: list[int]) -> tuple[str | None, TailWalker]:
    w = TailWalker(len(tail))
    pos = 0
    for cut in sorted({c % (len(tail) + 1) for c in cuts}) + [len(tail)]:
        err = w.feed(tail[pos:cut])
        if err is not None:
            return err, w
        pos = cut
    return None, w


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.lists(st.integers(0, 2000), max_size=12))
def test_a_serialized_request_splits_into_its_head_and_a_tail_that_passes(raws, cuts):
    message = _request(raws)
    at = head_end(message, 0, len(message))
    assert at > 0
    head = pb.ModelInferRequest.FromString(message[:at])
    assert head.model_name == "m" and head.parameters["sequence_id"].int64_param == 7 and not head.raw_input_contents
    assert len(head.inputs) == len(raws) and len(head.outputs) == 1
    err, w = _walk(message[at:], cuts)
    assert err is None and w.complete


def test_no_head_without_raw_contents_or_when_the_head_is_cut():
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add().contents.fp32_contents.extend([1.0, 2.0])
    message = r.SerializeToString()
    assert head_end(message, 0, len(message)) == -1
    message = _request([b"abc"])
    at = head_end(message, 0, len(message))
    assert head_end(message, 0, at - 1) == -1  # the head is not all there yet
    assert head_end(message, 0, at + 2) == at  # its tag and length there


@given(st.integers(1, 6), st.lists(st.integers(0, 200), max_size=6))
def test_a_routing_field_after_the_raw_contents_is_refused(fnum, cuts):
    message = _request([b"x" * 100])
    at = head_end(message, 0, len(message))
    tail = message[at:] + bytes([fnum << 3 | 2, 3]) + b"zzz"
    err, _ = _walk(tail, cuts)
    assert err is not None and f"field {fnum} of ModelInferRequest follows raw_input_contents" in err


@given(st.lists(st.integers(0, 200), max_size=6))
def test_unknown_fields_after_the_raw_contents_pass(cuts):
    message = _request([b"x" * 100])
    at = head_end(message, 0, len(message))
    tail = message[at:] + bytes([9 << 3 | 0, 0x96, 0x01]) + bytes([10 << 3 | 1]) + b"8bytes!!" + \
        bytes([11 << 3 | 5]) + b"4byt" + bytes([12 << 3 | 2, 2]) + b"ok"
    assert pb.ModelInferRequest.FromString(message + tail[len(message) - at:]).model_name == "m"
    err, w = _walk(tail, cuts)
    assert err is None and w.complete


def test_a_field_past_the_end_or_cut_short_or_malformed_is_refused():
    message = _request([b"x" * 100])
    at = head_end(message, 0, len(message))
    tail = message[at:]
    # a length running past the message
    w = TailWalker(len(tail) - 1)
    assert w.feed(tail[:-1]) == "a field of the request message runs past its end"
    # more bytes than the prefix said
    assert TailWalker(3).feed(b"abcd") is not None
    # a header cut by the message's end
    w = TailWalker(len(tail) + 1)
    assert w.feed(tail + bytes([7 << 3 | 2])) == "a field of the request message is cut short"
    # a group, and an overlong varint
    assert "malformed" in (TailWalker(2).feed(bytes([8 << 3 | 3, 0])) or "")
    assert "malformed" in (TailWalker(12).feed(bytes([8 << 3 | 0]) + b"\xff" * 11) or "")


def test_the_prefix_does_not_confuse_the_head():
    message = _request([b"abc"])
    framed = struct.pack(">BI", 0, len(message)) + message
    assert head_end(framed, 5, len(framed)) == 5 + head_end(message, 0, len(message))
