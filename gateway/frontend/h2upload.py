"""A large unary ModelInfer request streamed on as it arrives (dataplane.StreamedMessage), on the
gateway's own HTTP/2 listener (frontend/h2calls.py makes one).

A request whose length prefix announces RELAY_MIN bytes or more, and whose first DATA holds its
head (the fields before raw_input_contents, codec/grpcstream.py), is handed to its handler at
once: the handler routes it from the head while the rest arrives. Its bytes then go to the
backend call that ``attach``es (a MessagePipe) as they come, and the client's flow-control window
reopens only as that call's stream takes them, so a slow backend slows the client and the
gateway holds about a window of the request, never the whole message (gRPC over HTTP/2 has no
other bound: a message may be max_message_bytes, 256 MiB by default).

What passes is checked on the way (codec/grpcstream.TailWalker): a routing field after the raw
contents, a field past the end, more bytes than the prefix said, or a stream that ends inside the
message fail the call with the client's error — and since a chunk is checked before it goes on,
the backend never receives a whole message the gateway refused: its stream is reset first.

A retry on another endpoint sends the message again only while all of it that went on is still
kept (the first REWIND_MAX bytes, while the connection's request budget has room: H2Connection.keep);
past that, a failed attempt is final. A message read whole instead (``read()``: a mirror, an HTTP
pool, grpcio's client) is held as any unary request is, within that budget.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..codec.grpcstream import TailWalker
from ..dataplane import SINK_FULL, SINK_GONE, MessagePipe
from ..errors import GatewayError, InvalidRequest, MalformedMessage
from ..rawbody import new_buffer

if TYPE_CHECKING:
    from .h2calls import Call

__all__ = ["REWIND_MAX", "STREAM_MIN", "Compressed", "Upload"]

# A request message this large is streamed on (when its head is in its first DATA); a smaller
# one is received whole (one hand-over, no per-piece work).
STREAM_MIN = 256 * 1024

# What of a streamed request is kept to send it again (a retry, another endpoint): a retry is
# for a backend that refused before reading much; past this it would mean holding the message.
REWIND_MAX = 1 << 20


class Upload:
    """One call's streamed request message. ``first`` is its first DATA (length prefix
    included), ``at`` where the head ends in it, ``size`` the message's length."""

    __slots__ = ("call", "chunks", "encoding", "error", "filled", "full", "head", "into", "kept", "pipe", "pushed",
                 "reading", "received", "resendable", "size", "waiter", "walker", "whole")

    def __init__(self, call: Call, first: bytes, at: int, size: int) -> None:
        self.call = call
        self.size = size
        self.head = first[5:at]
        self.encoding = b""  # (only uncompressed messages stream: Call.streamed)
        self.whole = False
        self.walker = TailWalker(size - (at - 5))
        self.chunks: list[bytes] = []  # received and not dropped: all of it while resendable
        self.pushed = 0  # chunks handed to the current pipe
        self.received = 0  # bytes of the message's frame received (its prefix included)
        self.resendable = True
        self.kept = 0  # bytes that went on and are kept to resend, counted in the connection's budget
        self.pipe: MessagePipe | None = None
        self.error: GatewayError | None = None
        self.full = False  # the pipe has enough for now: the client waits for resume()
        self.reading = False  # read(): the whole message is wanted, the window reopens as it comes
        self.into: memoryview | None = None  # read(): the message's buffer, filled as DATA comes
        self.filled = 0
        self.waiter: asyncio.Future[None] | None = None
        self.add(first, at)

    def __len__(self) -> int:
        return self.size

    @property
    def complete(self) -> bool:
        return self.received == self.size + 5

    # -- the listener's side ----------------------------------------------------------------
    def add(self, data: bytes, tail: int = 0) -> None:
        """DATA of the call (``tail``: where the part after the head begins in it, for the first)."""
        if self.error is not None:
            self._ack()  # dropped: the call is failing
            return
        if self.received + len(data) > self.size + 5:
            self.fail(MalformedMessage("a unary call carries one request message; this one sent more"))
            return
        problem = self.walker.feed(data[tail:] if tail else data)
        if problem is not None:
            self.fail(InvalidRequest(problem))
            return
        self.received += len(data)
        into = self.into
        if into is not None:  # (read whole: each piece goes where it belongs, and is let go)
            n = len(data)
            into[self.filled:self.filled + n] = data
            self.filled += n
        else:
            self.chunks.append(data)
        if self.resendable and (self.received > REWIND_MAX or (self.pipe is not None and not self._keep(len(data)))):
            self._forget()
        if self.pipe is not None:
            self._pump()
        elif self.reading:
            self._ack()
        if self.complete:
            self._wake()

    def ended(self) -> None:
        """The client's side of the stream ended."""
        if not self.complete and self.error is None:
            self.fail(MalformedMessage(f"the request ended inside a message ({self.received} bytes of it "
                                       "received)"))

    def fail(self, error: GatewayError) -> None:
        """The message cannot go on: the backend call (if any) ends with the client's ``error``."""
        if self.error is not None:
            return
        self.error = error
        self.chunks.clear()
        self.into = None
        self.pushed = 0
        self._forget()
        self._ack()
        if self.pipe is not None:
            self.pipe.fail(error)
        self._wake()

    def stalled(self) -> bool:
        """Whether the client, with its window open, is not sending (the sweep's question)."""
        return self.error is None and not self.complete and not self.call.unconsumed

    # -- the backend call's side (dataplane.StreamedMessage) ---------------------------------
    def attach(self, pipe: MessagePipe) -> bool:
        if self.error is not None:
            raise self.error
        if self.pipe is not None or self.reading:
            if not self.resendable or self.reading:
                return False
            self.pushed = 0
        first = self.pipe is None
        self.pipe = pipe
        self.full = False
        if first and self.resendable and not self._keep(self.received):
            self._forget()  # (the connection's budget is spent: it goes on, not kept)
        self._pump()
        return True

    def resume(self) -> None:
        self.full = False
        self._ack()

    async def read(self) -> bytes | memoryview:
        """The whole message, gathered into one buffer of its size as it arrives: what came
        before is copied in now, the rest piece by piece as it comes, each piece let go at once
        (joined at the end, the pieces and the message were both held: twice the message)."""
        if self.pipe is not None:
            raise RuntimeError("a streamed request went on already")
        if self.error is not None:
            raise self.error
        self.reading = True
        into = self.into = new_buffer(self.size)  # (not zero-filled: every byte is written)
        filled = 0
        for i, chunk in enumerate(self.chunks):
            piece = memoryview(chunk)[5:] if i == 0 else chunk  # (the first carries the length prefix)
            into[filled:filled + len(piece)] = piece
            filled += len(piece)
        self.filled = filled
        self.chunks.clear()
        self._ack()
        while not self.complete and self.error is None:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        if self.error is not None:
            raise self.error
        self.into = None
        return into

    # -- inside -------------------------------------------------------------------------------
    def _keep(self, n: int) -> bool:
        if self.call.conn.keep(self.call, n):
            self.kept += n
            return True
        return False

    def _forget(self) -> None:
        """Nothing more is kept to resend: what went on is dropped (read() keeps all: nothing went)."""
        if self.reading:
            return
        self.resendable = False
        del self.chunks[:self.pushed]
        self.pushed = 0
        if self.kept:
            self.call.conn.release(self.call, self.kept)
            self.kept = 0

    def _pump(self) -> None:
        pipe = self.pipe
        assert pipe is not None
        chunks = self.chunks
        last = len(chunks) - 1
        if self.pushed > last:
            return
        state = SINK_GONE
        complete = self.complete
        while self.pushed <= last:
            i = self.pushed
            self.pushed = i + 1
            state = pipe.push(chunks[i], complete and i == last)
            if state == SINK_GONE:
                break
        if not self.resendable:
            del chunks[:self.pushed]
            self.pushed = 0
        self.full = state == SINK_FULL
        if not self.full:
            self._ack()

    @property
    def receiving_whole(self) -> bool:
        """Being read whole (``read()``) and not all here yet."""
        return self.reading and self.error is None and not self.complete

    def _ack(self) -> None:
        call = self.call
        if self.reading and self.error is None:
            # Read whole, it is held as any unary request is: within the connection's budget
            # (H2Connection.may_hold), so streams of one connection cannot each park a message.
            call.taken()
            return
        n = call.unconsumed
        if n:
            call.unconsumed = 0
            call.conn.consume(call.sid, n)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class Compressed:
    """A unary ModelInfer request that came compressed (``grpc-encoding`` gzip or deflate, the
    message's compressed flag set): routed from its inflated bytes (``head``: all of them) and
    sent on as it came, compressed, with its encoding, so the backend reads what the client wrote
    (a dataplane.StreamedMessage). A mirror, a converting path and grpcio's client take the
    inflated message (``read()``)."""

    __slots__ = ("encoding", "head", "resendable", "whole", "wire")

    def __init__(self, inflated: bytes, wire: bytes, encoding: bytes) -> None:
        self.head = inflated
        self.wire = wire
        self.encoding = encoding
        self.whole = True
        self.resendable = True

    def __len__(self) -> int:
        return len(self.head)

    def attach(self, pipe: MessagePipe) -> bool:
        wire = self.wire
        pipe.push(b"\x01" + len(wire).to_bytes(4, "big"), False)
        pipe.push(wire, True)
        return True

    def resume(self) -> None:
        pass

    async def read(self) -> bytes:
        return self.head
