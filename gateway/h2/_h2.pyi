"""HTTP/2 connections on libnghttp2 (gateway/h2/_h2.c; the design: docs/h2-design.md).

One object per TCP connection and side: ``ServerConnection`` answers a gRPC client, ``ClientConnection``
talks to a gRPC backend. Each wraps one nghttp2 session driven from memory buffers:

* ``feed(data)`` runs what was read through nghttp2 and returns the events it produced;
* ``flush()`` returns everything to write now, for ``transport.writelines()``; call it after every
  ``feed()`` (nghttp2 answers SETTINGS, PING and others as a side effect) and after every send call.

The nghttp2 callbacks are C: no Python code runs inside the library, and Python never sees a frame.

Events are tuples whose first item is one of the kinds below. A stream that finishes normally (both
sides sent END_STREAM) produces no event of its own.

=========================================== ==========================================================
``(HEAD, sid, headers, end_stream)``        The peer's head: a request on the server, a response on the
                                            client (interim 1xx responses are dropped). ``headers`` is
                                            a list of ``(name, value)`` bytes tuples, pseudo-headers
                                            first; ``end_stream``: no body follows (on the client, a
                                            gRPC trailers-only answer).
``(DATA, sid, data, end_stream)``           Body bytes (``bytes``). All DATA of one stream received in
                                            one ``feed()`` is joined into one event. An empty ``data``
                                            only comes with ``end_stream``. Every byte delivered must be
                                            ``consume()``d to reopen the flow-control window, unless
                                            the stream closes first (then it is returned for you).
``(TRAILERS, sid, headers)``                The peer's trailers; they end its side of the stream.
``(CLOSE, sid, error_code)``                The stream ended abnormally: reset by the peer (its code,
                                            possibly ``NO_ERROR``), refused by a GOAWAY
                                            (``REFUSED_STREAM``: safe to retry elsewhere), or reset
                                            here for a limit (``INTERNAL_ERROR`` for a header block over
                                            the limits, ``ENHANCE_YOUR_CALM`` for ``max_stream_data``).
                                            Only for streams the app knows (the server saw their HEAD;
                                            the client made them), never after ``reset()``, and nothing
                                            more comes for that sid.
``(WRITABLE, sid)``                         The stream's unsent queue, which had grown past
                                            ``write_low_water``, drained to it: send more.
``(GOAWAY, last_sid, error_code)``          The peer is going away: streams above ``last_sid`` will not
                                            be processed (on the client they get ``CLOSE`` with
                                            ``REFUSED_STREAM``); no new request is allowed.
``(DEAD, reason)``                          A flood limit tripped (``reason`` is the bucket: "ping",
                                            "settings", "window_update", "priority", "empty_data",
                                            "rst_stream" or "glitch"). GOAWAY(ENHANCE_YOUR_CALM) is
                                            queued and the rest of the input is ignored: flush, then
                                            close the connection.
``(PING_ACK, opaque)``                      The peer answered our ``ping(opaque)``.
``(SETTINGS, remote_max_concurrent_streams)`` The peer sent its SETTINGS (the first one ends its preface).
=========================================== ==========================================================

A connection error of the peer's (a malformed frame, a bad HPACK block, DATA past the connection
window) is not raised: nghttp2 queues a GOAWAY with the error and ignores further input, and
``want_read`` and ``want_write`` turn False once ``flush()`` has produced it. Close the connection
then; streams still open at that point get no CLOSE event (the app ends them with the connection).

Events arise in ``feed()`` and also while ``flush()`` sends (``WRITABLE``; ``CLOSE`` of a request
refused before it went out, or of a stream nghttp2 reset for a peer's protocol error). Those wait for
the next ``feed()``, which returns them first, or for ``poll()``: check ``has_events`` after ``flush()``.

Limits are keyword ints given to the constructor and copied into C once; all are enforced in C:

========================== ============ ===================================================================
``max_concurrent_streams`` 100          Server: SETTINGS_MAX_CONCURRENT_STREAMS (nghttp2 refuses the
                                        excess). Client: a local cap on open requests (``can_request``).
``initial_window_size``    1 MiB        SETTINGS_INITIAL_WINDOW_SIZE: what the peer may send per stream
                                        before ``consume()`` reopens the window.
``connection_window_size`` 8 MiB        The connection's receive window (all streams together).
``max_header_list_size``   16 KiB       A received header block's size, counting name + value + 32 per
                                        field (RFC 9113 section 6.5.2); over it the stream is reset before
                                        any Python object is built. Also advertised in SETTINGS.
``max_header_fields``      100          A received header block's field count, enforced the same way.
``max_frame_size``         16384        SETTINGS_MAX_FRAME_SIZE.
``header_table_size``      4096         SETTINGS_HEADER_TABLE_SIZE: bounds the HPACK decoder's table.
``max_continuations``      8            CONTINUATION frames per header block (CVE-2024-28182); more is
                                        fatal (``feed()`` raises).
``max_stream_data``        64 MiB       DATA bytes accepted per stream (0: no limit); more resets it
                                        (RST_STREAM ENHANCE_YOUR_CALM) with a CLOSE event.
``write_low_water``        64 KiB       Unsent bytes of a stream at which WRITABLE fires (see above).
``<bucket>_burst``,        see below    Token buckets (burst, tokens added per second; burst 0 turns one
``<bucket>_rate``                       off) charged per received frame: ``ping`` (1000, 100),
                                        ``settings`` (100, 10), ``window_update`` on the connection
                                        (10000, 1000), ``priority`` (1000, 100), ``empty_data``: DATA with
                                        no payload and no END_STREAM (100, 10), ``rst_stream``
                                        (1000, 33; CVE-2023-44487), and ``glitch`` (1000, 33): every
                                        RST_STREAM sent that the app did not ask for with ``reset()``,
                                        i.e. provoked by the peer (its protocol errors, the header and
                                        data limits above; CVE-2025-8671). An empty bucket gives DEAD.
========================== ============ ===================================================================

Received streams are bounded by nghttp2 as well: HTTP messaging checks stay on (pseudo-headers,
connection-specific fields, content-length), and a single field over 64 KiB is a connection error.
"""

