"""Finding ``sequence_id`` in gzip/deflate pass-through bodies, from whole bodies or prefixes."""
from __future__ import annotations

import gzip
import zlib

import orjson

from gateway.codec.content import inflate_prefix, sequence_of_compressed

HEADER = orjson.dumps({"parameters": {"sequence_id": 42, "sequence_start": True},
                       "inputs": [{"name": "I", "shape": [4096], "datatype": "UINT8",
                                   "parameters": {"binary_data_size": 4096}}]})
BODY = HEADER + bytes(range(256)) * 16
LIMIT = 1 << 20


def test_whole_bodies_every_encoding():
    raw_deflate = zlib.compressobj(wbits=-15)
    for packed in (gzip.compress(BODY), zlib.compress(BODY), raw_deflate.compress(BODY) + raw_deflate.flush()):
        assert sequence_of_compressed(packed, str(len(HEADER)), LIMIT) == "42"
    all_json = orjson.dumps({"parameters": {"sequence_id": "s-1"}, "inputs": []})
    assert sequence_of_compressed(gzip.compress(all_json), None, LIMIT) == "s-1"


def test_prefix_is_enough_for_the_json_part():
    packed = gzip.compress(BODY)
    cut = packed[: len(packed) // 2]  # the body is still arriving
    out = inflate_prefix(cut, len(HEADER))
    assert out == HEADER
    assert sequence_of_compressed(cut, str(len(HEADER)), LIMIT) == "42"


def test_no_sequence_or_not_compressed():
    assert sequence_of_compressed(gzip.compress(b'{"inputs": []}'), None, LIMIT) is None
    assert sequence_of_compressed(b"not compressed at all", None, LIMIT) is None
    assert inflate_prefix(b"\x00\x01garbage", 10) is None
