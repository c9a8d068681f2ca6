"""The backend client's answer framing (gateway/backends/h1/connection.py, issue 35) against h11.

Random answers for one connection — interim 1xx, 101, final answers of HTTP/1.0 and 1.1 framed by
Content-Length (right, wrong, repeated, conflicting, not a number), chunked (valid and invalid
sizes, extensions, trailers) or the connection's end; Connection: close / keep-alive; junk
headers; bytes after the answer; EOF — cut into random reads and fed to the client's protocol
(tests/support/h1drive.py) and to h11 as a client. Both must deliver the same final status,
headers and body, or both refuse; and agree whether the connection can carry another exchange.

Where h11 and the contract disagree by design, the generator leaves that case out (each place
says why: ``# h11 differs``) and a test of its own below holds the client to the contract.
"""
from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.backends.h1 import framing as framing_module
from gateway.backends.h1.errors import BadAnswer, ConnectionDropped
from gateway.backends.h1.limits import MAX_INTERIM, AnswerLimits
from tests.support.h1drive import Outcome, Reference, drive, h11_answers

# ------------------------------------------------------------------------------ the generator
_REASONS = [b"OK", b"Not Found", b"", b"Whatever it says", b"\xe9t\xe9"]
_FINAL = [200, 201, 204, 304, 400, 404, 500, 503]
_INTERIM = [100, 102, 103]
_PLAIN_HEADERS = [
    (b"Content-Type", b"application/json"), (b"Server", b"triton"), (b"X-Request-Id", b"a b\tc"),
    (b"date", b"Tue, 25 Nov 2026 10:00:00 GMT"), (b"X-Empty", b""), (b"X-Obs", b"caf\xe9"),
    (b"Keep-Alive", b"timeout=5"), (b"X-Dup", b"1"), (b"x-dup", b"2"),
]
# Header lines both readers refuse (h11: its header-field regex; llhttp: strict mode).
_BAD_LINES = [b"NoColon", b"Bad Name: x", b": no-name", b"X-Nul: a\x00b", b"X-Cr: a\rb", b"(x): y"]
# Content-Length values that are no Content-Length (h11: [0-9]+; llhttp: digits only).
_BAD_LENGTHS = [b"abc", b"-1", b"+5", b"0x5", b"5 5", b"1.0", b"\xb2", b"99999999999999999999999"]
# Chunk-size lines both refuse.
_BAD_SIZES = [b"g", b"", b"-1", b"0x5", b" 5", b"+5", b"ffffffffffffffffff1"]
_TRAILERS = [b"", b"", b"", b"X-Checksum: 1\r\n", b"Content-Type: text/evil\r\n"]


@dataclass
class Answer:
    data: bytes
    fault: str  # "none", or the one fault in it (_FAULTS)


def _status_line(version: bytes, status: int, reason: bytes) -> bytes:
    return b"HTTP/" + version + b" " + str(status).encode() + (b" " + reason if reason or status % 2 else b"") + b"\r\n"


