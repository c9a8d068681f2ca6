"""Fuzz target: a gRPC client's bytes as the gateway's own HTTP/2 listener reads them
(gateway/frontend/h2session.py ``H2Connection`` on gateway.h2._h2), driven below the network: a
fake transport, and an event loop on a clock the harness moves, run a bounded number of
iterations after each read. The listener is a real ``H2Listener`` with grpc generic handlers of
the harness's own: ``ModelInfer`` echoes its request, ``ServerLive`` aborts (NOT_FOUND, with
trailing metadata), ``ModelReady`` never answers (until its deadline or the client's reset), and
``ModelStreamInfer`` echoes each request message of a bidirectional stream.

Input layout:

- byte 0, flags: bits 0-1 how the bytes are cut into reads — 0 one read, 1 one HTTP/2 frame a
  read (the preface alone, then each frame header with its payload), 2 reads of byte 1's size
  (+1), 3 reads of the sizes in bytes 1-3 (+1 each), cycled; at most 256 reads, the last taking
  what is left. Bit 2: the client's preface (the magic and an empty SETTINGS) goes first, so the
  bytes start at the first HEADERS. Bit 3: small limits (4 streams, 64-byte messages, 1 KiB of
  metadata, body_timeout_s 1, idle_timeout_s 2) instead of the defaults. Bit 4: the clock moves
  0.5 s after each read (the listener's sweep: body and idle timeouts). Bit 5: after the bytes,
  the clock jumps 100 s (deadlines, the sweep). Bit 6: a small transport buffer: writing is
  paused past 4 KiB unsent (reading with it) and resumed after each read. Bit 7: the listener
  drains the connection (graceful GOAWAY) after the first read.
- bytes 1-3: the read sizes (see bits 0-1).
- the rest: the client's bytes.

Checks (any other exception, or a FuzzBug, is a bug):

- nothing escapes the protocol's callbacks, the loop's callbacks or the calls' tasks (the loop's
  exception handler and the listener's error log count as escapes), and after the connection is
  lost every call's task has ended and the listener holds no connection;
- every call whose HEAD the connection saw is, when the bytes run out, answered or reset (by
  either side), or still pending on the connection (or the connection is closed); a call still
  pending is neither answered nor has an ended task; at most ``max_grpc_streams`` are;
- the bytes held for calls (message readers, unary requests, streaming queues) are bounded by
  their limits: ``2 × max_message_bytes + 5`` per unary call;
- the connection's output is a sequence of whole HTTP/2 frames: SETTINGS first, no frame over
  16384 bytes, stream frames on odd ids, HEADERS/DATA only on streams the app saw, DATA after
  HEADERS, nothing after a stream's END_STREAM or RST_STREAM, header blocks HPACK decode; a
  stream whose END_STREAM went out carried exactly the DATA the app queued;
- differential, against the ``h2`` package as a server fed the same bytes: when it reads a
  complete, well-formed unary call to ``ModelInfer`` with one message within the limits (no
  deadline, no binary metadata; gzip / deflate messages decompressed), the gateway answers it
  with that message and status OK.
"""
from __future__ import annotations

import asyncio
import logging
import re
import sys
import zlib
from collections.abc import AsyncIterator, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import h2.config
import h2.connection
import h2.events
import hpack

from fuzz._support import FuzzBug, check, instrumented, run

with instrumented(__name__ == "__main__", ("gateway",)):
    from gateway import h2 as gateway_h2

    AVAILABLE = gateway_h2.available()
    if AVAILABLE:
        from gateway.config.security import Limits
        from gateway.frontend.h2calls import _STREAM_QUEUE_BYTES, Call
        from gateway.frontend.h2listen import H2Listener
        from gateway.frontend.h2session import H2Connection
        from gateway.h2 import _h2

__all__ = ["AVAILABLE", "UNAVAILABLE", "one_input"]

UNAVAILABLE = ("fuzz.h2_listen: gateway.h2._h2 is not built (install libnghttp2-dev and reinstall the package): "
               "there is no HTTP/2 listener to fuzz")

SERVICE = "inference.GRPCInferenceService"
ECHO = f"/{SERVICE}/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
MAX_FRAME = 16384  # nghttp2's DATA payload and both sides' default SETTINGS_MAX_FRAME_SIZE
SMALL = {"limits": dict(max_grpc_streams=4, body_timeout_s=1.0, idle_timeout_s=2.0), "max_message_bytes": 64,
         "max_metadata_bytes": 1024, "max_header_count": 10}
