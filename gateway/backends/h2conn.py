"""One HTTP/2 connection of a gRPC client :class:`~.h2channel.Channel`: an asyncio
BufferedProtocol feeding the extension's ``ClientConnection`` (``gateway.h2._h2``) what it reads,
dispatching the events that come out to the connection's calls (``h2stream.py``), and writing what
the connection flushes, once per pass of the loop. Keepalive PINGs, GOAWAY, the peer's flood and
the mapping of a stream's abnormal end to the party at fault (``grpcfault.py``) live here; which
connection a call goes on, and waiting for one, are the channel's.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from ..h2 import _h2
from .grpcfault import H2_ERRORS, Fault, stream_reset, went_away
from .h2frames import fault_error
from .h2stream import Call

if TYPE_CHECKING:
    from .h2channel import Channel

__all__ = ["FLUSH_MAX", "ChannelConnection"]

HEAD, DATA, TRAILERS, CLOSE, WRITABLE = _h2.HEAD, _h2.DATA, _h2.TRAILERS, _h2.CLOSE, _h2.WRITABLE
GOAWAY, DEAD, SETTINGS = _h2.GOAWAY, _h2.DEAD, _h2.SETTINGS
REFUSED_STREAM = _h2.REFUSED_STREAM

_READ_BUFFER = 256 * 1024  # what one read takes in (a 16 MiB answer: 64 reads)
FLUSH_MAX = 256 * 1024  # bytes of frames copied out per flush() (see ChannelConnection.flush)
_HEADER_LIST = 16 * 1024  # an answer head's size (grpc-core's hard metadata limit too) and field count
_HEADER_FIELDS = 100
# CONTINUATION frames per header block: enough for a head far over the size limit to be read to
# its end and refused on its stream (TOO_LARGE) rather than kill the connection; 2 MiB of HPACK at
# most (CVE-2024-28182 is about blocks without end).
_CONTINUATIONS = 128


class ChannelConnection(asyncio.BufferedProtocol):
    """One HTTP/2 connection of a channel."""

    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop) -> None:
        self.channel = channel
        self.loop = loop
        self.h2 = _h2.ClientConnection(
            max_concurrent_streams=channel.limits.streams_per_connection, max_header_list_size=_HEADER_LIST,
            max_header_fields=_HEADER_FIELDS, max_continuations=_CONTINUATIONS,
            max_stream_data=0)  # (messages are bounded one by one: MessageReader)
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray(_READ_BUFFER)
        self.calls: dict[int, Call] = {}
        self.ready: asyncio.Future[str | None] = loop.create_future()  # None: SETTINGS came; else why not
        self.gone: asyncio.Future[None] = loop.create_future()
        self.flush_soon = False
        self.paused = False
        self.goaway: tuple[int, int] | None = None  # (last stream id, error code) of a received GOAWAY
        self.failure: tuple[str, str] | None = None  # what ends the calls in flight when the connection goes
        self.lost = False
        self.read = False  # bytes came since the last keepalive check
        self.pinged = False
        self.timer: asyncio.TimerHandle | None = None
        self.header_resets = 0  # counters() as last seen: which CLOSE was our own reset
        self.glitches = 0

    # -- asyncio --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass of it)
        self.timer = self.loop.call_later(self.channel.limits.keepalive_s, self.keepalive)
        self.flush()  # the preface

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.read = True
        try:
            events = self.h2.feed(self.buf, nbytes)
        except _h2.H2Error as exc:
            self.fail(Fault.BAD, f"broke the HTTP/2 connection off ({exc})")
            return
        if events:
            self.dispatch(events)
        self.flush()

    def pause_writing(self) -> None:
        # Nothing more is produced while the socket is full; reading stops too, so the peer's
        # PINGs and SETTINGS cannot pile up acknowledgements (docs/h2-design.md section 0).
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None:
            self.transport.resume_reading()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
        reason = "the connection closed" if exc is None else f"the connection failed: {exc}"
        if not self.ready.done():
            self.ready.set_result(self.failure[1] if self.failure else f"{reason} before HTTP/2 began")
        calls, self.calls = self.calls, {}
        goaway = self.goaway
        for sid, call in calls.items():
            if call.done:
                continue
            if self.failure is not None:
                kind, why = self.failure
            elif goaway is not None and sid <= goaway[0] and not call.headed:
                kind, why = went_away(goaway[1], True)
            elif not call.headed:
                kind, why = Fault.TRANSPORT, f"{reason} with the call in flight, before any answer"
            else:
                kind, why = Fault.RESET, f"{reason} in the middle of the answer"
            call.close(fault_error(kind, why), None)
        self.gone.set_result(None)
        self.channel.lost(self)

    # -- events --
    def dispatch(self, events: list[tuple[Any, ...]]) -> None:
        calls = self.calls
        for ev in events:
            kind = ev[0]
            if kind == DATA:
                call = calls.get(ev[1])
                if call is not None:
                    call.on_data(ev[2], ev[3])
            elif kind == HEAD:
                call = calls.get(ev[1])
                if call is not None:
                    call.on_head(ev[2], ev[3])
            elif kind == TRAILERS:
                call = calls.get(ev[1])
                if call is not None:
                    call.on_trailers(ev[2])
            elif kind == CLOSE:
                call = calls.get(ev[1])
                if call is not None:
                    kind_, why = self.closefault_error(ev[1], ev[2])
                    call.close(fault_error(kind_, why), None)
            elif kind == WRITABLE:
                call = calls.get(ev[1])
                if call is not None:
                    call.on_writable()
            elif kind == GOAWAY:
                self.goaway = (ev[1], ev[2])
                self.channel.retire(self)
            elif kind == DEAD:
                self.fail(Fault.BAD, f"flooded the HTTP/2 connection ({ev[1]} frames over the gateway's limit)")
                return
            elif kind == SETTINGS:
                if not self.ready.done():
                    self.ready.set_result(None)
                else:
                    self.channel.wake(None)  # (MAX_CONCURRENT_STREAMS may have grown)

    def closefault_error(self, sid: int, code: int) -> tuple[str, str]:
        """What a stream's abnormal end (CLOSE with ``code``) says of the backend."""
        counters = self.h2.counters()
        ours_head = counters["header_resets"] > self.header_resets
        ours = counters["glitch"] > self.glitches
        self.header_resets, self.glitches = counters["header_resets"], counters["glitch"]
        if ours_head:
            return Fault.TOO_LARGE, (f"answered with too many bytes of headers (metadata), over grpc's limit "
                                     f"({_HEADER_LIST} bytes or {_HEADER_FIELDS} fields per head)")
        if code == REFUSED_STREAM and self.goaway is not None and sid > self.goaway[0]:
            return went_away(self.goaway[1], False)  # RFC 9113 section 6.8: not processed
        if ours:
            return Fault.BAD, (f"broke the HTTP/2 protocol on the call's stream (the gateway reset it: "
                               f"{H2_ERRORS.get(code, str(code))})")
        return stream_reset(code)

    # -- writing --
    def schedule_flush(self) -> None:
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self.flush)

    def schedule_batch(self) -> None:
        """:meth:`schedule_flush`, one pass of the loop later: what the next pass reads joins it."""
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self.loop.call_soon, self.flush)

    def flush(self) -> None:
        self.flush_soon = False
        transport = self.transport
        if transport is None or self.paused or transport.is_closing():
            return
        h2 = self.h2
        while True:
            # At most FLUSH_MAX a time, until the socket's buffer fills (as the listener's flush).
            out = None if self.paused else h2.flush(FLUSH_MAX)
            while out:
                transport.writelines(out)
                out = None if self.paused else h2.flush(FLUSH_MAX)
            if not h2.has_events:
                break
            self.dispatch(h2.poll())
            if transport.is_closing():
                return
        if not h2.want_read and not h2.want_write:
            # Over: a graceful GOAWAY with no stream left, or one nghttp2 sent for the peer's
            # connection error (calls still open then end with it).
            if self.calls and self.failure is None:
                self.failure = (Fault.BAD, "broke the HTTP/2 protocol (a connection error: the gateway sent GOAWAY)")
            transport.close()

    def fail(self, kind: str, why: str) -> None:
        """End the connection for ``why``: what nghttp2 queued (a GOAWAY) goes out, then it closes."""
        if self.failure is None:
            self.failure = (kind, why)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            out = self.h2.flush()
            if out:
                transport.writelines(out)
            transport.close()

    def keepalive(self) -> None:
        """The keepalive timer: a PING after ``keepalive_s`` without a read while calls are open;
        no read within ``keepalive_timeout_s`` of it ends the connection."""
        limits = self.channel.limits
        if self.lost:
            return
        if self.pinged and not self.read:
            self.fail(Fault.TRANSPORT, f"did not answer a keepalive PING within {limits.keepalive_timeout_s:g} s")
            return
        if self.read or not self.calls:
            self.pinged = self.read = False
            self.timer = self.loop.call_later(limits.keepalive_s, self.keepalive)
            return
        self.h2.ping(0)
        self.pinged, self.read = True, False
        self.schedule_flush()
        self.timer = self.loop.call_later(limits.keepalive_timeout_s, self.keepalive)

    # -- calls --
    def end(self, sid: int, code: int | None) -> None:
        """A call's stream is over for the call: forgotten, reset with ``code`` unless None."""
        calls = self.calls
        calls.pop(sid, None)
        if code is not None and not self.lost and self.h2.reset(sid, code):
            self.schedule_flush()
        channel = self.channel
        if channel.waiters:
            channel.wake(None, 1)
        if self.goaway is not None and not calls:
            self.schedule_flush()  # (the connection ends once flushed)