from typing import Any, Final, Self, TypeAlias, final

from typing_extensions import Buffer as _Buffer
from typing_extensions import disjoint_base

_HeadersIn: TypeAlias = list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]
# An event tuple; its first item (HEAD, DATA, ...) fixes the shape of the rest (see above).
_Event: TypeAlias = tuple[Any, ...]

HEAD: Final[int]
DATA: Final[int]
TRAILERS: Final[int]
CLOSE: Final[int]
WRITABLE: Final[int]
GOAWAY: Final[int]
DEAD: Final[int]
PING_ACK: Final[int]
SETTINGS: Final[int]

# HTTP/2 error codes (RFC 9113 section 7)
NO_ERROR: Final[int]
PROTOCOL_ERROR: Final[int]
INTERNAL_ERROR: Final[int]
FLOW_CONTROL_ERROR: Final[int]
STREAM_CLOSED: Final[int]
REFUSED_STREAM: Final[int]
CANCEL: Final[int]
ENHANCE_YOUR_CALM: Final[int]

NGHTTP2_VERSION: Final[str]
"""The version of the libnghttp2 loaded (Debian's backports do not show in it)."""
FEATURES: Final[tuple[str, ...]]
"""Library features found at build time: "ssize2" (the nghttp2_ssize API of 1.60+),
"max_continuations" (the library's CONTINUATION limit; without it the extension counts them
itself), "stream_reset_rate_limit" (the library's received-RST bucket, a backstop behind ours)."""

class H2Error(Exception):
    """A connection-level HTTP/2 error, or a call the stream's state does not allow.

    After ``feed()`` raised it the connection is dead: ``flush()`` what is queued (a GOAWAY where one
    could be sent), then close. ``code`` is the nghttp2 library error code (a negative int).
    """

    code: int