DEFAULT = {"limits": {}, "max_message_bytes": 256 * 1024 * 1024, "max_metadata_bytes": 32768,
           "max_header_count": 100}
HIGH_WATER = 4096  # the small transport buffer (bit 6)
READ_SPINS = 2  # loop iterations after each read
END_SPINS = 10  # after the last read, and after the connection is lost: every hop of a call's answer
# Reads per input: each is a feed and loop iterations, so a large input in small reads would take
# seconds; past this many the rest comes in one read.
MAX_READS = 256


# ---------------------------------------------------------------------------- the handlers
async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _abort(request: bytes, context: Any) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such model: é 100%",
                        (("x-reason", "fuzz"), ("x-detail-bin", b"\x00\xff")))
    raise AssertionError("abort returned")


async def _hang(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(10**6)
    return request


async def _stream_echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


HANDLERS = (grpc.method_handlers_generic_handler(SERVICE, {
    "ModelInfer": grpc.unary_unary_rpc_method_handler(_echo),
    "ServerLive": grpc.unary_unary_rpc_method_handler(_abort),
    "ModelReady": grpc.unary_unary_rpc_method_handler(_hang),
    "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_stream_echo),
}),)


# ---------------------------------------------------------------------------- below the network
class Loop(asyncio.SelectorEventLoop):
    """An event loop whose clock only the harness moves, so timers fire the same way every run."""

    def __init__(self) -> None:
        self.clock = 1000.0
        super().__init__()

    def time(self) -> float:
        return self.clock

    def spin(self, n: int) -> None:
        """Run ``n`` iterations (callbacks scheduled in one run in the next)."""
        def tick(k: int) -> None:
            if k:
                self.call_soon(tick, k - 1)
            else:
                self.stop()

        self.call_soon(tick, n - 1)
        self.run_forever()


def watched_loop() -> tuple[Loop, list[dict[str, Any]], list[asyncio.Task[Any]]]:
    """A loop, what reached its exception handler, and every task made on it."""
    loop = Loop()
    errors: list[dict[str, Any]] = []
    tasks: list[asyncio.Task[Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    def factory(lp: asyncio.AbstractEventLoop, coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
                **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=lp, **kwargs)
        tasks.append(task)
        return task

    loop.set_task_factory(factory)
    return loop, errors, tasks


def loop_errors(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{e.get('message')}: {e.get('exception')!r}" for e in errors)


class Transport:
    """What the protocol calls on its transport, recorded. ``close`` / ``abort`` end the
    connection as asyncio's transports do: ``connection_lost(None)`` on the next iteration."""

    def __init__(self, loop: asyncio.AbstractEventLoop, high_water: int | None = None) -> None:
        self.loop = loop
        self.protocol: Any = None
        self.out = bytearray()
        self.closing = False
        self.eof = False
        self.reading_paused = False
        self.writing_paused = False
        self.unsent = 0
        self.high_water = high_water

    def write(self, data: Any) -> None:
        if self.eof:
            raise RuntimeError("Cannot call write() after write_eof()")  # as asyncio's transports
        self.out += data
        self.unsent += memoryview(data).nbytes
        if self.high_water is not None and not self.writing_paused and self.unsent > self.high_water:
            self.writing_paused = True
            self.protocol.pause_writing()

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def drain(self) -> None:
        """The peer read everything: writing resumes."""
        self.unsent = 0
        if self.writing_paused:
            self.writing_paused = False
            self.protocol.resume_writing()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    abort = close

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False


def frame_reads(data: bytes) -> list[bytes]:
    """``data`` cut as a peer writes it: the preface alone (when it starts with it), then each
    whole frame, then what is left."""
    out, pos = [], 0
    if data.startswith(PREFACE):
        out.append(PREFACE)
        pos = len(PREFACE)
    while pos + 9 <= len(data):
        end = pos + 9 + int.from_bytes(data[pos:pos + 3], "big")
        out.append(data[pos:end])
        pos = end
    if pos < len(data):
        out.append(data[pos:])
    return out


def starts_with_settings(data: bytes) -> bool:
    """Whether ``data`` starts with a SETTINGS frame that is no ACK: a peer's preface."""
    return len(data) >= 9 and data[3] == 4 and not data[4] & 1


def read_sizes(flags: int, data: bytes) -> list[int] | None:
    """Bits 0-1 of ``flags``: [] one read, None frame by frame, else the sizes, cycled."""
    mode = flags & 3
    if mode == 0:
        return []
    if mode == 1:
        return None
    if mode == 2:
        return [data[1] + 1]
    return [b + 1 for b in data[1:4]]


def cut(data: bytes, sizes: list[int] | None) -> list[bytes]:
    """``data`` in reads (see read_sizes), at most MAX_READS: the last takes what is left."""
    if sizes is None:
        out = frame_reads(data)
    elif not sizes:
        out = [data] if data else []
    else:
        out, pos, i = [], 0, 0
        while pos < len(data) and len(out) < MAX_READS:
            out.append(data[pos:pos + sizes[i % len(sizes)]])
            pos += sizes[i % len(sizes)]
            i += 1
        if pos < len(data):
            out.append(data[pos:])
    if len(out) > MAX_READS:
        out[MAX_READS - 1:] = [b"".join(out[MAX_READS - 1:])]
    return out


@dataclass
class Frame:
    kind: int
    flags: int
    sid: int
    payload: bytes


def frames_of(data: bytes | bytearray, start: int = 0) -> list[Frame]:
    """The frames of an output, which must be whole."""
    out, pos = [], start
    while pos < len(data):
        check(pos + 9 <= len(data), f"the output ends inside a frame header ({len(data) - pos} bytes)")
        n = int.from_bytes(data[pos:pos + 3], "big")
        check(pos + 9 + n <= len(data), f"the output ends inside a frame ({len(data) - pos - 9} of {n} bytes)")
        out.append(Frame(data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                         bytes(data[pos + 9:pos + 9 + n])))
        pos += 9 + n
    return out


def unpadded(f: Frame) -> bytes:
    """A DATA or HEADERS frame's fragment (padding and priority fields removed)."""
    p = f.payload
    if f.flags & 0x8:
        pad = p[0]
        check(pad < len(p), "padding longer than the frame")
        p = p[1:len(p) - pad]
    if f.kind == 1 and f.flags & 0x20:
        p = p[5:]
    return p


@dataclass
class WireStream:
    """One stream as the output shows it."""

    blocks: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False  # END_STREAM went out
    reset: bool = False  # RST_STREAM went out


def read_output(data: bytes | bytearray, start: int, allowed: set[int]) -> dict[int, WireStream]:
    """Walk an output of frames (from ``start``: past a client's magic) and check it (see the
    module docstring); ``allowed``: stream ids HEADERS / DATA may go on."""
    frames = frames_of(data, start)
    if frames:
        check(frames[0].kind == 4 and not frames[0].flags & 1, f"the output starts with frame type {frames[0].kind}")
    decoder = hpack.Decoder()
    streams: dict[int, WireStream] = {}
    block: tuple[int, bytearray, bool] | None = None  # (sid, fragments, END_STREAM) of an open header block
    for f in frames:
        where = f"frame type {f.kind} flags {f.flags:#x} on stream {f.sid}"
        check(len(f.payload) <= MAX_FRAME, f"{where}: {len(f.payload)} bytes")
        check(f.kind <= 9 and f.kind != 5, f"{where}: not a frame this side sends")
        check(block is None or (f.kind == 9 and f.sid == block[0]), f"{where}: inside a header block")
        if f.kind in (4, 6, 7):
            check(f.sid == 0, f"{where}: a connection frame on a stream")
            continue
        if f.kind == 8 and f.sid == 0:
            continue
        check(f.sid % 2 == 1, f"{where}: a stream frame on an even or zero stream id")
        s = streams.setdefault(f.sid, WireStream())
        if f.kind in (0, 1):
            check(f.sid in allowed, f"{where}: on a stream the app never used")
            check(not s.ended and not s.reset, f"{where}: after the stream ended")
        if f.kind == 0:
            check(bool(s.blocks), f"{where}: DATA before HEADERS")
            s.data += unpadded(f)
            s.ended = bool(f.flags & 1)
        elif f.kind == 1 or f.kind == 9:
            if f.kind == 1:
                block = (f.sid, bytearray(), bool(f.flags & 1))
            check(block is not None, f"{where}: CONTINUATION without HEADERS")
            assert block is not None
            block[1].extend(unpadded(f) if f.kind == 1 else f.payload)
            if f.flags & 0x4:
                try:
                    fields = [(bytes(k), bytes(v)) for k, v in decoder.decode(bytes(block[1]), raw=True)]
                except Exception as exc:
                    raise FuzzBug(f"{where}: a header block that does not HPACK-decode: {exc!r}") from exc
                s.blocks.append(fields)
                s.ended = block[2]
                block = None
        elif f.kind == 3:
            s.reset = True
    check(block is None, "the output ends inside a header block")
    return streams


class Recorder:
    """Stands where a connection's nghttp2 session stands: every call passes through; the
    events it produced, and how the app ended each stream, are kept."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.heads: dict[int, list[tuple[bytes, bytes]]] = {}
        self.closed: set[int] = set()  # CLOSE events
        self.ended: set[int] = set()  # the app ended the stream (answered or reset it)
        self.sent: dict[int, bytearray] = {}  # DATA the app queued, per stream
        self.answers: dict[int, tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]] | None]] = {}
        self.requested: set[int] = set()  # streams the app opened (a client)
        self.saw_dead = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def see(self, events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        for ev in events:
            if ev[0] == _h2.HEAD:
                self.heads[ev[1]] = list(ev[2])
            elif ev[0] == _h2.CLOSE:
                self.closed.add(ev[1])
            elif ev[0] == _h2.DEAD:
                self.saw_dead = True
        return events

    def feed(self, data: Any, nbytes: int | None = None) -> list[tuple[Any, ...]]:
        return self.see(self.inner.feed(data) if nbytes is None else self.inner.feed(data, nbytes))

    def poll(self) -> list[tuple[Any, ...]]:
        return self.see(self.inner.poll())

    def request(self, headers: Any, body: Any = None, end: bool = True) -> int:
        sid = int(self.inner.request(headers, body, end))
        self.requested.add(sid)
        return sid

    def respond(self, sid: int, headers: Any, body: Any = None, trailers: Any = None) -> bool:
        ok = bool(self.inner.respond(sid, headers, body, trailers))
        self.ended.add(sid)
        if ok:
            self.answers[sid] = (list(headers), None if trailers is None else list(trailers))
            if body is not None:
                self.sent.setdefault(sid, bytearray()).extend(body)
        return ok

    def send_headers(self, sid: int, headers: Any, end: bool = False) -> bool:
        ok = bool(self.inner.send_headers(sid, headers, end))
        if end:
            self.ended.add(sid)
        if ok:
            self.answers[sid] = (list(headers), None)
        return ok

    def send_data(self, sid: int, data: Any, end: bool = False) -> bool:
        ok = bool(self.inner.send_data(sid, data, end))
        if end:
            self.ended.add(sid)
        if ok:
            self.sent.setdefault(sid, bytearray()).extend(data)
        return ok

    def send_trailers(self, sid: int, headers: Any) -> bool:
        ok = bool(self.inner.send_trailers(sid, headers))
        self.ended.add(sid)
        if ok and sid in self.answers:
            self.answers[sid] = (self.answers[sid][0], list(headers))
        return ok

    def reset(self, sid: int, code: int = 8) -> bool:
        self.ended.add(sid)
        return bool(self.inner.reset(sid, code))


class ErrorLog(logging.Handler):
    """What the listener logs at ERROR or above (an unexpected exception in a call)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_LOG = ErrorLog()
logging.getLogger("oip_gateway.grpc").addHandler(_LOG)  # (warnings go there too, and no further: quiet runs)


# ---------------------------------------------------------------------------- the reference
@dataclass
class Sent:
    """One stream as the h2 package, as a server, read the client's bytes."""

    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: bool = False


def h2_requests(stream: bytes) -> tuple[dict[int, Sent], bool] | None:
    """What h2 reads in ``stream``: its requests, and whether the client sent GOAWAY; None when
    h2 refuses the bytes or a frame it could not take apart (not a well-formed exchange)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=False, header_encoding=None, normalize_inbound_headers=False))
    conn.initiate_connection()
    conn.data_to_send()
    sent: dict[int, Sent] = {}
    goaway = False
    if not starts_with_settings(stream[len(PREFACE):]):
        return None  # (h2 takes any frame first; nghttp2, rightly, only SETTINGS)
    for piece in frame_reads(stream):
        try:
            events = conn.receive_data(piece)
        except Exception:
            return None
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                sent[ev.stream_id or 0] = Sent([(bytes(k), bytes(v)) for k, v in ev.headers or ()])
            elif isinstance(ev, h2.events.DataReceived):
                s = sent.get(ev.stream_id or 0)
                if s is not None:
                    s.body += ev.data or b""
                if ev.flow_controlled_length:
                    try:
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id or 0)
                    except Exception:
                        pass  # (a stream already closed: the connection's window is what matters)
            elif isinstance(ev, h2.events.StreamEnded):
                if ev.stream_id in sent:
                    sent[ev.stream_id].ended = True
            elif isinstance(ev, h2.events.StreamReset):
                if ev.stream_id in sent:
                    sent[ev.stream_id].reset = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                goaway = True
        # h2 resets a stream for a stream error without raising: read its own output for that
        for f in frames_of(conn.data_to_send()):
            if f.kind == 3 and f.sid in sent:
                sent[f.sid].reset = True
    return sent, goaway


# Header fields both HTTP/2 implementations take as they are: a lowercase token name, a visible
# ASCII value without spaces at its ends (nghttp2 resets a stream for the others; h2 takes some).
HEADER_NAME = re.compile(rb"[a-z0-9!#$%&'*+.^_`|~-]+\Z")
HEADER_VALUE = re.compile(rb"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?\Z")
_ONCE = (b"content-type", b"grpc-encoding", b"te")
_AUTHORITY = re.compile(rb"[A-Za-z0-9.:\[\]-]+\Z")


def expected_echo(s: Sent, limits: dict[str, Any]) -> bytes | None:
    """The message a complete unary call to the echo method must get back, or None where the
    gateway may refuse it or need not answer it."""
    if not s.ended or s.reset:
        return None
    names = [k for k, _ in s.headers]
    fields = dict(s.headers)
    size = sum(len(k) + len(v) + 32 for k, v in s.headers)
    if size > limits["max_metadata_bytes"] or len(s.headers) > max(limits["max_header_count"], 16):
        return None
    if any(names.count(n) > 1 for n in names if n.startswith(b":") or n in _ONCE):
        return None
    for k, v in s.headers:
        if k.startswith(b":"):
            if k not in (b":method", b":scheme", b":path", b":authority"):
                return None
        elif not HEADER_NAME.match(k) or k.endswith(b"-bin") or k in (b"grpc-timeout", b"content-length"):
            return None
        if not HEADER_VALUE.match(v) or (k == b"te" and v != b"trailers"):
            return None
    if (fields.get(b":method") != b"POST" or fields.get(b":path") != ECHO.encode()
            or fields.get(b":scheme") not in (b"http", b"https") or fields.get(b"content-type") != b"application/grpc"
            or (b":authority" in fields and not _AUTHORITY.match(fields[b":authority"]))):
        return None
    body = bytes(s.body)
    limit = limits["max_message_bytes"]
    if len(body) < 5 or body[0] > 1 or int.from_bytes(body[1:5], "big") != len(body) - 5 or len(body) - 5 > limit:
        return None
    message = body[5:]
    if body[0] == 0:
        return message
    encoding = fields.get(b"grpc-encoding", b"")
    if encoding not in (b"gzip", b"deflate"):
        return None
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(message, limit + 1)
    except zlib.error:
        return None
    if len(out) > limit or not d.eof or d.unused_data:
        return None
    return out


# ---------------------------------------------------------------------------- the run
@dataclass
class Run:
    flags: int
    limits: dict[str, Any]
    stream: bytes
    sizes: list[int] | None


def _held(call: Call) -> int:
    held = call.reader.pending + sum(len(m) for m in call.messages)
    return held + (call.requests.queued if call.requests is not None else 0)


def _bound(call: Call, limit: int) -> int:
    if call.requests is None:
        return 2 * limit + 5  # one whole request message and the beginning of another
    return limit + 5 + _STREAM_QUEUE_BYTES + (1 << 20)  # the queue, and one window of DATA past it


def _answered_with(rec: Recorder, sid: int) -> tuple[bytes | None, bytes | None]:
    """(the message, grpc-status) the app answered stream ``sid`` with."""
    answer = rec.answers.get(sid)
    if answer is None:
        return None, None
    head, trailers = answer
    status = dict(trailers or head).get(b"grpc-status")
    data = bytes(rec.sent.get(sid, b""))
    message = data[5:] if len(data) >= 5 and int.from_bytes(data[1:5], "big") == len(data) - 5 else None
    return message, status


def drive(run: Run) -> None:
    flags = run.flags
    loop, errors, tasks = watched_loop()
    _LOG.records.clear()
    limits = run.limits
    try:
        listener = H2Listener(HANDLERS, limits=Limits(**limits["limits"]),
                              max_message_bytes=limits["max_message_bytes"],
                              max_metadata_bytes=limits["max_metadata_bytes"],
                              max_header_count=limits["max_header_count"])
        conn = H2Connection(listener, loop)
        rec = Recorder(conn.h2)
        conn.h2 = cast(Any, rec)
        transport = Transport(loop, HIGH_WATER if flags & 64 else None)
        transport.protocol = conn
        conn.connection_made(cast(asyncio.Transport, transport))
        for i, piece in enumerate(cut(run.stream, run.sizes)):
            if transport.closing:
                break
            if transport.reading_paused:
                transport.drain()
                loop.spin(READ_SPINS)
                check(transport.closing or not transport.reading_paused,
                      "reading stays paused with the transport's buffer empty")
                if transport.closing:
                    break
            conn.data_received(piece)
            if flags & 16:
                loop.clock += 0.5
            loop.spin(READ_SPINS)
            if i == 0 and flags & 128 and not transport.closing:
                conn.drain()
            transport.drain()
        loop.spin(END_SPINS)
        transport.drain()
        if flags & 32:
            loop.clock += 100.0
            loop.spin(END_SPINS)
            transport.drain()
            loop.spin(END_SPINS)
        check(not errors, f"the loop's exception handler was called: {loop_errors(errors)}")

        # -- the bytes ran out
        calls = dict(conn.calls)
        check(len(calls) <= listener.limits.max_grpc_streams, f"{len(calls)} calls open on one connection")
        held = 0
        for sid, call in calls.items():
            check(not call.answered, f"stream {sid}: an answered call is still on the connection")
            check(call.task is None or not call.task.done(), f"stream {sid}: a call whose task ended is still open")
            check(sid not in rec.closed, f"stream {sid}: a call reset by the client is still open")
            n = _held(call)
            check(n <= _bound(call, listener.max_message_bytes),
                  f"stream {sid}: {n} bytes held for a {'unary' if call.requests is None else 'streaming'} call "
                  f"({len(call.messages)} whole messages, {call.reader.pending} of one more) with "
                  f"max_message_bytes {listener.max_message_bytes}")
            held += n
        check(held <= sum(_bound(c, listener.max_message_bytes) for c in calls.values()), f"{held} bytes held")
        if not transport.closing:
            for sid in rec.heads:
                check(sid in rec.ended or sid in rec.closed or sid in calls,
                      f"stream {sid}: its call was neither answered, reset nor pending")
        wire = read_output(transport.out, 0, set(rec.heads))
        for sid, ws in wire.items():
            if ws.ended:
                check(bytes(ws.data) == bytes(rec.sent.get(sid, b"")),
                      f"stream {sid}: {len(ws.data)} bytes of DATA went out, the app queued "
                      f"{len(rec.sent.get(sid, b''))}")

        # -- the differential
        if not flags & (16 | 128) and not rec.saw_dead:
            ref = h2_requests(run.stream)
            if ref is not None:
                sent, goaway = ref
                if not goaway and len(sent) <= listener.limits.max_grpc_streams:
                    for sid, s in sent.items():
                        want = expected_echo(s, limits)
                        if want is None:
                            continue
                        got, status = _answered_with(rec, sid)
                        check(status == b"0" and got == want,
                              f"stream {sid}: a unary echo call of {len(want)} bytes was answered with "
                              f"grpc-status {status!r} and {None if got is None else len(got)} bytes "
                              f"(head seen: {sid in rec.heads}, reset by the client: {sid in rec.closed})")

        # -- the connection is lost
        if not transport.closing:
            transport.closing = True
            conn.connection_lost(None)
        loop.spin(END_SPINS)
        check(not errors, f"the loop's exception handler was called: {loop_errors(errors)}")
        check(not conn.calls, f"calls left after the connection was lost: {sorted(conn.calls)}")
        check(not listener.connections, "the listener still holds the connection")
        for task in tasks:
            check(task.done(), f"a task outlived its connection: {task!r}")
            if not task.cancelled() and task.exception() is not None:
                raise FuzzBug(f"a call's task raised: {task.exception()!r}") from task.exception()
        if _LOG.records:
            r = _LOG.records[0]
            exc = r.exc_info[1] if r.exc_info else None
            raise FuzzBug(f"the listener logged {r.getMessage()!r}: {exc!r}") from exc
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        if tasks:
            loop.spin(2)
        loop.close()


def one_input(data: bytes) -> None:
    if not AVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    if len(data) < 4:
        return
    flags = data[0]
    stream = data[4:]
    if flags & 4:
        stream = PREFACE + EMPTY_SETTINGS + stream
    drive(Run(flags, SMALL if flags & 8 else DEFAULT, stream, read_sizes(flags, data)))


if __name__ == "__main__":
    if not AVAILABLE:
        sys.exit(UNAVAILABLE)
    run(one_input)
