"""codec/jsondepth.py and codec/jsonscan.py: JSON nesting depth without parsing, whole or in chunks, equal to a
byte-by-byte reference on any text (brackets in strings, escaped quotes, chunk edges)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec.jsondepth import InflatingScanner, too_deep
from gateway.codec.jsonscan import JsonScanner


def reference_max_depth(text: bytes) -> int:
    depth = best = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 92:
                escaped = True
            elif c == 34:
                in_string = False
        elif c == 34:
            in_string = True
        elif c == 92:
            return best  # a backslash outside a string: a parser stops here (syntax error)
        elif c in (91, 123):
            depth += 1
            best = max(best, depth)
        elif c in (93, 125):
            depth -= 1
    return best


def fed(text: bytes, cuts: list[int], limit: int = -1, view: bool = False) -> JsonScanner:
    """A scanner fed ``text`` in pieces of the sizes ``cuts``, then the rest: bytes, or
    (``view``) views of a larger buffer, as the listener's read buffers are scanned in place."""
    scanner = JsonScanner(limit, True)
    source: bytes | memoryview = text
    if view:
        padded = bytearray(b'"[{' + text + b'}]"\\')  # (bytes around it that must not be read)
        source = memoryview(padded)[3 : 3 + len(text)]
    pos = 0
    for size in cuts:
        scanner.feed(source[pos:pos + size])
        pos += size
    scanner.feed(source[pos:])
    return scanner


texts = st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b",", b":", b"\\\\", b'\\"']),
                 max_size=200).map(b"".join)


@settings(max_examples=500)
@given(texts, st.integers(0, 12), st.lists(st.integers(1, 40), max_size=8))
def test_never_below_the_reference_and_chunks_change_nothing(text, limit, cuts):
    """Any text: never less deep than a parser reads it (a backslash outside a string —
    invalid JSON, where a parser stops — may make the scan count more, never less); exact
    when backslashes stay inside strings (test_real_json); chunking changes nothing."""
    whole = too_deep(text, limit)
    if reference_max_depth(text) > limit:
        assert whole
    if b"\\" not in text:
        assert whole == (reference_max_depth(text) > limit)
    scanner = fed(text, cuts, limit)
    # too_deep skips the scan when there are few brackets; the scanner always scans.
    assert scanner.exceeded == whole or (not whole and text.count(b"[") + text.count(b"{") <= limit)


@given(st.recursive(st.one_of(st.integers(), st.text(alphabet='[]{}"\\ab', max_size=5)),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=20), st.integers(0, 6))
def test_real_json(value, limit):
    text = json.dumps(value).encode()
    assert too_deep(text, limit) == (reference_max_depth(text) > limit)


def test_the_crashing_body_and_a_legitimate_one():
    assert too_deep(b'{"inputs": [{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", 64)
    nested = json.dumps({"inputs": [{"name": "x", "shape": [2, 3, 4], "datatype": "FP32",
                                     "data": [[[1.0] * 4] * 3] * 2}]}).encode()
    assert not too_deep(nested, 8)
    assert not too_deep(json.dumps({"id": "[" * 500}).encode(), 4)  # brackets in a string are text


@settings(max_examples=200)
@given(texts, st.integers(0, 12), st.sampled_from(["gzip", "zlib", "raw"]), st.integers(1, 50))
def test_inflating_scanner_equals_the_plain_one(text, limit, form, step):
    import zlib

    if form == "gzip":
        data, coding = __import__("gzip").compress(text), "gzip"
    elif form == "zlib":
        data, coding = zlib.compress(text), "deflate"
    else:
        c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        data, coding = c.compress(text) + c.flush(), "deflate"
    plain = JsonScanner(limit, True)
    plain.feed(text)
    inflating = InflatingScanner(JsonScanner(limit, True), coding, None)
    for i in range(0, len(data), step):
        inflating.feed(data[i:i + step])
    assert inflating.exceeded == plain.exceeded
    if not plain.exceeded:  # (a scan past its limit stops where it is)
        assert inflating.scanner.skeleton() == plain.skeleton()


def test_inflating_scanner_stops_at_the_json_part():
    import gzip

    header = b'{"inputs": []}'
    body = gzip.compress(header + b"[" * 10_000)  # binary bytes that look like brackets
    s = InflatingScanner(JsonScanner(4, True), "gzip", len(header))
    s.feed(body)
    assert not s.exceeded and s.done and s.scanner.skeleton() == header
    s = InflatingScanner(JsonScanner(4, True), "gzip", None)
    s.feed(body)
    assert s.exceeded
