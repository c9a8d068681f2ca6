"""Fuzz target: a gRPC backend's bytes as the gateway's own HTTP/2 client reads them
(gateway/backends/h2channel.py: a ``Channel``'s connection, h2conn.py's ``ChannelConnection`` on
gateway.h2._h2), driven below the network: the connection is made on a fake transport and put in
the channel, one or two ``Channel.unary`` calls run on it (stream 1, and stream 3 with a request large enough to go
out apart from its prefix), and the bytes are fed through ``get_buffer`` / ``buffer_updated``
on an event loop whose clock the harness moves. The channel opens no other connection (its next
connect attempt is never due), so a call that would need one fails.

Input layout:

- byte 0, flags: bits 0-1 how the bytes are cut into reads — 0 one read, 1 one HTTP/2 frame a
  read, 2 reads of byte 1's size (+1), 3 reads of the sizes in bytes 1-3 (+1 each), cycled; at
  most 256 reads, the last taking what is left. Bit 2: the server's preface (an empty SETTINGS,
  and the ACK of the client's) goes first. Bit 3: ``max_message_bytes`` 64 instead of the
  default (256 MiB). Bit 4: two calls instead of one (the second gathers its answer, as a
  converting caller does). Bit 5: the calls have a 2 s deadline.
  Bit 6: the clock moves 1 s after each read. Bit 7: after the bytes, the clock jumps past the
  keepalive (a PING), then past its timeout, and past any deadline.
- bytes 1-3: the read sizes (see bits 0-1).
- the rest: the backend's bytes.

Checks (any other exception, or a FuzzBug, is a bug):

- nothing escapes the protocol's callbacks or the loop's (its exception handler counts as an
  escape); when the bytes run out, a call that ended has an answer of at most
  ``max_message_bytes`` or a CallError; after the connection is lost every call has ended, so,
  the connection holds no call and the channel no longer lists it;
- the client's output is its preface and then whole HTTP/2 frames (see fuzz/h2_listen.py);
- differential, against the ``h2`` package as a client that made the same requests and is fed
  the same bytes: when it reads a complete, well-formed answer on a call's stream (status 200,
  ``content-type: application/grpc``, at most one message within the limit, gzip / deflate
  decompressed, trailers with one valid ``grpc-status``), the call ends with that message
  (status 0) or with a CallError of that status (any other), and no fault.
"""
from __future__ import annotations

import asyncio
import math
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, cast

import h2.config
import h2.connection
import h2.events

from fuzz._support import FuzzBug, check, instrumented, run

with instrumented(__name__ == "__main__", ("gateway",)):
    # (inside the block: fuzz.h2_listen imports gateway modules this harness runs too)
    from fuzz.h2_listen import (
        AVAILABLE,
        HEADER_NAME,
        HEADER_VALUE,
        PREFACE,
        Recorder,
        Transport,
        cut,
        frame_reads,
        loop_errors,
        read_output,
        read_sizes,
        starts_with_settings,
        watched_loop,
    )

    if AVAILABLE:
        from gateway.backends.h2channel import CallError, Channel
        from gateway.backends.h2conn import ChannelConnection
        from gateway.backends.h2frames import STATUS_NAMES
        from gateway.config.network import HostPort

__all__ = ["AVAILABLE", "METHOD", "REQUESTS", "SMALL_REQUESTS", "UNAVAILABLE", "one_input"]

UNAVAILABLE = ("fuzz.h2_answer: gateway.h2._h2 is not built (install libnghttp2-dev and reinstall the package): "
               "there is no HTTP/2 client to fuzz")

METHOD = "/inference.GRPCInferenceService/ModelInfer"
# The two calls' request messages; with the default limit the second is over h2stream.SMALL_BODY
# (1024), so it goes out apart from its prefix; with the small one it fits the limit.
REQUESTS = (b"\x0a\x07add_sub", b"\x0a\x07add_sub" + bytes(2000))
SMALL_REQUESTS = (b"\x0a\x07add_sub", b"\x0a\x07add_sub" + bytes(40))
SERVER_PREFACE = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
SMALL_LIMIT = 64
DEFAULT_LIMIT = 256 * 1024 * 1024
HEADER_LIST = 16 * 1024  # the client's limits on a head (h2channel.py _HEADER_LIST, _HEADER_FIELDS)
HEADER_FIELDS = 100
READ_SPINS = 2
END_SPINS = 10


async def _call(channel: Channel, request: bytes, timeout: float | None, gather: int) -> bytes | memoryview:
    return await channel.unary(METHOD, request, timeout, gather=gather)


