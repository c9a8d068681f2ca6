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


async def test_read_view_hands_on_a_body_read_whole_as_it_is():
    """One chunk of the declared length (a body read whole past the parser) is the body: no copy."""
    whole = memoryview(bytearray(b"abcdefg"))
    budget = _Budget(100)
    body = _IncomingBody(channel(whole), 7, budget)  # type: ignore[arg-type]
    data = await body.read_view()
    assert data is whole and budget.used == 7
    body.release()
    assert budget.used == 0
    # In pieces: one buffer of the declared size, uninitialised until the pieces are copied in.
    data = await _IncomingBody(channel(b"abc", b"defg"), 7, _Budget(100)).read_view()
    assert data == b"abcdefg" and isinstance(data, memoryview) and data.nbytes == 7
    assert await _IncomingBody(channel(), 0, _Budget(100)).read_view() == b""
    # Past the budget: the pieces joined; and the iteration's checks hold either way.
    tight = _Budget(10)
    tight.take(8)
    assert await _IncomingBody(channel(b"abc", b"defg"), 7, tight).read_view() == b"abcdefg"
    with pytest.raises(InvalidRequest, match="longer"):
        await _IncomingBody(channel(b"abcdefg", b"x"), 7, _Budget(100)).read_view()
    with pytest.raises(InvalidRequest, match="shorter"):
        await _IncomingBody(channel(b"abc"), 7, _Budget(100)).read_view()
