"""A lean HTTP/1.1 client for the HTTP backends: asyncio protocol + httptools parser.

Why not aiohttp (the stack's first choice, still used by the test suite): the CPU of a client
process per small inference POST is 0.18–0.32 × aiohttp's with this client, 0.74–0.96 × at 1 MiB
(``benchmarks/h1client.py`` measures it, so the choice stays justified; benchmarks/README.md),
and aiohttp's was the single largest item of the gateway's HTTP pass-through profile when it
was used. A backend needs only a small
part of HTTP/1.1 — keep-alive POST/GET with a known body, responses with
Content-Length, chunked or close-delimited framing — and httptools (the parser uvicorn uses)
does the parsing.

Backends are untrusted: the answer's framing is read as strictly as nginx and Envoy read it
(``reader``'s docstring: interim answers dropped, bytes after an answer poison its
connection, conflicting framing refused) and everything a backend sends is bounded
(``limits.AnswerLimits``: head count and bytes, body). The client's refusals are
:class:`BadAnswer`; tests/unit/test_h1_framing_diff.py holds the framing to h11's and
fuzz/h1_answer.py fuzzes it.

Connections are pooled per endpoint. A request on a *reused* connection that
the server closed before sending a single byte of the answer is retried once
on a fresh connection: that is the keep-alive race (the server timed the idle
connection out as we sent), not a failed request — unless the caller says the request must
not run twice (``resend=False``: a sequence's). The race is made rare: a connection idle for
more than ``IDLE_S`` is closed instead of reused, and one with bytes waiting that nobody asked
for is never used.

A request can also start without a coroutine (:meth:`H1ConnectionPool.request_now`: a
free slot and a kept-alive connection): its answer is handed to a callback from the
connection's own protocol callbacks (the inference path served from callbacks,
frontend/infer.py ``infer_now``).

Large bodies stream both ways, so a pass-through proxy never holds one whole (the memory
target: a peak growth of at most 1.5 × the payload per request in flight on the binary and raw
paths, benchmarks/conversion):
- a request body can be a *source* (an object with ``length``, ``consumed`` and
  ``async for`` chunks, e.g. the front end's IncomingBody): chunks are written as
  they come, waiting whenever the socket's write buffer is full. Once a chunk has
  been handed out it cannot be sent again, so a source only goes out on a fresh
  connection or one that finished an exchange less than ``FRESH_S`` ago — far
  inside any server's keep-alive timeout, which is what the retry above is for;
- an answer whose Content-Length is at least ``stream_min`` (when the caller
  asks) is handed over as a :class:`BodyStream` once its head has arrived; so is
  an answer of unknown length (chunked) when the caller asks ``stream_unsized`` —
  Triton's generate_stream sends its server-sent events so, one chunk per event,
  and each must reach the client as it comes.

The modules: ``errors`` (the client's failures), ``limits`` (what it accepts of an answer),
``slots`` (exchanges at once per endpoint), ``answer`` (an answer, its body whole or as a
:class:`BodyStream`); one kept-alive connection in three layers: ``link`` (its state and
transport: closing, flow control, the end of a streamed exchange), ``reader`` (the protocol's
reads, the parser's callbacks, framing and limits) and ``connection`` (its exchanges: requests,
deadlines, a streamed request body's pump); ``clock`` (how early a timer may fire, a streamed
request body's idle bound); and ``pool`` (:class:`H1ConnectionPool`: reuse, the keep-alive race,
exchanges answered from callbacks). Imports point one way: pool → connection → reader → link →
answer → errors; connection → clock.
"""
from __future__ import annotations

from .answer import BodyStream, H1Response
from .errors import BadAnswer, ConnectFailed, ConnectionDropped, SourceStalled
from .limits import AnswerLimits
from .pool import FRESH_S, IDLE_S, H1ConnectionPool

__all__ = ["FRESH_S", "IDLE_S", "AnswerLimits", "BadAnswer", "BodyStream", "ConnectFailed", "ConnectionDropped",
           "H1ConnectionPool", "H1Response", "SourceStalled"]
