"""Repository index answers (codec/repository.py): Triton JSON, gRPC wire form, malformed input."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.codec import repository
from gateway.codec.repository import IndexEntry, encode_index_pb
from gateway.codec.wire import encode_len_field, encode_varint
from gateway.errors import InvalidRequest


def parse_index_json(body):  # (name, version, ready): what readiness uses
    return [tuple(e[:3]) for e in repository.parse_index_json(body)]


def parse_index_pb(message):
    return [tuple(e[:3]) for e in repository.parse_index_pb(message)]


def string_field(fnum: int, text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return encode_len_field(fnum, len(data)) + data


def model_index(name: str | bytes = "", version: str = "", state: str = "", reason: str = "") -> bytes:
    """One ``ModelIndex`` (name 1, version 2, state 3, reason 4); empty strings left out as proto3 does."""
    body = b"".join(string_field(f, v) for f, v in ((1, name), (2, version), (3, state), (4, reason)) if v)
    return string_field(1, body)  # RepositoryIndexResponse.models = 1


TRITON_JSON = orjson.dumps([
    {"name": "ready", "version": "1", "state": "READY"},
    {"name": "loading", "version": "2", "state": "LOADING"},
    {"name": "gone", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
    {"name": "never_loaded"},
    {"name": "int_version", "version": 3, "state": "READY"},
    {"name": "null_version", "version": None, "state": "READY"},
])


def test_triton_json_index():
    assert parse_index_json(TRITON_JSON) == [
        ("ready", "1", True),
        ("loading", "2", False),
        ("gone", "1", False),
        ("never_loaded", "", False),
        ("int_version", "3", True),
        ("null_version", "", True),
    ]
    assert parse_index_json(bytearray(b"[]")) == []


def test_mlserver_state_spelling():
    assert parse_index_json(b'[{"name": "m", "state": "State.READY"}]') == [("m", "", True)]
    assert parse_index_pb(model_index("m", "", "State.READY")) == [("m", "", True)]
    assert parse_index_json(b'[{"name": "m", "state": "ready"}]') == [("m", "", False)]  # exact spelling only


def test_grpc_wire_index():
    message = (model_index("a", "1", "READY")
               + model_index("b", "", "LOADING", reason="loading weights")
               + model_index("c")
               + encode_varint((2 << 3) | 0) + encode_varint(7))  # an unknown top-level field: skipped
    assert parse_index_pb(message) == [("a", "1", True), ("b", "", False), ("c", "", False)]
    assert parse_index_pb(b"") == []


def test_grpc_wire_last_occurrence_of_a_field_wins():
    body = string_field(1, "old") + string_field(3, "LOADING") + string_field(1, "new") + string_field(3, "READY")
    assert parse_index_pb(string_field(1, body)) == [("new", "", True)]


@pytest.mark.parametrize(
    "body",
    [b"<html>oops</html>", b"", b'{"name": "m"}', b'"READY"', b'[{"version": "1"}]', b'[{"name": 5}]',
     b'["m"]', b"[null]"],
    ids=["not-json", "empty", "object", "string", "no-name", "name-not-string", "bare-string", "null-entry"],
)
def test_malformed_json_index(body):
    with pytest.raises(InvalidRequest):
        parse_index_json(body)


@pytest.mark.parametrize(
    "message",
    [
        model_index("a", "1", "READY")[:-2],  # truncated in the middle of an entry
        encode_len_field(1, 50) + b"short",  # length beyond the message
        b"\x0a",  # a key without its length
        string_field(1, b"\xff"),  # an entry whose own fields are garbage
        model_index(version="1", state="READY"),  # an entry without a name
        model_index(b"\xff\xfe"),  # a name that is not UTF-8
    ],
    ids=["truncated", "overrun", "key-only", "garbage-entry", "no-name", "bad-utf8"],
)
def test_malformed_wire_index(message):
    with pytest.raises(InvalidRequest):
        parse_index_pb(message)


STATES = st.one_of(st.sampled_from(["READY", "State.READY", "LOADING", "UNAVAILABLE", "UNLOADING", ""]), st.text())
ENTRIES = st.lists(st.tuples(st.text(min_size=1), st.text(), STATES, st.text()), max_size=8)


@given(ENTRIES)
def test_both_forms_parse_back_equal(entries):
    expected = [(name, version, state in ("READY", "State.READY")) for name, version, state, _ in entries]
    as_json = orjson.dumps([{"name": n, "version": v, "state": s, "reason": r} for n, v, s, r in entries])
    as_pb = b"".join(model_index(n, v, s, r) for n, v, s, r in entries)
    assert parse_index_json(as_json) == expected
    assert parse_index_pb(as_pb) == expected


def test_state_and_reason_kept_and_encoded_back():
    body = b'[{"name":"a","version":"1","state":"UNAVAILABLE","reason":"unloaded"}]'
    (entry,) = repository.parse_index_json(body)
    assert entry == IndexEntry("a", "1", False, "UNAVAILABLE", "unloaded")
    assert repository.parse_index_pb(encode_index_pb([entry])) == [entry]
    assert repository.index_request_ready(b"\x10\x01") and not repository.index_request_ready(b"")