@st.composite
def _chunked(draw: st.DrawFn, body: bytes, faulty: bool) -> bytes:
    """A chunked body carrying ``body``; with ``faulty``, one fault both readers refuse."""
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if b > a]
    out = b""
    bad = draw(st.integers(0, len(pieces) + 1)) if faulty else -1  # which chunk (or the end) is bad
    for i, piece in enumerate(pieces):
        size = b"%x" % len(piece)
        fault = draw(st.sampled_from([0, 4])) if i == bad else draw(st.sampled_from([1, 2, 3, 9, 9, 9, 9, 9, 9]))
        if fault == 0:
            size = draw(st.sampled_from(_BAD_SIZES))
        elif fault == 1:
            size = b"%X" % len(piece)  # upper-case hex: valid
        elif fault == 2:
            size = b"00" + size  # leading zeros: valid
        elif fault == 3:
            size += draw(st.sampled_from([b";a=b", b';name="quoted value"', b";x"]))  # valid extensions
        elif fault == 4:
            # A size that lies. (Never 0, which would make the chunk's data the trailer section,
            # where h11 takes a bare LF as its end: h11 differs, see the head's bare LF.)
            size = b"%x" % max(1, len(piece) + draw(st.sampled_from([-1, 1, 2])))
            if size == b"%x" % len(piece):
                size = b"%x" % (len(piece) + 1)
        # h11 differs: it takes any chunk extension (";.*") and whitespace before the CRLF, which
        # llhttp's strict mode refuses — so no invalid extension (";", "; a", ";a=\x01") and no
        # "5 \r\n" here; test_invalid_chunk_extensions_are_refused holds the client to them.
        out += size + b"\r\n" + piece + b"\r\n"
    if bad == len(pieces):
        out += draw(st.sampled_from([b"0\r\nBad Trailer\r\n\r\n", b"0\r\n\r\r\n", b"0\r\nX: 1\r\nx\r\n"]))
        return out
    out += draw(st.sampled_from([b"0", b"0", b"000", b"0;last=1"])) + b"\r\n"
    return out + draw(st.sampled_from(_TRAILERS)) + b"\r\n"


# One fault at most per answer, most answers none (so that runs of several exchanges happen).
_FAULTS = ["none"] * 14 + ["length_short", "length_long", "length_bad", "length_conflict", "coding", "chunk",
                           "status_line", "header_line", "upgrade", "trailing", "cut", "cut"]


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    fault = draw(st.sampled_from(_FAULTS))
    data = b""
    # Interim answers: at most MAX_INTERIM (h11 differs: it reads any number; the limit has a
    # test of its own, test_interim_answers_over_the_limit_are_refused).
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, MAX_INTERIM]))):
        status = draw(st.sampled_from(_INTERIM))
        data += _status_line(b"1.1", status, b"Continue")
        if draw(st.booleans()):
            data += b"Link: </style.css>; rel=preload\r\n"
        data += b"\r\n"
    if fault == "upgrade":
        data += b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.1", b"1.0"]))
    status = draw(st.sampled_from(_FINAL))
    if fault == "status_line":
        line = draw(st.sampled_from([b"HTTP/1.1 20 OK\r\n", b"HTTP/1.1 2000 OK\r\n", b"HTTP/1.1 abc OK\r\n",
                                     b"HTP/1.1 200 OK\r\n", b"HTTP/1.1\t200 OK\r\n", b"ICY 200 OK\r\n",
                                     b"HTTP/1.1  200 OK\r\n", b"http/1.1 200 OK\r\n", b"HTTP/1.1 099 OK\r\n"]))
    else:
        line = _status_line(version, status, draw(st.sampled_from(_REASONS)))
    headers: list[tuple[bytes, bytes | None]] = list(draw(st.lists(st.sampled_from(_PLAIN_HEADERS), max_size=4)))
    connection = draw(st.sampled_from([None, None, None, None, b"close", b"keep-alive", b"Keep-Alive",
                                       b"close, x-foo"]))
    if connection is not None:
        # h11 differs: an HTTP/1.0 answer is never kept alive by h11 (``Connection: keep-alive``
        # or not), while llhttp keeps one that asks for it and has a length. What the client
        # does there is test_http10_keep_alive's; here 1.0 goes without a keep-alive token.
        if version == b"1.0" and b"keep" in connection.lower():
            connection = b"close"
        headers.append((b"Connection", connection))
    body = draw(st.binary(max_size=48))
    framing = draw(st.sampled_from(["length", "length", "length", "chunked", "chunked", "close"]))
    if fault in ("length_short", "length_long", "length_bad", "length_conflict"):
        framing = "length"
    elif fault in ("coding", "chunk"):
        framing = "chunked"
    no_body = status in (204, 304)
    if framing == "length":
        length = str(len(body)).encode()
        if fault == "length_short":  # the body runs past its length: bytes after the answer
            length = str(max(0, len(body) - draw(st.integers(1, 3)))).encode()
        elif fault == "length_long":  # the body is short of its length: EOF or more bytes wait
            length = str(len(body) + draw(st.integers(1, 4))).encode()
        elif fault == "length_bad":
            length = draw(st.sampled_from(_BAD_LENGTHS))
        headers.append((b"Content-Length", length))
        if fault == "length_conflict":
            # two differing Content-Lengths: both refuse. (h11 differs on a repeated *equal*
            # one, which it merges and llhttp refuses: test_repeated_content_length.)
            headers.append((b"Content-Length", str(len(body) + 1).encode()))
        if no_body:
            body = b""
    elif framing == "chunked":
        coding = b"chunked"
        if fault == "coding":
            coding = draw(st.sampled_from([b"gzip", b"identity", b"chunked, gzip", b"chunked;q=1", b"x"]))
        else:
            coding = draw(st.sampled_from([b"chunked", b"chunked", b"Chunked", b"CHUNKED"]))
        # h11 differs: it takes only the one coding "chunked", where the contract (RFC 9112
        # section 6.3) reads a Transfer-Encoding whose *final* coding is chunked ("gzip, chunked");
        # and h11 lets Transfer-Encoding beat a Content-Length beside it, which the contract
        # refuses. Both have their own tests (test_final_coding_chunked, test_length_and_chunked).
        headers.append((b"Transfer-Encoding", coding))
        body = b"" if no_body else draw(_chunked(body, fault == "chunk"))
    elif no_body:
        body = b""
    if fault == "header_line":
        headers.insert(draw(st.integers(0, len(headers))), (draw(st.sampled_from(_BAD_LINES)), None))
    # h11 differs: it folds an obs-fold continuation line into the previous header and takes a
    # bare LF as a line end; llhttp's strict mode refuses both. Neither is generated here:
    # test_obs_fold_and_bare_lf_are_refused.
    head = line + b"".join(n + (b": " + v if v is not None else b"") + b"\r\n" for n, v in headers) + b"\r\n"
    data += head + body
    if fault == "trailing":
        # (Not a lone CRLF: llhttp skips empty lines before a status line, as http-parser in
        # Envoy does, where h11 and nginx refuse them; test_empty_lines_around_an_answer.)
        data += draw(st.sampled_from([b"x", b"\r\nx", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]))
    if fault == "cut":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return Answer(data, fault)