@disjoint_base
class Connection:
    """What both sides share. Not instantiable: use ServerConnection or ClientConnection."""

    @property
    def want_read(self) -> bool:
        """Whether the session still reads: False after a fatal error, once a terminating GOAWAY was
        sent, or after a graceful GOAWAY (sent or received) once no stream is left. Close the
        connection when neither ``want_read`` nor ``want_write`` holds."""
    @property
    def want_write(self) -> bool:
        """Whether ``flush()`` has something to produce (frames queued, or data the windows allow)."""
    @property
    def open_streams(self) -> int:
        """Streams this object holds state for: open ones, plus requests not sent yet (client)."""
    @property
    def outbound_queue_size(self) -> int:
        """Frames nghttp2 has queued and not yet sent (not counting DATA); a peer that never reads
        makes it grow: stop reading while the transport is paused."""
    @property
    def dead(self) -> str | None:
        """The flood bucket that tripped (see DEAD), or None."""
    @property
    def has_events(self) -> bool:
        """Whether events wait for ``poll()`` (or the next ``feed()``)."""
    def feed(self, data: _Buffer, nbytes: int | None = None, /) -> list[_Event]:
        """Process received bytes (the first ``nbytes`` of ``data``, default all) and return the
        events: first those waiting from ``flush()``, then this input's. Any split of the byte
        stream into calls is fine; ``data`` is not used after the call returns.

        Raises H2Error on a fatal error (a bad preface, too many CONTINUATIONs, an outbound flood,
        a connection error nghttp2 cannot recover from): a GOAWAY is queued where possible, so
        ``flush()``, write, and close. A flood limit does not raise: see DEAD.
        """
    def flush(self, limit: int | None = None, /) -> list[bytes | memoryview] | None:
        """Everything to write now, or None: control frames, HEADERS and small DATA gathered in
        ``bytes``, and each large DATA payload as a ``memoryview`` slice of the buffer it was sent
        from (zero-copy; the view keeps that buffer alive). Pass the list to
        ``transport.writelines()``. With ``limit``, stop once at least that many bytes are out
        (``want_write`` tells whether more waits), for a transport that is filling up.
        """
    def poll(self) -> list[_Event]:
        """The events that arose outside ``feed()`` (during ``flush()``), in order."""
    def send_data(self, sid: int, data: _Buffer, end: bool = False) -> bool:
        """Queue ``data`` (any C-contiguous buffer; not to be changed until sent) on the stream's
        outgoing body; ``end``: it is the last. Bytes are sent as the peer's flow-control windows
        allow, by ``flush()``. Returns False, doing nothing, when the stream is gone (closed or
        reset); raises H2Error when the head was not sent without ``end`` or the body already ended.
        For backpressure: while ``buffered(sid)`` is above your mark, wait for WRITABLE.
        """
    def send_trailers(self, sid: int, headers: _HeadersIn, /) -> bool:
        """End the stream's body with trailers (a HEADERS frame with END_STREAM), sent once the
        queued data is out. Same return and errors as ``send_data``."""
    def reset(self, sid: int, code: int = ...) -> bool:
        """Reset the stream with RST_STREAM(``code``, default CANCEL), dropping what it had queued.
        At most once per stream: returns False when the stream is unknown, closed or already reset.
        No CLOSE event follows. A request not sent yet is simply dropped."""
    def consume(self, sid: int, nbytes: int, /) -> None:
        """Say the app took ``nbytes`` of the stream's delivered DATA. Flow control is manual
        (NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE): the peer gets window back (a WINDOW_UPDATE, once half a
        window is consumed) only for consumed bytes, so a slow consumer stops the sender. Call it
        when the consumer really took the bytes. A no-op on a closed stream (its bytes were returned
        when it closed); ValueError for more than was delivered."""
    def ping(self, opaque: int = 0, /) -> None:
        """Send a PING carrying ``opaque`` (an unsigned 64-bit int); PING_ACK reports the answer."""
    def goaway(self, code: int = 0, last_sid: int | None = None) -> None:
        """Send GOAWAY. With code 0 (NO_ERROR) it is graceful: streams up to ``last_sid`` (default:
        the last one processed) go on, newer ones are ignored, and ``want_read``/``want_write`` turn
        False when the last one ends. With an error code the connection terminates: nothing more is
        read, and it is over once the GOAWAY is flushed."""
    def buffered(self, sid: int, /) -> int:
        """Bytes queued on the stream and not yet sent (0 for an unknown stream)."""
    def counters(self) -> dict[str, int]:
        """Counters for metrics: frames charged to each flood bucket ("ping", "settings",
        "window_update", "priority", "empty_data", "rst_stream", "glitch"), and streams reset for
        a header block over the limits ("header_resets") or for max_stream_data ("data_resets")."""