def _outcome(task: asyncio.Task[bytes | memoryview], limit: int, where: str) -> bytes | CallError | None:
    """A call's end (None: not yet), checked."""
    if not task.done():
        return None
    check(not task.cancelled(), f"{where}: the call was cancelled")
    exc = task.exception()
    if exc is not None:
        if not isinstance(exc, CallError):
            raise FuzzBug(f"{where}: the call raised {exc!r}") from exc
        return exc
    answer = task.result()
    check(isinstance(answer, (bytes, memoryview)), f"{where}: the answer is a {type(answer).__name__}")
    answer = bytes(answer)
    check(len(answer) <= limit, f"{where}: an answer of {len(answer)} bytes, over max_message_bytes {limit}")
    return answer


# ---------------------------------------------------------------------------- the reference
@dataclass
class Answer:
    """One call's stream as the h2 package, as the client, read the backend's bytes."""

    heads: list[tuple[list[tuple[bytes, bytes]], bool]] = field(default_factory=list)  # (head, ended with it)
    body: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[bytes, bytes]] | None = None
    ended: bool = False
    broken: bool = False  # reset, refused, or past a GOAWAY


def h2_answers(stream: bytes, sids: list[int], requests: tuple[bytes, ...]) -> dict[int, Answer] | None:
    """What h2, as a client that sent the harness's requests, reads in ``stream``; None when it
    refuses the bytes (not a well-formed exchange) or reads something the gateway's client
    never allows (a pushed stream)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding=None, normalize_inbound_headers=False))
    conn.initiate_connection()
    answers: dict[int, Answer] = {}
    for sid, request in zip(sids, requests):
        conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"backend:8001"),
                                (b":path", METHOD.encode()), (b"content-type", b"application/grpc"),
                                (b"te", b"trailers")])
        conn.send_data(sid, b"\0" + len(request).to_bytes(4, "big") + request, end_stream=True)
        answers[sid] = Answer()
    conn.data_to_send()
    if not starts_with_settings(stream):
        return None  # (h2 takes any frame first; nghttp2, rightly, only SETTINGS)
    for piece in frame_reads(stream):
        try:
            events = conn.receive_data(piece)
        except Exception:
            return None
        for ev in events:
            a = answers.get(getattr(ev, "stream_id", 0) or 0)
            if isinstance(ev, h2.events.PushedStreamReceived):
                return None
            if isinstance(ev, h2.events.ConnectionTerminated):
                for b in answers.values():
                    b.broken = b.broken or not b.ended
            if a is None:
                continue
            if isinstance(ev, h2.events.InformationalResponseReceived):
                a.heads.append(([(bytes(k), bytes(v)) for k, v in ev.headers or ()], False))
            elif isinstance(ev, h2.events.ResponseReceived):
                a.heads.append(([(bytes(k), bytes(v)) for k, v in ev.headers or ()], ev.stream_ended is not None))
            elif isinstance(ev, h2.events.DataReceived):
                a.body += ev.data or b""
                if ev.flow_controlled_length:
                    try:
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id or 0)
                    except Exception:
                        pass  # (a stream already closed: the connection's window is what matters)
            elif isinstance(ev, h2.events.TrailersReceived):
                a.trailers = [(bytes(k), bytes(v)) for k, v in ev.headers or ()]
            elif isinstance(ev, h2.events.StreamEnded):
                a.ended = True
            elif isinstance(ev, h2.events.StreamReset):
                a.broken = True
    return answers


def _valid_head(fields: list[tuple[bytes, bytes]]) -> bool:
    """A head or trailers both HTTP/2 implementations take as is, within the client's limits."""
    if sum(len(k) + len(v) + 32 for k, v in fields) > HEADER_LIST or len(fields) > HEADER_FIELDS:
        return False
    for k, v in fields:
        if k.startswith(b":"):
            if k != b":status":
                return False
        elif not HEADER_NAME.match(k) or k in (b"content-length", b"te"):
            return False
        if not HEADER_VALUE.match(v):
            return False
    return True


def expected(a: Answer, limit: int) -> bytes | str | None:
    """The message (bytes) or the status name (str) a call must end with, or None where the
    gateway may end it otherwise."""
    if not a.ended or a.broken or not a.heads:
        return None
    final, trailers_only = a.heads[-1]
    if not all(_valid_head(h) for h, _ in a.heads) or (a.trailers is not None and not _valid_head(a.trailers)):
        return None
    names = [k for k, _ in final]
    if names.count(b"content-type") != 1 or names.count(b":status") != 1 or names.count(b"grpc-encoding") > 1:
        return None
    head = dict(final)
    if head[b":status"] != b"200" or head[b"content-type"] != b"application/grpc":
        return None
    ending = final if trailers_only else a.trailers
    if ending is None or [k for k, _ in ending].count(b"grpc-status") != 1:
        return None
    raw = dict(ending)[b"grpc-status"]
    if not raw.isdigit() or len(raw) > 2 or (len(raw) == 2 and raw[0] == 0x30) or int(raw) >= len(STATUS_NAMES):
        return None
    code = STATUS_NAMES[int(raw)]
    body = bytes(a.body)
    if not body:
        return None if code == "OK" else code
    if len(body) < 5 or body[0] > 1 or int.from_bytes(body[1:5], "big") != len(body) - 5 or len(body) - 5 > limit:
        return None
    message = body[5:]
    if body[0] == 1:
        encoding = head.get(b"grpc-encoding", b"")
        if encoding not in (b"gzip", b"deflate"):
            return None
        d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
        try:
            message = d.decompress(message, limit + 1)
        except zlib.error:
            return None
        if len(message) > limit or not d.eof or d.unused_data:
            return None
    return message if code == "OK" else code