_SIZES = st.lists(st.integers(1, 80), min_size=1, max_size=4)


# ------------------------------------------------------------------------------ the comparison
def _norm_headers(headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in headers.items():
        if k == "content-length":
            v = ",".join(sorted({p.strip() for p in v.split(",")}))
        elif k == "transfer-encoding":
            v = v.lower()
        out[k] = v
    return out


def _contract(out: Outcome) -> None:
    """What holds of every outcome, whatever h11 says."""
    assert not out.violations, out.violations
    if out.kind == "refused":
        assert isinstance(out.error, (BadAnswer, ConnectionDropped)), repr(out.error)
        assert out.closed, "a refusal must close the connection"


def _compare(outs: list[Outcome], refs: list[Reference], answers: list[Answer]) -> None:
    for i, (out, ref) in enumerate(zip(outs, refs)):
        _contract(out)
        where = f"exchange {i}: ours {out!r}\nh11 {ref!r}"
        if ref.kind == "pending" and out.kind == "refused" and answers[i].fault not in ("none", "cut"):
            # h11 judges a head or chunk line only once it is whole; llhttp refuses a bad byte
            # as it comes. Never so for a prefix of a valid answer (fault "cut").
            assert isinstance(out.error, BadAnswer), where
            continue
        assert out.kind == ref.kind, where
        if ref.kind == "answer":
            assert out.status == ref.status, where
            assert out.body == ref.body, where
            assert ref.headers is not None and out.headers is not None
            assert _norm_headers(out.headers) == _norm_headers(ref.headers), where
            assert out.reusable == ref.reusable, where
    assert len(outs) == len(refs), f"ours ran {len(outs)} exchanges, h11 {len(refs)}:\n{outs}\n{refs}"


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(exchanges=st.lists(answers(), min_size=1, max_size=3), sizes=_SIZES, eof=st.booleans(),
       stream=st.sampled_from([None, None, None, 1, 16]))
def test_same_answers_as_h11(exchanges: list[Answer], sizes: list[int], eof: bool, stream: int | None) -> None:
    data = [a.data for a in exchanges]
    refs = h11_answers(data, eof=eof)
    outs = drive(data, sizes=sizes, eof=eof, stream_min=stream).outcomes
    _compare(outs, refs, exchanges)


# ------------------------------------------------------------------------------ the contract alone
# Where h11 is no reference (it is more lenient or stricter by design, or has no such limit).
OK2 = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
_SPLITS = [[1], [3, 7], [4096]]


def _one(data: bytes, sizes: list[int], eof: bool = True, **kw: object) -> Outcome:
    outs = drive([data], sizes=sizes, eof=eof, **kw).outcomes  # type: ignore[arg-type]
    assert len(outs) == 1
    _contract(outs[0])
    return outs[0]


def _refused(out: Outcome, kind: str = BadAnswer.FRAMING) -> None:
    assert out.kind == "refused" and isinstance(out.error, BadAnswer) and out.error.kind == kind, out
    assert out.closed


@pytest.mark.parametrize("sizes", _SPLITS)
def test_interim_answers_over_the_limit_are_refused(sizes: list[int]) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\n\r\n"
    heads = b"".join(interim[i % 3] for i in range(MAX_INTERIM))
    out = _one(heads + OK2, sizes, eof=False)
    assert (out.kind, out.status, out.body, out.reusable) == ("answer", 200, b"hi", True)
    _refused(_one(heads + interim[0] + OK2, sizes, eof=False))


@pytest.mark.parametrize("sizes", _SPLITS)
def test_101_is_refused(sizes: list[int]) -> None:
    _refused(_one(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n" + OK2, sizes))


@pytest.mark.parametrize("status", [b"000", b"099", b"001"])
def test_status_under_100_is_refused(status: bytes) -> None:
    """A status under 100 is no interim answer (RFC 9110 section 15: 100-599; nginx refuses a
    status line whose code starts with 0): dropping it as one lets the next answer through."""
    _refused(_one(b"HTTP/1.1 " + status + b" Odd\r\n\r\n" + OK2, [4096], eof=False))


def test_trailers_are_not_headers() -> None:
    """A chunked answer's trailer fields never replace or join its header fields (RFC 9110
    section 6.5.1: not merged unless the field's definition allows it)."""
    out = _one(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"2\r\n{}\r\n0\r\nContent-Type: text/evil\r\nX-Checksum: 1\r\n\r\n", [4096], eof=False)
    assert out.kind == "answer" and out.body == b"{}"
    assert out.headers == {"content-type": "application/json", "transfer-encoding": "chunked"}


@pytest.mark.parametrize("sizes", [[4096], [39], [38, 1], [1]])
@pytest.mark.parametrize("after", [b"\r\n", b"\n", b"\r\n\r\n"], ids=["crlf", "lf", "two"])
def test_empty_lines_after_an_answer_poison_it(sizes: list[int], after: bytes) -> None:
    """Bytes after a complete answer, an empty line included, poison the connection whether they
    come in the answer's read or a later one. (llhttp skips empty lines before a status line,
    as http-parser in Envoy does; h11 and nginx refuse them: the generator sends none.)"""
    out = _one(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" + after, sizes, eof=False)
    assert out.kind == "answer" and out.closed and not out.reusable


@pytest.mark.parametrize("sizes", _SPLITS)
@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
], ids=["length-first", "coding-first"])
def test_length_and_chunked(data: bytes, sizes: list[int]) -> None:
    """h11 differs: Transfer-Encoding beats Content-Length there (RFC 9112 section 6.3 rule 3's
    fallback); the contract, nginx and Envoy refuse the pair (a request-smuggling shape)."""
    _refused(_one(data, sizes))


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nhi",
], ids=["two-lines", "list"])
def test_repeated_content_length(data: bytes) -> None:
    """h11 differs: it merges Content-Lengths that repeat one value (RFC 9110 section 8.6 allows
    either); llhttp's strict mode refuses them, and so does the client."""
    _refused(_one(data, [4096]))


