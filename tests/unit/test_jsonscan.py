"""codec/jsonscan.py: the skeleton of any JSON text — the text with every ``"data"`` array's
contents left out — parses to the document with those arrays emptied, whatever the chunking,
strings, escapes and whitespace; and its depth agrees with a byte-by-byte reference.
(tests/unit/test_compiled.py: it runs compiled wherever the install compiles.)"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec.jsonscan import JsonScanner, skeleton
from tests.unit.test_jsondepth import fed, reference_max_depth


def emptied(value: object) -> object:
    """The reference: every member named "data" whose value is an array, emptied."""
    if isinstance(value, dict):
        return {k: [] if k == "data" and isinstance(v, list) else emptied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [emptied(v) for v in value]
    return value


leaves = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                   st.text(alphabet='[]{}"\\:, adt\n\u00e9', max_size=6))
keys = st.sampled_from(["data", "name", "shape", "d", "dat", "datas", "data ", "parameters", '"data"', "\\data"])
documents = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                         max_leaves=30)


@settings(max_examples=600)
@given(documents, st.lists(st.integers(1, 30), max_size=10), st.sampled_from([None, 2]), st.booleans(),
       st.booleans())
def test_the_skeleton_is_the_document_with_its_data_emptied(doc, cuts, indent, ascii_only, view):
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    scanner = fed(text, cuts, view=view)
    assert not scanner.exceeded
    assert json.loads(scanner.skeleton()) == emptied(doc)
    assert scanner.skeleton() == skeleton(text)


@settings(max_examples=400)
@given(documents, st.lists(st.integers(1, 30), max_size=10), st.integers(0, 8), st.booleans())
def test_depth_agrees_with_the_reference(doc, cuts, limit, view):
    text = json.dumps(doc).encode()
    assert fed(text, cuts, limit, view).exceeded == (reference_max_depth(text) > limit)


def test_a_request_keeps_everything_but_its_data():
    text = (b'{"id": "r1", "inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "FP32", '
            b'"parameters": {"data": [7]}, "data" :\n [[1.5, 2, 3], [4, 5, 6e7]]}, '
            b'{"name": "S", "shape": [2], "datatype": "BYTES", "data": ["a]\\"[", "}{"]}], '
            b'"outputs": [{"name": "OUTPUT0"}]}')
    for cut, view in [(c, v) for c in range(1, len(text)) for v in (False, True)]:
        assert fed(text, [cut], view=view).skeleton() == (
            b'{"id": "r1", "inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "FP32", '
            b'"parameters": {"data": []}, "data" :\n []}, '
            b'{"name": "S", "shape": [2], "datatype": "BYTES", "data": []}], '
            b'"outputs": [{"name": "OUTPUT0"}]}'), (cut, view)


@pytest.mark.parametrize("text", [
    b'{"data": "not an array", "x": [1]}',  # a data member that is no array stays
    b'{"name": "data", "x": [1, 2]}',  # "data" as a value is no member
    b'{"d\\u0061ta": [1, 2]}',  # spelled with an escape: kept (larger, never wrong)
])
def test_texts_kept_whole(text):
    assert skeleton(text) == text


def test_malformed_text_gives_some_skeleton_and_no_error():
    assert skeleton(b'{"inputs": [{"data": [1, 2}]') == b'{"inputs": [{"data": [}]'
    assert skeleton(b'"data": [1, 2, 3') == b'"data": ['


def test_a_large_body_is_scanned_without_its_data():
    data = json.dumps([float(i) / 7 for i in range(200_000)]).encode()
    text = b'{"inputs": [{"name": "x", "shape": [200000], "datatype": "FP64", "data": ' + data + b"}]}"
    assert skeleton(text) == b'{"inputs": [{"name": "x", "shape": [200000], "datatype": "FP64", "data": []}]}'
    deep = b'{"inputs": [{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    assert JsonScanner(64, True).feed(deep)


def test_a_view_is_scanned_in_place_however_long_its_structure():
    """A view's structure is stepped through in copies of growing stretches: a body of
    nothing but structure (no data arrays) longer than the largest stretch, and one with
    thousands of small tensors, give the skeleton the bytes give."""
    names = b", ".join(b'"k%d": {"name": "n%d", "shape": [1]}' % (i, i) for i in range(5_000))
    tensors = b", ".join(b'{"name": "t%d", "data": [%d, 2]}' % (i, i) for i in range(5_000))
    for text in (b"{" + names + b"}", b'{"inputs": [' + tensors + b"]}"):
        assert len(text) > 128 * 1024
        expected = skeleton(text)
        for cuts in ([], [70_000], [1, 65_536, 3]):
            assert fed(text, cuts, view=True).skeleton() == expected


@settings(max_examples=200)
@given(documents, st.lists(st.integers(1, 30), max_size=10), st.booleans())
def test_the_fallback_gives_the_same_skeleton_and_depth(doc, cuts, view):
    """The scan as a build without a C compiler runs it: bytes.find on a copy of each chunk."""
    import gateway.codec.jsonscan as jsonscan

    text = json.dumps(doc).encode()
    special, jsonscan._special = jsonscan._special, None
    try:
        scanner = fed(text, cuts, view=view)
        assert json.loads(scanner.skeleton()) == emptied(doc)
        assert fed(text, cuts, 3, view).exceeded == (reference_max_depth(text) > 3)
    finally:
        jsonscan._special = special
