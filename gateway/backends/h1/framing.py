"""How a connection frames one answer: httptools' callbacks over llhttp's strict mode, the
answer's limits, and where its body goes — whole (joined, or written into its final bytes as it
arrives) or streamed (``BodyStream``). The reads themselves are ``reader.py``'s.

The backend is untrusted input, and the framing is as strict as nginx's and Envoy's (RFC 9112
section 6, RFC 9110 section 15.2):

- a connection carries one exchange at a time; interim answers (1xx but 101) are read and
  dropped, at most ``MAX_INTERIM`` of them; a 101 is refused (the client never asks to upgrade);
- an answer with neither Content-Length nor chunked framing is read to the connection's end
  (close-delimited: HTTP/1.0, or ``Connection: close`` without a length) and is complete there;
- conflicting or invalid framing (two Content-Lengths, Content-Length with Transfer-Encoding, a
  Transfer-Encoding other than chunked, a bad chunk) is refused (llhttp's strict mode does most
  of it), as is a head or body over ``AnswerLimits``. A Content-Length is a claim, not an
  allocation: the memory of a whole body is taken as its bytes arrive (``gateway/_fill.c``: the
  answer's bytes object made at the claimed size, uninitialised, its pages taken as they are
  written; without the C helper, a buffer grown with what arrives).
Every refusal is a :class:`BadAnswer` and closes the connection.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ...malloc import large_answer
from .answer import BodyStream, H1Response
from .errors import BadAnswer
from .limits import MAX_INTERIM
from .link import Link

__all__ = ["FIRST_BUF", "AnswerFraming", "window_of"]

# A whole body above this size is written, piece by piece as it arrives, into its final bytes
# object, made at the claimed size and left uninitialised (gateway/_fill.c): one copy of each
# byte, the answer held once, and a backend that lies about its length makes the gateway hold
# only what it sent (pages become memory as they are written). Below it the pieces are joined
# (a small answer usually comes in one piece: no copy at all).
_WHOLE_MIN: Final = 64 * 1024
_reserve: Callable[[int], bytes] | None
_put: Callable[[bytes, int, bytes], int] | None
window_of: Callable[[bytes, int], memoryview] | None
try:
    from ..._fill import put as _put
    from ..._fill import reserve as _reserve
    from ..._fill import window as window_of
except ImportError:  # built without a C compiler (setup.py): the growing buffer below
    _reserve = _put = window_of = None
# (``window_of``: the reads write the rest of a large whole answer straight into its bytes.)
# Without the C helper: a buffer that starts this large and grows 4-fold as bytes arrive, never
# past the claim (bytearray(n) writes all n bytes, so it cannot be sized by the claim): a backend
# that lies makes the gateway hold at most ~4 x what it really sent; an honest 16 MB answer costs
# two extra copies of 1 and 4 MiB. (Also the size past which an answer counts as large for the
# allocator's idle trim, malloc.large_answer.)
FIRST_BUF = 1 << 20
_GROWTH = 4


class _Poisoned(Exception):
    """Raised from the parser's message-begin callback to stop it: bytes after the answer."""