def test_only_chunked_alone() -> None:
    """A coding before chunked ("gzip, chunked") would reach the client still applied: the client
    removes no transfer coding, so it reads chunked alone, as h11 and nginx do."""
    _refused(_one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", [4096],
                  eof=False))


@pytest.mark.parametrize("codings", [(b"identity", b"chunked"), (b"chunked", b"chunked"), (b"chunked", b"gzip")])
def test_transfer_encoding_on_two_lines_is_refused(codings: tuple[bytes, bytes]) -> None:
    """Transfer-Encoding on two lines is one list (RFC 9110 section 5.3): "identity, chunked" is
    no coding the client reads and "chunked, chunked" chunks twice; h11 and nginx refuse a
    second Transfer-Encoding line. The client judged only the last line's value."""
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"Transfer-Encoding: " + c + b"\r\n" for c in codings) + b"\r\n"
    _refused(_one(head + b"2\r\nhi\r\n0\r\n\r\n", [4096], eof=False))


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nX-A: a\r\n  b\r\nContent-Length: 2\r\n\r\nhi",  # obs-fold
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",  # bare LF
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nhi",
    b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\nhi",  # a control character
], ids=["obs-fold", "bare-lf", "one-bare-lf", "ctl"])
def test_obs_fold_and_bare_lf_are_refused(data: bytes) -> None:
    """h11 differs: it folds obs-fold lines, takes a bare LF as a line end and any byte but NUL
    in a value. The contract (llhttp's strict mode) refuses them."""
    _refused(_one(data, [4096]))


