"""Fuzz target: a backend's bytes as the HTTP/1.1 client reads them (gateway/backends/h1/connection.py
``Connection``, issue 35), driven below the network by tests/support/h1drive.py.

Input layout:

- byte 0, flags: bits 0-1 how the bytes are cut into reads — 0 one read (as large as the
  client's buffer takes), 1 one byte a read, 2 reads of byte 1's size (+1), 3 reads of the
  sizes in bytes 1-3 (+1 each), cycled. Bit 2: ``stream_min`` 1 (every answer with a
  Content-Length is streamed as a BodyStream) instead of none. Bit 3: small limits (8 headers,
  1 KiB of head, 64 bytes of body) instead of the defaults. Bit 4: no EOF after the bytes.
  Bit 5: two exchanges on one connection, the bytes split at the first ``\\0\\0``.
- bytes 1-3: the read sizes (see bits 0-1).
- the rest: the backend's bytes.

Checks (any other exception, or a FuzzBug, is a bug):
- the client raises nothing from its protocol callbacks, answers each exchange once, and fails
  one only with BadAnswer or ConnectionDropped, which closes the connection;
- a delivered body is at most ``max_body_bytes``;
- against h11 as a client, fed the same bytes (the differential): where h11 reads a complete
  answer, the client delivers the same status and body or refuses (it is stricter than h11 by
  design in places: tests/unit/test_h1_framing_diff.py lists them); where h11 finds bytes after
  that answer, the client's connection is closed; the client never delivers an answer h11 still
  waits for, and never reuses a connection h11 would not (but for an HTTP/1.0 answer with
  ``Connection: keep-alive``, which llhttp keeps and h11 does not).
"""
from __future__ import annotations

import asyncio

from fuzz._support import check, instrumented, run

with instrumented(__name__ == "__main__", ("gateway",)):
    from gateway.backends.h1.errors import BadAnswer, ConnectionDropped
    from gateway.backends.h1.limits import AnswerLimits
    from tests.support.h1drive import drive, h11_answers

__all__ = ["SMALL", "one_input"]

SMALL = AnswerLimits(max_header_count=8, max_head_bytes=1024, max_body_bytes=64)
DEFAULT = AnswerLimits()
_LOOP = asyncio.new_event_loop()  # never run: the connection only holds it


def _sizes(flags: int, data: bytes) -> list[int]:
    mode = flags & 3
    if mode == 0:
        return []
    if mode == 1:
        return [1]
    if mode == 2:
        return [data[1] + 1]
    return [b + 1 for b in data[1:4]]


def one_input(data: bytes) -> None:
    if len(data) < 4:
        return
    flags = data[0]
    sizes = _sizes(flags, data)
    stream_min = 1 if flags & 4 else None
    limits = SMALL if flags & 8 else DEFAULT
    eof = not flags & 16
    rest = data[4:]
    exchanges = rest.split(b"\0\0", 1) if flags & 32 else [rest]
    outs = drive(exchanges, sizes=sizes, eof=eof, limits=limits, stream_min=stream_min, loop=_LOOP).outcomes
    for out in outs:
        check(not out.violations, f"{out.violations}")
        if out.kind == "refused":
            check(isinstance(out.error, (BadAnswer, ConnectionDropped)), f"refused with {out.error!r}")
            check(out.closed, f"a refusal left the connection open: {out.error!r}")
        if out.body is not None:
            check(len(out.body) <= limits.max_body_bytes, f"a body of {len(out.body)} bytes passed the limit")

    refs = h11_answers(exchanges, eof=eof, max_head_bytes=limits.max_head_bytes)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        where = f"exchange {i}: client {out.kind} {out.status} {out.error!r}, h11 {ref.kind} {ref.status} {ref.error}"
        if out.kind == "answer":
            check(ref.kind != "pending", f"the client delivered an answer h11 still waits for: {where}")
        if ref.kind != "answer":
            continue
        if out.kind == "answer":
            check(out.status == ref.status, f"status differs: {where}")
            check(out.body == ref.body, f"body differs: {where}")
            check(not ref.leftover or out.closed, f"bytes after the answer left the connection open: {where}")
            check(not out.reusable or ref.reusable or ref.version == b"1.0",
                  f"the client would reuse a connection h11 would not: {where}")

if __name__ == "__main__":
    run(one_input)
