"""Reading a backend's answers on a connection: the asyncio reads, httptools' response parser and
its callbacks, the answer's framing and limits, its body whole, streamed, or read past the parser.

The backend is untrusted input, and the framing is as strict as nginx's and Envoy's (RFC 9112
section 6, RFC 9110 section 15.2):

- a connection carries one exchange at a time; interim answers (1xx but 101) are read and
  dropped, at most ``MAX_INTERIM`` of them; a 101 is refused (the client never asks to upgrade);
- any byte after a complete answer, or while no exchange is under way, poisons the connection:
  it is closed and never reused, and the bytes are never parsed into another exchange's answer
  (the answer already complete is still delivered);
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

import httptools

from ...malloc import large_answer
from ...rawbody import HEAD_READ, RawBody
from .answer import BodyStream, H1Response
from .errors import BadAnswer, ConnectionDropped
from .limits import MAX_INTERIM
from .link import Link

__all__ = ["AnswerReader"]

# A whole body above this size is written, piece by piece as it arrives, into its final bytes
# object, made at the claimed size and left uninitialised (gateway/_fill.c): one copy of each
# byte, the answer held once, and a backend that lies about its length makes the gateway hold
# only what it sent (pages become memory as they are written). Below it the pieces are joined
# (a small answer usually comes in one piece: no copy at all).
_WHOLE_MIN: Final = 64 * 1024
_reserve: Callable[[int], bytes] | None
_put: Callable[[bytes, int, bytes], int] | None
_window: Callable[[bytes, int], memoryview] | None
try:
    from ..._fill import put as _put
    from ..._fill import reserve as _reserve
    from ..._fill import window as _window
except ImportError:  # built without a C compiler (setup.py): the growing buffer below
    _reserve = _put = _window = None
# The rest of a whole answer's body, once at least this much of it is still to come, is read
# straight into its bytes object (_fill.window), past the parser, which hands each piece over as
# a new bytes object to be copied in (a 1 MiB answer: 1 MiB more copied, two 512 KiB pieces held
# beside it; benchmarks/conversion gRPC → HTTP).
_RAW_WHOLE: Final = 64 * 1024
# Without the C helper: a buffer that starts this large and grows 4-fold as bytes arrive, never
# past the claim (bytearray(n) writes all n bytes, so it cannot be sized by the claim): a backend
# that lies makes the gateway hold at most ~4 x what it really sent; an honest 16 MB answer costs
# two extra copies of 1 and 4 MiB. (Also the size past which an answer counts as large for the
# allocator's idle trim, malloc.large_answer.)
_FIRST_BUF = 1 << 20
_GROWTH = 4


_CRLF = (10, 13)
# What a connection's parser becomes once the connection is lost: its own parser calls back into
# it (bound methods), a reference cycle that only the cyclic collector could free — ~17 objects a
# closed connection, which filled the youngest generation (a 4–5 ms collection) every few passes
# where a least_queue scrape reconnects each pass (300 endpoints × 10,000 models). Never fed.
_SPENT = httptools.HttpResponseParser(object())


class _Poisoned(Exception):
    """Raised from the parser's message-begin callback to stop it: bytes after the answer."""