@pytest.mark.parametrize("line", [b"2;", b"2; a=b", b"2;a=\x01", b"2 ", b"2\t"])
def test_invalid_chunk_extensions_are_refused(line: bytes) -> None:
    """h11 differs: it takes anything after ";" and whitespace before the CRLF of a chunk-size
    line."""
    _refused(_one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + line + b"\r\nhi\r\n0\r\n\r\n", [4096]))


def test_http10_keep_alive() -> None:
    """h11 differs: it never reuses a connection after an HTTP/1.0 answer (nor does nginx: an
    upstream's HTTP/1.0 answer closes its connection). llhttp, and so the client, keep one that
    says ``Connection: keep-alive`` and has a length. Either is within RFC 9112 section 9.3;
    this pins what the client does, so that a change is a decision."""
    out = _one(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi", [4096], eof=False)
    assert (out.kind, out.body, out.reusable) == ("answer", b"hi", True)
    out = _one(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", [4096], eof=False)
    assert (out.kind, out.body, out.reusable) == ("answer", b"hi", False)


@pytest.mark.parametrize("sizes", _SPLITS)
def test_close_delimited_answers_end_at_eof(sizes: list[int]) -> None:
    for data in (b"HTTP/1.0 200 OK\r\n\r\nto the end", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
                 b"HTTP/1.1 500 Oops\r\n\r\nto the end"):
        assert _one(data, sizes, eof=False).kind == "pending"
        out = _one(data, sizes)
        assert (out.kind, out.body, out.reusable) == ("answer", b"to the end", False)


@pytest.mark.parametrize("data,before", [(b"", True), (b"H", False), (b"HTTP/1.1 200 OK\r\n", False),
                                         (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", False),
                                         (b"HTTP/1.1 100 Continue\r\n\r\n", False),
                                         (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n", False)])
def test_eof_before_a_complete_answer(data: bytes, before: bool) -> None:
    out = _one(data, [3])
    assert isinstance(out.error, ConnectionDropped) and out.error.before_response is before, out


def test_bytes_while_no_exchange_is_under_way_close_the_connection() -> None:
    run = drive([OK2, OK2], idle=[b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], eof=False)
    assert [o.kind for o in run.outcomes] == ["answer"] and run.connection.closed and run.transport.closing


_LIMITS = AnswerLimits(max_header_count=3, max_head_bytes=1024, max_body_bytes=10)


@pytest.mark.parametrize("sizes", _SPLITS)
def test_header_count_and_body_limits(sizes: list[int]) -> None:
    ok = _one(b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nContent-Length: 10\r\n\r\n0123456789", sizes, limits=_LIMITS)
    assert (ok.kind, ok.body) == ("answer", b"0123456789")
    _refused(_one(b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", sizes, limits=_LIMITS),
             BadAnswer.TOO_LARGE)
    for stream in (None, 1):
        # (a Content-Length over the limit is refused at the head, before any of its body came)
        _refused(_one(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", sizes, eof=False, limits=_LIMITS,
                      stream_min=stream), BadAnswer.TOO_LARGE)
    _refused(_one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n012345\r\n5\r\n01234\r\n0\r\n\r\n",
                  sizes, limits=_LIMITS), BadAnswer.TOO_LARGE)
    _refused(_one(b"HTTP/1.1 200 OK\r\n\r\n01234567890", sizes, limits=_LIMITS), BadAnswer.TOO_LARGE)


@pytest.mark.parametrize("sizes", _SPLITS)
def test_head_limit(sizes: list[int]) -> None:
    """The head limit counts the bytes of the status line and headers, interim heads included,
    however the reads fall (a head that arrives in one read too)."""
    under = b"HTTP/1.1 200 OK\r\nX: " + b"a" * 900 + b"\r\nContent-Length: 0\r\n\r\n"
    assert _one(under, sizes, eof=False, limits=_LIMITS).kind == "answer"
    over = b"HTTP/1.1 200 OK\r\nX: " + b"a" * 1100 + b"\r\nContent-Length: 0\r\n\r\n"
    _refused(_one(over, sizes, eof=False, limits=_LIMITS), BadAnswer.TOO_LARGE)
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"a" * 600 + b"\r\n\r\n"
    _refused(_one(interim + b"HTTP/1.1 200 OK\r\nX: " + b"a" * 600 + b"\r\nContent-Length: 0\r\n\r\n", sizes,
                  eof=False, limits=_LIMITS), BadAnswer.TOO_LARGE)


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            return next((int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":")), None)
    except OSError:
        return None


def test_a_claimed_length_is_not_an_allocation() -> None:
    """Memory grows with the bytes that arrived, never with a Content-Length's claim. With
    gateway/_fill.c the answer's bytes object is made at the claimed size but left
    uninitialised: address space, not memory — its pages become resident only as bytes are
    written, so what is measured is the resident peak (VmHWM); without it, the growing buffer's
    allocations themselves (tracemalloc)."""
    limits = AnswerLimits(max_body_bytes=1 << 30)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 900000000\r\n\r\n" + b"x" * 1000
    if framing_module._reserve is not None:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # (VmHWM := VmRSS)
        except OSError:
            pytest.skip("the kernel does not reset this process's peak RSS")
        base = _status_bytes("VmRSS")
        out = _one(answer, [4096], limits=limits)
        peak = _status_bytes("VmHWM")
        assert base is not None and peak is not None
        grown = peak - base
    else:
        tracemalloc.start()
        try:
            out = _one(answer, [4096], limits=limits)
            _size, grown = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert isinstance(out.error, ConnectionDropped)
    assert grown < 4 << 20, f"{grown} bytes at the peak for 1000 bytes of a 900 MB claim"