# ---------------------------------------------------------------------------- the run
def drive(flags: int, stream: bytes, sizes: list[int] | None) -> None:
    limit = SMALL_LIMIT if flags & 8 else DEFAULT_LIMIT
    requests = (SMALL_REQUESTS if flags & 8 else REQUESTS)[:2 if flags & 16 else 1]
    timeout = 2.0 if flags & 32 else None
    loop, errors, tasks = watched_loop()
    try:
        channel = Channel(HostPort("backend", 8001), None, limit)
        # No second connection: a call that needs one fails at once (CallError) instead.
        channel.retry_at = math.inf
        channel.last_error = "no other connection (fuzz harness)"
        conn = ChannelConnection(channel, loop)
        rec = Recorder(conn.h2)
        conn.h2 = cast(Any, rec)
        transport = Transport(loop)
        transport.protocol = conn
        conn.connection_made(cast(asyncio.Transport, transport))
        channel.conns.append(conn)
        # The second call reads its answer as a converting caller does, gathered into one
        # buffer (h2stream.Gathered) from its first byte on.
        calls = [loop.create_task(_call(channel, r, timeout, i)) for i, r in enumerate(requests)]
        loop.spin(READ_SPINS)
        sids = sorted(conn.calls)
        check(len(sids) == len(calls), f"{len(calls)} calls made {len(sids)} streams")
        for piece in cut(stream, sizes):
            while piece and not transport.closing:
                buf = conn.get_buffer(len(piece))
                n = min(len(buf), len(piece))
                check(n > 0, "get_buffer gave an empty buffer")
                buf[:n] = piece[:n]
                piece = piece[n:]
                conn.buffer_updated(n)
            if transport.closing:
                break
            if flags & 64:
                loop.clock += 1.0
            loop.spin(READ_SPINS)
        loop.spin(END_SPINS)
        if flags & 128:
            for step in (31.0, 31.0, 11.0):  # past keepalive_s (30): a PING; past keepalive_timeout_s (10)
                loop.clock += step
                loop.spin(END_SPINS)
        check(not errors, f"the loop's exception handler was called: {loop_errors(errors)}")

        # -- the bytes ran out
        outcomes = [_outcome(t, limit, f"call {i}") for i, t in enumerate(calls)]
        read_output(transport.out, len(PREFACE), rec.requested)
        check(bytes(transport.out[:len(PREFACE)]) == PREFACE, "the client's output does not start with the preface")

        # -- the differential
        if not (flags & 32 and flags & (64 | 128)) and not rec.saw_dead:
            ref = h2_answers(stream, sids, requests)
            if ref is not None:
                for i, sid in enumerate(sids):
                    want = expected(ref[sid], limit)
                    if want is None:
                        continue
                    got = outcomes[i]
                    where = f"call {i} (stream {sid})"
                    if isinstance(want, bytes):
                        check(got == want, f"{where}: a well-formed answer of {len(want)} bytes, status OK, ended "
                                           f"the call with {got!r:.300}")
                    else:
                        check(isinstance(got, CallError) and got.code == want and got.fault is None,
                              f"{where}: a well-formed answer with status {want} ended the call with {got!r:.300}")

        # -- the connection is lost
        if not transport.closing:
            transport.closing = True
            conn.connection_lost(None)
        loop.spin(END_SPINS)
        check(not errors, f"the loop's exception handler was called: {loop_errors(errors)}")
        for i, t in enumerate(calls):
            check(_outcome(t, limit, f"call {i}") is not None, f"call {i} has not ended after the connection was lost")
        check(not conn.calls, f"streams left on a lost connection: {sorted(conn.calls)}")
        check(conn not in channel.conns and conn not in channel.draining, "the channel still lists a lost connection")
        for task in tasks:
            check(task.done(), f"a task outlived its connection: {task!r}")
            if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(), CallError):
                raise FuzzBug(f"a task raised: {task.exception()!r}") from task.exception()
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
        stream = SERVER_PREFACE + stream
    drive(flags, stream, read_sizes(flags, data))


if __name__ == "__main__":
    if not AVAILABLE:
        sys.exit(UNAVAILABLE)
    run(one_input)
