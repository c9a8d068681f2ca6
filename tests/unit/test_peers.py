"""Placement's replicas (gateway/peers.py): what a decider's answer means (``_answer``), and which
peer decides for a pool (``PeerSet.decider`` / ``is_self``) as peers go down — a follower (no peers
port of its own) never decides. ``ask`` against tiny servers on loopback: refused, closing at once,
garbage, a good answer."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.config.network import Dns, HostPort, Peers
from gateway.errors import BadUpstreamResponse, ModelNotReady, UpstreamError
from gateway.peers import PeerSet, _answer
from gateway.routing.rendezvous import rank

PEER = "10.9.9.9:9400"
JSON = {"content-type": "application/json"}
# Addresses of no interface here (RFC 5737 documentation ranges): never this process.
X, Y, Z = "192.0.2.1:9400", "198.51.100.1:9400", "203.0.113.1:9400"


# ------------------------------------------------------------------------------------ _answer


def test_200_with_endpoints():
    body = orjson.dumps({"endpoints": ["10.0.0.1:8001", "[fd00::1]:8001"]})
    assert _answer(200, body, JSON, PEER) == ["10.0.0.1:8001", "[fd00::1]:8001"]
    assert _answer(200, b'{"endpoints": [], "extra": 1}', JSON, PEER) == []


@pytest.mark.parametrize("headers, want", [({"retry-after": "7"}, 7), ({}, 2), ({"retry-after": "soon"}, 2),
                                           ({"retry-after": "-3"}, 2), ({"retry-after": ""}, 2),
                                           ({"retry-after": "1.5"}, 2)])
def test_503_is_model_not_ready_with_retry_after(headers: dict[str, str], want: int):
    body = orjson.dumps({"error": "model 'm' is not ready on backend 'pool'; retry later", "code": "UNAVAILABLE",
                         "kind": "ModelNotReady"})
    with pytest.raises(ModelNotReady) as info:
        _answer(503, body, {**JSON, **headers}, PEER)
    assert info.value.retry_after == want
    assert info.value.message == "model 'm' is not ready on backend 'pool'; retry later"


def test_model_not_ready_by_kind_whatever_the_status():
    with pytest.raises(ModelNotReady):
        _answer(500, b'{"error": "x", "kind": "ModelNotReady"}', JSON, PEER)


def test_503_without_a_message_names_the_peer():
    with pytest.raises(ModelNotReady) as info:
        _answer(503, b"{}", JSON, PEER)
    assert PEER in info.value.message and info.value.retry_after == 2


def test_a_relayed_triton_error_keeps_status_code_and_message():
    message = "load failed for model 'nope': version 1 is at UNAVAILABLE state: Not found: unable to load"
    body = orjson.dumps({"error": message, "code": "INVALID_ARGUMENT", "kind": "UpstreamError"})
    with pytest.raises(UpstreamError) as info:
        _answer(400, body, JSON, PEER)
    assert info.value.http_status == 400 and info.value.grpc_code == "INVALID_ARGUMENT"
    assert info.value.message == message
    assert not isinstance(info.value, ModelNotReady)


def test_a_relayed_error_without_code_or_with_an_odd_status():
    with pytest.raises(UpstreamError) as info:
        _answer(404, b'{"error": "no placement pool named \'pool\' here"}', JSON, PEER)
    assert info.value.http_status == 404 and info.value.grpc_code == "UNKNOWN"
    with pytest.raises(UpstreamError) as info:
        _answer(302, b'{"error": "elsewhere", "code": 5}', JSON, PEER)  # a code that is not a name
    assert info.value.http_status == 502 and info.value.grpc_code == "UNKNOWN"
    with pytest.raises(UpstreamError) as info:
        _answer(201, b'{"error": 5}', JSON, PEER)  # a 2xx that is not 200; error not a string
    assert info.value.http_status == 502 and PEER in info.value.message


def test_a_relayed_code_that_is_no_grpc_status_is_not_kept():
    import grpc

    with pytest.raises(UpstreamError) as info:
        _answer(400, b'{"error": "x", "code": "NOT_A_STATUS"}', JSON, PEER)
    assert info.value.grpc_code in grpc.StatusCode.__members__


@pytest.mark.parametrize("status, body", [
    (200, b"abc"),  # not JSON
    (200, b"<html>502 Bad Gateway</html>"),
    (200, b"[1, 2]"),  # JSON, not an object
    (200, b'"endpoints"'),
    (200, b"null"),
    (200, b""),  # no body: no endpoints
    (200, b"{}"),
    (200, b'{"endpoints": "10.0.0.1:8001"}'),  # not a list
    (200, b'{"endpoints": [1, 2]}'),  # not strings
    (200, b'{"endpoints": ["10.0.0.1:8001", null]}'),
    (200, b'{"endpoints": {"a": 1}}'),
    (200, b'{"endpoints": ["a"]'),  # cut short
    (503, b"Service Unavailable"),  # a proxy's page, not the peer's answer
    (400, b"[]"),
    (200, "{\"endpoints\": [\"\udcff\"]}".encode("utf-8", "surrogatepass")),  # not UTF-8
])
def test_garbage_is_a_bad_upstream_response(status: int, body: bytes):
    with pytest.raises(BadUpstreamResponse) as info:
        _answer(status, body, JSON, PEER)
    assert PEER in info.value.message


@pytest.mark.parametrize("retry", ["\xb2", "9" * 5000])
def test_a_hostile_retry_after_is_still_model_not_ready(retry: str):
    with pytest.raises(ModelNotReady):
        _answer(503, b'{"error": "not ready"}', {"retry-after": retry}, PEER)


# ------------------------------------------------------------------------------------ PeerSet


def peer_set(*addresses: str, own: HostPort | None = None) -> PeerSet:
    return PeerSet(Peers(addresses=tuple(HostPort.parse(a) for a in addresses)), own, Dns())


def pool_ranked(addresses: list[str], want: list[str]) -> str:
    """A pool name whose rendezvous order over ``addresses`` starts with ``want``."""
    for i in range(10_000):
        name = f"pool{i}"
        if rank(name, addresses)[:len(want)] == want:
            return name
    raise AssertionError(want)


def down(ps: PeerSet, address: str, for_s: float = 5.0) -> None:
    ps._down[address] = time.monotonic() + for_s


def test_addresses_sorted_and_unique():
    ps = peer_set(Y, X, Y)
    assert ps.addresses() == sorted({X, Y})


def test_is_self():
    ps = peer_set(X, own=HostPort("127.0.0.1", 9400))
    assert ps.is_self("127.0.0.1:9400")
    assert ps.is_self("localhost:9400")
    assert not ps.is_self("127.0.0.1:9401")  # another port of this host: another process
    assert not ps.is_self(X)  # not an address of this host
    assert not ps.is_self("127.0.0.1:port")
    assert not ps.is_self("no-port")
    assert not ps.is_self("")
    assert not ps.is_self("no-such-host.invalid:9400")
    follower = peer_set(X)
    assert not follower.is_self("127.0.0.1:9400")  # no peers port: never itself


def test_is_self_ipv6():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 here")
    ps = peer_set(X, own=HostPort("::1", 9400))
    assert ps.is_self("[::1]:9400")
    assert not ps.is_self("[fd00::dead]:9400")


def test_the_decider_is_the_first_peer_of_the_pools_order():
    ps = peer_set(X, Y, Z)
    for pool in ("a", "b", "pool", "p" * 300):
        assert ps.decider(pool) == rank(pool, [X, Y, Z])[0]


def test_down_peers_are_passed_over_and_come_back():
    ps = peer_set(X, Y, Z)
    pool = pool_ranked([X, Y, Z], [X, Y, Z])
    assert ps.decider(pool) == X
    down(ps, X)
    assert ps.decider(pool) == Y
    down(ps, Y)
    assert ps.decider(pool) == Z
    down(ps, X, -1)  # its time is up
    assert ps.decider(pool) == X


def test_a_follower_never_decides_while_peers_exist():
    """No peers port of its own (--workers' other workers): when every peer is down it asks the
    first again rather than deciding itself."""
    ps = peer_set(X, Y)
    for pool in ("a", "b", "c"):
        assert ps.decider(pool) is not None
    pool = pool_ranked([X, Y], [Y, X])
    down(ps, X)
    down(ps, Y)
    assert ps.decider(pool) == Y
    assert peer_set().decider(pool) is None  # no peers at all: it decides alone


def test_own_port_decides_when_it_comes_first():
    local = "127.0.0.1:9400"
    ps = peer_set(X, local, own=HostPort("127.0.0.1", 9400))
    first_self = pool_ranked([X, local], [local, X])
    assert ps.decider(first_self) is None
    second = pool_ranked([X, local], [X, local])
    assert ps.decider(second) == X
    down(ps, X)
    assert ps.decider(second) is None  # the one before it is down: this one


def test_own_port_not_listed_decides_when_every_other_is_down():
    ps = peer_set(X, Y, own=HostPort("127.0.0.1", 9400))
    down(ps, X)
    down(ps, Y)
    assert ps.decider("pool") is None


# ------------------------------------------------------------------------------------ ask


@contextlib.asynccontextmanager
async def canned(answer: bytes | None) -> AsyncIterator[str]:
    """A server that reads a request head and answers ``answer`` (None: closes at once)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if answer is not None:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_ask_the_decider_and_read_its_endpoints():
    body = orjson.dumps({"endpoints": ["10.0.0.1:8001"]})
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with canned(answer) as address:
        ps = peer_set(address)
        try:
            assert await ps.ask("pool", "m/with?odd#chars", 2, 2.0) == ["10.0.0.1:8001"]
        finally:
            await ps.stop()


async def test_ask_a_peer_that_answers_garbage():
    async with canned(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc") as address:
        ps = peer_set(address)
        try:
            with pytest.raises(BadUpstreamResponse) as info:
                await ps.ask("pool", "m", 1, 2.0)
            assert address in info.value.message
        finally:
            await ps.stop()


@pytest.mark.parametrize("answer", [None, b"not http at all\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab"])
async def test_a_follower_whose_only_peer_fails_gets_model_not_ready(answer: bytes | None):
    async with canned(answer) as address:
        ps = peer_set(address)
        try:
            start = time.monotonic()
            with pytest.raises(ModelNotReady) as info:
                await ps.ask("pool", "m", 1, 2.0)
            assert time.monotonic() - start < 5
            assert address in info.value.message and info.value.retry_after == 5
            assert ps.decider("pool") == address  # still the one it asks (a follower never decides)
        finally:
            await ps.stop()


async def test_a_peer_that_refuses_is_passed_over_for_the_next():
    gone = closed_port()
    body = orjson.dumps({"endpoints": ["10.0.0.2:8001"]})
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with canned(answer) as address:
        pool = pool_ranked([gone, address], [gone, address])
        ps = peer_set(gone, address)
        try:
            assert await ps.ask(pool, "m", 1, 2.0) == ["10.0.0.2:8001"]
            assert ps.decider(pool) == address  # the refused one is passed over for a while
        finally:
            await ps.stop()


async def test_a_peer_with_a_port_of_its_own_decides_when_the_others_refuse():
    ps = peer_set(closed_port(), closed_port(), own=HostPort("127.0.0.1", 1))
    try:
        assert await ps.ask("pool", "m", 1, 2.0) is None  # this process decides after all
    finally:
        await ps.stop()


@contextlib.asynccontextmanager
async def silent() -> AsyncIterator[str]:
    """A peer that takes the connection and never answers."""
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await reader.read()  # until the asker gives up and closes
        writer.close()

    server = await asyncio.start_server(never, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_silent_peer_is_bounded_by_the_timeout():
    async with silent() as address:
        ps = peer_set(address)
        try:
            start = time.monotonic()
            with pytest.raises(ModelNotReady) as info:
                await ps.ask("pool", "m", 1, 0.3)
            assert time.monotonic() - start < 2
            assert address in info.value.message
        finally:
            await ps.stop()


async def test_a_silent_peer_is_one_timeout_and_says_so():
    async with silent() as address:
        ps = peer_set(address)
        try:
            start = time.monotonic()
            with pytest.raises(ModelNotReady) as info:
                await ps.ask("pool", "m", 1, 0.3)
            assert time.monotonic() - start < 0.55  # asked once
            assert "did not answer within 0.3 s" in info.value.message
        finally:
            await ps.stop()
