"""Reading a backend's answers on a connection: the asyncio reads into the pool's read buffer,
fed to httptools' response parser (whose callbacks, the answer's framing and limits, are
``framing.py``'s), a large body read past the parser, and the connection's end.

The backend is untrusted input. Any byte after a complete answer, or while no exchange is under
way, poisons the connection: it is closed and never reused, and the bytes are never parsed into
another exchange's answer (the answer already complete is still delivered). Every refusal is a
:class:`BadAnswer` and closes the connection.
"""
from __future__ import annotations

from typing import Final

import httptools

from ...malloc import large_answer
from ...rawbody import HEAD_READ, RawBody
from .answer import H1Response
from .errors import BadAnswer, ConnectionDropped
from .framing import FIRST_BUF, AnswerFraming, window_of

__all__ = ["AnswerReader"]

# The rest of a whole answer's body, once at least this much of it is still to come, is read
# straight into its bytes object (_fill.window), past the parser, which hands each piece over as
# a new bytes object to be copied in (a 1 MiB answer: 1 MiB more copied, two 512 KiB pieces held
# beside it; benchmarks/conversion gRPC → HTTP).
_RAW_WHOLE: Final = 64 * 1024
_CRLF = (10, 13)
# What a connection's parser becomes once the connection is lost: its own parser calls back into
# it (bound methods), a reference cycle that only the cyclic collector could free — ~17 objects a
# closed connection, which filled the youngest generation (a 4–5 ms collection) every few passes
# where a least_queue scrape reconnects each pass (300 endpoints × 10,000 models). Never fed.
_SPENT = httptools.HttpResponseParser(object())


class AnswerReader(AnswerFraming):
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
        if whole is not None and window_of is not None and self._claim - self._pos >= _RAW_WHOLE and \
                not self._complete and not self.closed:
            # As a streamed answer's below: the parser has taken every byte read so far, the rest
            # of the body goes straight into the answer's bytes (their view lives as long as the
            # RawBody, which goes before whole is handed on or dropped).
            self._raw = RawBody(self._claim - self._pos, self._fd, window_of(whole, self._pos))
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
        if self._pos >= FIRST_BUF:
            large_answer()
        self._answer = H1Response(self._status, self._headers, whole)
        self._deliver()

    def _raw_done(self) -> None:
        """A streamed answer's body is complete: its stream ends."""
        self._raw_end()
        stream = self._stream
        assert stream is not None
        if stream.length is not None and stream.length >= FIRST_BUF:
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
        if self._body_len >= FIRST_BUF:
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
        if self._body_len >= FIRST_BUF:
            large_answer()
        if self._fut is not None and not self._fut.done():
            self._fail(error)
        if self._stream is not None and not self._complete:
            self._stream._fail(error)
            self._end_stream()