@final
class ServerConnection(Connection):
    """The server side of one connection: ``ServerConnection(**limits)``. The client preface (the
    24-byte magic) is checked; our SETTINGS and the connection window go out on the first flush."""

    def __new__(
        cls,
        *,
        max_concurrent_streams: int = ...,
        initial_window_size: int = ...,
        connection_window_size: int = ...,
        max_header_list_size: int = ...,
        max_header_fields: int = ...,
        max_frame_size: int = ...,
        header_table_size: int = ...,
        max_continuations: int = ...,
        max_stream_data: int = ...,
        write_low_water: int = ...,
        ping_burst: int = ...,
        ping_rate: int = ...,
        settings_burst: int = ...,
        settings_rate: int = ...,
        window_update_burst: int = ...,
        window_update_rate: int = ...,
        priority_burst: int = ...,
        priority_rate: int = ...,
        empty_data_burst: int = ...,
        empty_data_rate: int = ...,
        rst_stream_burst: int = ...,
        rst_stream_rate: int = ...,
        glitch_burst: int = ...,
        glitch_rate: int = ...,
    ) -> Self: ...
    def respond(
        self, sid: int, headers: _HeadersIn, body: _Buffer | None = None, trailers: _HeadersIn | None = None
    ) -> bool:
        """Answer a request in one call (the unary fast path): HEADERS, then ``body`` as DATA, then
        ``trailers`` as HEADERS with END_STREAM. Without a body and trailers it is one HEADERS frame
        with END_STREAM (a gRPC trailers-only answer); without trailers the last DATA ends the
        stream. ``headers`` start with ``(b":status", b"200")``; names must be lowercase, values
        free of CR/LF/NUL and of leading or trailing whitespace (ValueError otherwise). Returns False
        when the stream is gone; H2Error when it was answered already."""
    def send_headers(self, sid: int, headers: _HeadersIn, end: bool = False) -> bool:
        """Send the response head alone; then ``send_data``/``send_trailers`` stream the body
        (``end``: no body, the stream ends here). Same return and errors as ``respond``."""
    def shutdown_notice(self) -> None:
        """The first step of a graceful drain: a GOAWAY with the largest stream id, telling the
        client to open no more streams while those in flight still arrive. About one round trip
        later (a ``ping()`` answered), call ``goaway()`` with the real last stream id."""

@final
class ClientConnection(Connection):
    """The client side of one connection: ``ClientConnection(**limits)`` (same limits as
    ServerConnection). The preface (magic + SETTINGS with ENABLE_PUSH=0) goes out on the first
    flush; requests may be made before the server's SETTINGS arrive."""

    def __new__(
        cls,
        *,
        max_concurrent_streams: int = ...,
        initial_window_size: int = ...,
        connection_window_size: int = ...,
        max_header_list_size: int = ...,
        max_header_fields: int = ...,
        max_frame_size: int = ...,
        header_table_size: int = ...,
        max_continuations: int = ...,
        max_stream_data: int = ...,
        write_low_water: int = ...,
        ping_burst: int = ...,
        ping_rate: int = ...,
        settings_burst: int = ...,
        settings_rate: int = ...,
        window_update_burst: int = ...,
        window_update_rate: int = ...,
        priority_burst: int = ...,
        priority_rate: int = ...,
        empty_data_burst: int = ...,
        empty_data_rate: int = ...,
        rst_stream_burst: int = ...,
        rst_stream_rate: int = ...,
        glitch_burst: int = ...,
        glitch_rate: int = ...,
    ) -> Self: ...
    @property
    def remote_max_concurrent_streams(self) -> int:
        """The server's SETTINGS_MAX_CONCURRENT_STREAMS (100 until its SETTINGS arrive)."""
    def can_request(self) -> bool:
        """Whether ``request()`` would succeed: no GOAWAY sent or received, no flood or fatal
        error, stream ids left, and fewer open streams than both the server's
        MAX_CONCURRENT_STREAMS and our ``max_concurrent_streams``. When False, use another
        connection."""
    def request(self, headers: _HeadersIn, body: _Buffer | None = None, end: bool = True) -> int:
        """Start a request and return its stream id: HEADERS (``:method``, ``:scheme``,
        ``:authority``, ``:path`` first), then ``body`` as DATA. With ``end`` (the default) the
        request ends there (no body and end: one HEADERS frame with END_STREAM); without it,
        ``send_data``/``send_trailers`` stream the rest. Raises H2Error when ``can_request()`` is
        False; header checks as in ``ServerConnection.respond``."""