class AnswerFraming(Link):
    """The parser's callbacks of a connection's answers (see the module's docstring); a
    refusal raised from one is kept (``_held``) for the reads to refuse the answer with."""

    __slots__ = ()

    def _held(self, exc: BadAnswer) -> BadAnswer:
        """``exc``, kept as this answer's refusal: raised from a parser callback, it stops the
        parser, and data_received refuses the answer with it."""
        self._refusal = exc
        return exc

    def on_message_begin(self) -> None:
        if self._complete or (self._fut is None and self._on_end is None):
            self._poisoned = True
            raise _Poisoned()
        self._headers = {}
        self._header_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._max_headers:
            raise self._held(BadAnswer(f"answer head over max_answer_header_count ({self._max_headers})",
                                       kind=BadAnswer.TOO_LARGE))
        if self._in_body:
            return  # a trailer field: never merged into the head (RFC 9110 section 6.5.1)
        key = name.decode("latin-1").lower()
        if key == "transfer-encoding" and key in self._headers:
            # A second line could make "chunked" twice, or hide a coding (nginx refuses it too).
            raise self._held(BadAnswer("Transfer-Encoding given twice", kind=BadAnswer.FRAMING))
        self._headers[key] = value.decode("latin-1")

    def on_chunk_header(self) -> None:
        self._chunk_open = True
        self._chunk_at = self._body_len

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def on_headers_complete(self) -> None:
        status = self._status = self._parser.get_status_code()
        if status < 200:
            if status < 100:
                raise self._held(BadAnswer(f"status {status:03d} (a status is 100 to 599)",
                                           kind=BadAnswer.FRAMING))
            if status == 101:
                raise self._held(BadAnswer("a 101 (protocol switch) answer: the gateway asked for no upgrade",
                                           kind=BadAnswer.FRAMING))
            # Interim (RFC 9110 section 15.2): read and dropped; the final answer follows.
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise self._held(BadAnswer(f"more than {MAX_INTERIM} interim (1xx) answers",
                                           kind=BadAnswer.FRAMING))
            self._interim_now = True
            return
        self._in_body = True
        parts = self._parts
        if parts is not None and status < 300:
            self._parts = None
            parts.clear()  # (the request's pieces: see Link._parts)
        headers = self._headers
        length = headers.get("content-length", "")
        sized = length.isascii() and length.isdigit()  # not str.isdigit() alone: it takes "²"
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # Only chunked alone: another coding would reach the client still applied (the
            # gateway removes none), and one not ending in chunked would be read to the end
            # (RFC 9112 section 6.3 rule 4). nginx refuses both.
            raise self._held(BadAnswer(f"Transfer-Encoding {coding!r} (only chunked is read)",
                                       kind=BadAnswer.FRAMING))
        claim = int(length) if sized else 0
        if claim > self._max_body:
            raise self._held(BadAnswer(f"answer of {claim} bytes (Content-Length) over {self._limit_name()}",
                                       kind=BadAnswer.TOO_LARGE))
        self._eof_body = not sized and coding is None and status not in (204, 304)
        if (self._stream_min is not None and sized and claim >= self._stream_min) or \
                (self._stream_unsized and not sized):
            self._stream = BodyStream(self, claim if sized else None, self._loop)
            fut = self._fut
            if fut is not None and not fut.done():
                fut.set_result(H1Response(status, headers, self._stream))
            return
        if claim > _WHOLE_MIN and _reserve is not None and status not in (204, 304) and self._reserve_whole(claim):
            return
        if claim > FIRST_BUF:
            # One buffer filled as chunks arrive: no chunk list beside a joined copy (2x the
            # answer). It grows with what arrives (_grow), up to the claim at most.
            self._buf = bytearray(FIRST_BUF)
            self._claim = claim
            self._pos = 0

    def _reserve_whole(self, claim: int) -> bool:
        """The answer's bytes object at its claimed size, to be filled as bytes arrive; False
        where the address space is refused (strict overcommit): then the growing buffer."""
        assert _reserve is not None
        try:
            self._whole = _reserve(claim)
        except MemoryError:
            return False
        self._claim = claim
        self._pos = 0
        return True

    def _limit_name(self) -> str:
        key = "max_check_answer_bytes" if self._max_body < self._limits.max_body_bytes else "max_message_bytes"
        return f"the backend's {key} ({self._max_body})"

    def on_body(self, body: bytes) -> None:
        self._last_body = body
        self._body_len += len(body)
        if self._body_len > self._max_body:
            raise self._held(BadAnswer(f"answer body over {self._limit_name()}", kind=BadAnswer.TOO_LARGE))
        if self._stream is not None:
            self._body_got += len(body)
            self._stream._push(body)
        elif self._whole is not None:
            if self._pos + len(body) > self._claim or _put is None:  # (llhttp stops at Content-Length)
                raise self._held(BadAnswer(f"answer body past its Content-Length ({self._claim})",
                                           kind=BadAnswer.FRAMING))
            self._pos = _put(self._whole, self._pos, body)
        elif self._buf is not None:
            end = self._pos + len(body)
            if end > len(self._buf):
                self._grow(end)
            self._buf[self._pos : end] = body
            self._pos = end
        else:
            self._body.append(body)

    def _grow(self, need: int) -> None:
        buf = self._buf
        assert buf is not None
        bigger = bytearray(min(self._claim, max(need, len(buf) * _GROWTH)))
        bigger[: self._pos] = memoryview(buf)[: self._pos]
        self._buf = bigger

    def on_message_complete(self) -> None:
        if self._interim_now:
            self._interim_now = False
            return
        self._in_body = False
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive() and not self._eof_body
        status = self._status
        if self._stream is not None:
            if self._body_len >= FIRST_BUF:
                large_answer()
            self._stream._finish()
            self._end_stream()
            return
        whole = self._whole
        body: bytes | bytearray
        if whole is not None:
            self._whole = None
            # (Complete means Content-Length bytes came: every byte of it is written.)
            body = whole if self._pos == len(whole) else whole[: self._pos]
            if self._pos >= FIRST_BUF:
                large_answer()
        elif self._buf is not None:
            buf = self._buf
            body = buf[: self._pos] if self._pos != len(buf) else buf
            self._buf = None
            large_answer()
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body = []
        # Handed over once the parser has taken the whole read (data_received): bytes behind the
        # answer in the same read must poison the connection before anyone may reuse it.
        self._answer = H1Response(status, self._headers, body)

    def _deliver(self) -> None:
        answer, self._answer = self._answer, None
        fut = self._fut
        if answer is not None and fut is not None and not fut.done():
            fut.set_result(answer)
