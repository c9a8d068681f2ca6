"""How the HTTP listener reads a directly served request's body, by its declared size: held
until complete and served from callbacks, read whole past the parser into one buffer, or
streamed through from its first bytes (frontend/h1conn.py ``on_headers_complete``). No I/O.
"""
from __future__ import annotations

__all__ = ["DEFER_MAX", "WHOLE_MAX", "WHOLE_MIN", "declared_body"]

# A request served directly whose declared body is at most this long is held until its
# body is all here, then served from callbacks if it can be (h1direct.DirectExchange.serve).
# The front end reads bodies up to the same size whole before anything else happens to them
# (frontend/infer.py _LARGE); larger ones stream through from their first bytes.
DEFER_MAX = 1 << 20
# A binary-extension request body (Inference-Header-Content-Length, not compressed) of more
# than WHOLE_MIN and at most WHOLE_MAX bytes is read past the parser into one buffer of its
# exact size (the part that came with the head first), then served as a deferred request
# (from callbacks, as a small one: frontend/infer.py infer_now). Streamed instead, a 1 MiB
# request took a task, the coroutine chain through proxy, backend and connection, and a future
# per chunk: benchmarks/instructions.py counted ~490 k instructions per 1 MiB request against
# ~170 k for a small one. Through the parser it would be copied twice (httptools' chunks, then
# joined). A/B (4 rounds), 1 MiB pass-through: CPU per request −11 / −8 / −9 % at c=1 / 16 / 64,
# p50 unchanged on loopback. The price is store-and-forward: the backend gets the body once it
# is all here — at 2 MiB, ~1.7 ms on a 10 Gb/s link — as behind nginx, which buffers request
# bodies by default. (Answers the same way were tried: c=1 +4 %, c=64 −1 %; not kept.)
WHOLE_MIN = 64 * 1024
WHOLE_MAX = 2 << 20


def declared_body(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool]:
    """A request's Content-Length (the parser refused a request with two, or with one beside
    Transfer-Encoding), None when chunked or absent; and whether the body is a binary-extension
    one, not compressed (it may be read whole past the parser). ``headers``: lower-cased names."""
    declared = None
    binary = encoded = False
    for name, value in headers:
        if name == b"content-length":
            declared = int(value) if value.isdigit() and len(value) <= 18 else None
        elif name == b"inference-header-content-length":
            binary = True
        elif name == b"content-encoding":
            encoded = True
    return declared, binary and not encoded
