"""The ``sequence_id`` of an HTTP inference request (a sequence's requests go to one endpoint),
read from as little of a large or compressed body as that takes."""
from __future__ import annotations

from collections.abc import Mapping

from ..codec.content import HEADER_LENGTH, inflate_prefix, is_count, sequence_of_compressed, sequence_of_json
from ..dataplane import IncomingBody
from ..errors import InvalidRequest

__all__ = ["http_affinity"]


async def http_affinity(body: bytes | bytearray | IncomingBody, headers: Mapping[str, str], limit: int,
                        several: bool) -> tuple[bytes | bytearray | IncomingBody, str | None]:
    """(body, its ``sequence_id``) of an HTTP inference request, reading no more of a large
    body than that takes; ``several``: there is a choice to make (else a compressed body is
    not inflated for it)."""
    json_length = headers.get(HEADER_LENGTH)
    compressed = headers.get("content-encoding", "identity").strip().lower() != "identity"
    if compressed and not several:
        return body, None  # one endpoint: nothing to choose, nothing to inflate
    if compressed:
        if not isinstance(body, (bytes, bytearray)) and not is_count((json_length or "").strip()):
            body = await body.read()  # all JSON: a sequence_id could be anywhere in it
        return body, await _compressed_sequence(body, json_length, limit)
    if isinstance(body, (bytes, bytearray)):
        return body, sequence_of_json(body, json_length)
    if json_length is not None and is_count(json_length.strip()):
        # Binary extension: the JSON part comes first and holds any sequence_id;
        # the tensor bytes behind it stream to the backend as they arrive.
        return body, sequence_of_json(await body.prefix(int(json_length)), json_length)
    if not several:
        # One endpoint: nothing to choose, so nothing to find; the body streams on as it
        # arrives (read whole, a 1.3 MB one cost a zeroed buffer, a copy and a search of it:
        # ~3.6 M instructions). Streamed, it is never resent once any of it went out.
        return body, None
    body = await body.read()  # all JSON: a sequence_id could be anywhere in it
    return body, sequence_of_json(body, None)


async def _compressed_sequence(body: bytes | bytearray | IncomingBody, json_length: str | None,
                               limit: int) -> str | None:
    """``sequence_id`` of a gzip/deflate body bound for a backend of several endpoints. A
    binary-extension body still arriving is inflated only up to its JSON part, from as
    little of it as that takes (the rest still streams)."""
    if isinstance(body, (bytes, bytearray)):
        return sequence_of_compressed(body, json_length, limit)
    if json_length is None:
        raise InvalidRequest("compressed body without Inference-Header-Content-Length read unread")
    need, size = int(json_length.strip()), 1 << 16
    while True:
        raw = await body.prefix(size)
        out = inflate_prefix(raw, need)
        if out is None or len(out) >= need or len(raw) < size:
            return sequence_of_json(out, json_length) if out else None
        size *= 4