class AnswerReader(Link):
    """How a connection reads its answers. A buffered protocol: the loop reads into the
    pool's one read buffer and the parser takes the bytes from there — a plain protocol gets
    each read as a new bytes object, one more copy of every byte of every answer (measured:
    user-space copies were ~13 % of the gateway's CPU on 16 MB answers). One buffer serves
    all of a pool's connections: the loop reads one socket at a time and ``buffer_updated``
    is done with the bytes before it returns (the parser copies what it hands on).

    The body of a streamed answer with a Content-Length (``BodyStream``, ≥ ``stream_min``) is
    read past the parser instead: after the read that brought its head, the loop reads the
    rest of the body straight into buffers of the connection's own that become the stream's
    chunks — no copy at all (the parser would hand each chunk over as a new bytes object: one
    copy of every byte of every large answer). See :meth:`buffer_updated`."""

    __slots__ = ()

    # -- asyncio.BufferedProtocol ------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        raw = self._raw
        if raw is not None:
            return raw.buffer()
        if self._in_body:
            return self._rbuf
        # A head is awaited: never more than one byte past the head limit is read for it (the
        # limit is then exact, whatever the reads' sizes).
        room = self._max_head + 1 - self._head_fed
        return self._hbuf if room >= HEAD_READ else self._hbuf[: max(room, 1)]

    def buffer_updated(self, nbytes: int) -> None:
        if self._raw is not None:
            self._raw_read(nbytes)
            return
        self.data_received(self._rbuf[:nbytes])
        whole = self._whole
        if whole is not None and _window is not None and self._claim - self._pos >= _RAW_WHOLE and \
                not self._complete and not self.closed:
            # As a streamed answer's below: the parser has taken every byte read so far, the rest
            # of the body goes straight into the answer's bytes (their view lives as long as the
            # RawBody, which goes before whole is handed on or dropped).
            self._raw = RawBody(self._claim - self._pos, self._fd, _window(whole, self._pos))
            self._raw_keep_alive = self._parser.should_keep_alive()
            return
        stream = self._stream
        if stream is not None and stream.length is not None and not self._complete and not self.closed:
            # A streamed answer with a Content-Length is under way and the parser has taken
            # every byte read so far (it stops only at an error): the rest of the body is
            # counted, not parsed, from the next read on. This parser stops here; a new one
            # takes the next answer on this connection (_raw_end).
            self._raw = RawBody(stream.length - self._body_got, self._fd)
            self._raw_keep_alive = self._parser.should_keep_alive()

    # -- a streamed answer's body, read past the parser --------------------------------
    def _raw_read(self, nbytes: int) -> None:
        raw = self._raw
        assert raw is not None
        self._got_bytes = True
        stream = self._stream
        if stream is None:  # a whole answer's bytes, read into them
            raw.take(nbytes)
            self._pos += nbytes
            self._body_len += nbytes
            if not raw.left:
                self._raw_whole_done()
            return
        stream._push(raw.take(nbytes))
        if not raw.left:
            self._raw_done()

    def _raw_end(self) -> None:
        """A body read past the parser is complete: the answer ends as ``on_message_complete``
        ends it, and the connection gets a new parser for its next answer (this one stopped
        mid-body)."""
        if self._raw is not None:
            self._raw.done()
        self._raw = None
        self._parser = httptools.HttpResponseParser(self)
        self._in_body = False
        self._complete = True
        self.keep_alive = self._raw_keep_alive

    def _raw_whole_done(self) -> None:
        """A whole answer's body is complete: handed over as ``on_message_complete`` hands it."""
        self._raw_end()
        whole = self._whole
        assert whole is not None
        self._whole = None
        self._last_body = b""
        if self._pos >= _FIRST_BUF:
            large_answer()
        self._answer = H1Response(self._status, self._headers, whole)
        self._deliver()

    def _raw_done(self) -> None:
        """A streamed answer's body is complete: its stream ends."""
        self._raw_end()
        stream = self._stream
        assert stream is not None
        if stream.length is not None and stream.length >= _FIRST_BUF:
            large_answer()  # its chunks were the reads' own buffers: the idle trim follows them
        stream._finish()
        self._end_stream()

    def data_received(self, data: bytes | memoryview) -> None:
        self._got_bytes = True
        if (self._fut is None and self._on_end is None) or self._complete:
            # Bytes nobody asked for (a server talking out of turn, or more after a complete
            # answer): this connection is unusable, and they are nobody's answer.
            self.close()
            return
        if not self._in_body:
            self._head_fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # What a callback raised is kept on this object (_held), not read from the parser's
            # exception: httptools chains it as __context__, which Python overwrites when the
            # feed runs while another exception is being handled further up.
            refusal = self._refusal
            if self._poisoned or self._complete:
                self.close()  # bytes after a complete answer (still delivered): never reused
            elif refusal is not None:
                self._refuse(refusal)
            else:
                self._refuse(BadAnswer(f"malformed HTTP answer: {exc}", kind=BadAnswer.FRAMING))
        except httptools.HttpParserUpgrade:
            self._refuse(BadAnswer("a 101 (protocol switch) answer: the gateway asked for no upgrade",
                                   kind=BadAnswer.FRAMING))
        if self._complete and not self.closed and data[-1] in _CRLF and self._blank_after(data):
            self.close()  # bytes after a complete answer (still delivered): never reused
        if self._complete:
            # Its one use is over: kept, an idle connection would hold its last answer's last
            # piece — the whole answer when it came in one read (300 endpoints' repository
            # indexes: 150 MB).
            self._last_body = b""
        if self._answer is not None:
            self._deliver()
        elif self.closed:
            pass
        elif not self._in_body:
            # The head limit holds for a head still arriving too: httptools gathers a header's
            # value until it ends, and would otherwise hold a 10 MiB header whole.
            if self._head_fed > self._max_head:
                self._refuse(BadAnswer(f"answer head over max_answer_head_bytes ({self._limits.max_head_bytes})",
                                       kind=BadAnswer.TOO_LARGE))
        elif self._chunk_open and self._body_len == self._chunk_at:
            # Bytes after a chunk's size line and none of its data: the last chunk's trailer
            # fields (or a long chunk line), which httptools gathers whole: bounded as a head.
            self._tail_fed += len(data)
            if self._tail_fed > self._max_head:
                self._refuse(BadAnswer(f"answer trailers over max_answer_head_bytes "
                                       f"({self._limits.max_head_bytes})", kind=BadAnswer.TOO_LARGE))
        else:
            self._tail_fed = 0

    def _held(self, exc: BadAnswer) -> BadAnswer:
        """``exc``, kept as this answer's refusal: raised from a parser callback, it stops the
        parser, and data_received refuses the answer with it."""
        self._refusal = exc
        return exc

    def _blank_after(self, data: bytes | memoryview) -> bool:
        """Whether the read that completed the answer went on with empty lines (CR / LF), which
        llhttp skips between messages without a callback. Told from the answer's own last bytes:
        a chunked answer ends with exactly CRLF CRLF after a character that is neither; a sized
        one with its body's own run of CR / LF (and, for an empty body or one of CR / LF alone,
        the head's closing CRLF CRLF)."""
        tail = bytes(data[-64:])
        run = len(tail) - len(tail.rstrip(b"\r\n"))
        if "transfer-encoding" in self._headers:
            return run > 4
        last = self._last_body
        own = len(last) - len(last.rstrip(b"\r\n"))
        return run > (own + 4 if own == self._body_len else own)

    def _refuse(self, exc: BadAnswer) -> None:
        """The answer is refused: the exchange fails with ``exc`` and the connection closes.
        What was gathered of it goes at once (no reference to it stays here)."""
        self._buf = None
        if self._raw is not None and self._stream is None:
            self._raw.done()  # (its view is of whole's bytes: it goes first)
            self._raw = None
        self._whole = None
        self._body = []
        if self._body_len >= _FIRST_BUF:
            large_answer()
        self._fail(exc)
        stream = self._stream
        if stream is not None and not self._complete:
            stream._fail(exc)
            self.close()
            self._end_stream()
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._lost(exc)
        finally:
            self._parser = _SPENT

    def _lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._raw is not None:
            self._raw.closed()
            if self._stream is None:
                self._raw = None  # (a whole answer's: its view is of whole's bytes, which go below)
        self._wake_drain()
        if exc is None and self._eof_body and self._in_body and not self._complete:
            # A close-delimited answer (RFC 9112 section 6.3 rule 8) ends here.
            self.keep_alive = False
            self.on_message_complete()
            self._deliver()
            return
        error = ConnectionDropped(
            f"connection closed by the backend{': ' + str(exc) if exc else ''}"
            f"{' mid-answer' if self._got_bytes else ''}",
            before_response=not self._got_bytes,
        )
        # What was gathered of an unfinished answer goes now, not when this object does.
        self._buf = None
        self._whole = None
        self._body = []
        if self._body_len >= _FIRST_BUF:
            large_answer()
        if self._fut is not None and not self._fut.done():
            self._fail(error)
        if self._stream is not None and not self._complete:
            self._stream._fail(error)
            self._end_stream()

    # -- httptools callbacks --------------------------------------------------
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
        if claim > _FIRST_BUF:
            # One buffer filled as chunks arrive: no chunk list beside a joined copy (2x the
            # answer). It grows with what arrives (_grow), up to the claim at most.
            self._buf = bytearray(_FIRST_BUF)
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
            if self._body_len >= _FIRST_BUF:
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
            if self._pos >= _FIRST_BUF:
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
