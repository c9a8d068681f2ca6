"""The HTTP front end's unread request body (frontend/incoming.py ``IncomingBody``) over a
scripted chunk source: the unit below the HTTP listener (h1direct.DirectExchange.chunks)."""
from __future__ import annotations

import pytest

from gateway.budget import ByteBudget as _Budget
from gateway.dataplane import ClientDisconnected
from gateway.errors import InvalidRequest
from gateway.frontend.incoming import IncomingBody as _IncomingBody


def channel(*chunks: bytes, disconnect: bool = False):
    async def source():
        for chunk in chunks:
            yield chunk
        if disconnect:
            raise ClientDisconnected

    return source()


async def test_read_within_the_budget_preallocates_and_gives_it_back():
    budget = _Budget(100)
    body = _IncomingBody(channel(b"abc", b"defg"), 7, budget)
    data = await body.read()
    assert data == b"abcdefg" and isinstance(data, bytearray) and budget.used == 7
    body.release()
    assert budget.used == 0


async def test_read_past_the_budget_gathers_what_arrives():
    """A body that would overdraw the budget is not preallocated at its declared size."""
    budget = _Budget(10)
    budget.take(8)  # other requests in flight
    body = _IncomingBody(channel(b"abc", b"defg"), 7, budget)
    data = await body.read()
    assert data == b"abcdefg" and isinstance(data, bytes) and budget.used == 8
    body.release()
    assert budget.used == 8


async def test_prefix_is_replayed_by_every_iteration():
    body = _IncomingBody(channel(b'{"a"', b":1}xyz", b"tail"), 14, _Budget(100))
    assert await body.prefix(7) == b'{"a":1}'
    assert not body.consumed
    first = [c async for c in body]
    assert b"".join(first) == b'{"a":1}xyztail' and body.consumed


async def test_short_body_and_disconnect():
    with pytest.raises(InvalidRequest, match="shorter"):
        await _IncomingBody(channel(b"abc"), 7, _Budget(100)).read()
    with pytest.raises(ClientDisconnected):
        await _IncomingBody(channel(b"abc", disconnect=True), 7, _Budget(100)).read()
