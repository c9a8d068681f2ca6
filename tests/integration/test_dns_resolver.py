"""DnsResolver against a real DNS server (Debian's dnsmasq on loopback, tests/support/dnsmasq.py)."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from gateway.backends.dns import DnsFailure, DnsResolver
from tests.support import dnsmasq as dnsmasq_mod
from tests.support.dnsmasq import Dnsmasq, dnsmasq_available


def _unavailable(what: str, reason: str) -> None:
    # As tests/integration/conftest.py: a skip on a developer machine, a failure in CI (CI=1).
    if os.environ.get("CI"):
        pytest.fail(f"{what} must run in CI: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


def _require_dnsmasq() -> None:
    reason = dnsmasq_available()
    if reason is not None:
        _unavailable("dnsmasq", reason)


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dnsmasq]:
    _require_dnsmasq()
    with Dnsmasq(tmp_path_factory.mktemp("dnsmasq")) as server:
        yield server


@pytest.fixture
def resolver(dnsmasq: Dnsmasq) -> DnsResolver:
    return DnsResolver([dnsmasq.address], timeout_s=2.0)


async def test_all_a_records(dnsmasq, resolver):
    dnsmasq.set_records("pods.ns.test", ["10.0.0.2", "10.0.0.1"])
    assert await resolver.resolve("pods.ns.test") == ("10.0.0.1", "10.0.0.2")
    # The absolute spelling is the same name.
    assert await resolver.resolve("pods.ns.test.") == ("10.0.0.1", "10.0.0.2")


async def test_changed_records_are_seen_on_the_next_resolve(dnsmasq, resolver):
    dnsmasq.set_records("scaled.test", ["10.0.1.1", "10.0.1.2"])
    assert await resolver.resolve("scaled.test") == ("10.0.1.1", "10.0.1.2")
    dnsmasq.set_records("scaled.test", ["10.0.1.2", "10.0.1.3", "10.0.1.4"])
    assert await resolver.resolve("scaled.test") == ("10.0.1.2", "10.0.1.3", "10.0.1.4")
    dnsmasq.set_records("scaled.test", [])  # scaled to zero: the name is gone
    assert await resolver.resolve("scaled.test") == ()


async def test_unknown_name_is_zero_addresses(resolver):
    assert await resolver.resolve("never-registered.test") == ()


async def test_aaaa_records_come_back_after_ipv4(dnsmasq, resolver):
    dnsmasq.set_records("dual.test", ["::2", "10.0.2.1", "fd00::1", "10.0.2.1"])
    assert await resolver.resolve("dual.test") == ("10.0.2.1", "::2", "fd00::1")
    dnsmasq.set_records("v6only.test", ["fd00::5", "fd00::4"])
    assert await resolver.resolve("v6only.test") == ("fd00::4", "fd00::5")


async def test_short_name_without_search_list(dnsmasq, resolver):
    # Explicit nameservers have no search list: a single label is tried as itself.
    dnsmasq.set_records("triton", ["10.0.3.1"])
    assert await resolver.resolve("triton") == ("10.0.3.1",)


async def test_many_records_need_tcp(dnsmasq, resolver):
    # 100 A records do not fit a 512-byte UDP reply: dnsmasq sets TC and dnspython retries over TCP.
    addresses = [f"10.9.{i // 250}.{i % 250 + 1}" for i in range(100)]
    dnsmasq.set_records("big.test", addresses)
    result = await resolver.resolve("big.test")
    assert sorted(result) == sorted(addresses) and len(result) == 100


async def test_stopped_server_is_a_dns_failure(tmp_path):
    _require_dnsmasq()
    server = Dnsmasq(tmp_path).start()
    try:
        server.set_records("gone.test", ["10.0.4.1"])
        resolver = DnsResolver([server.address], timeout_s=0.5)
        assert await resolver.resolve("gone.test") == ("10.0.4.1",)
    finally:
        server.stop()
    with pytest.raises(DnsFailure, match=r"'gone\.test'"):
        await resolver.resolve("gone.test")


def test_port_taken_between_pick_and_start_is_retried(tmp_path, monkeypatch):
    _require_dnsmasq()
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    real = dnsmasq_mod._free_udp_port
    picks = iter([taken.getsockname()[1]])
    monkeypatch.setattr(dnsmasq_mod, "_free_udp_port", lambda: next(picks, None) or real())
    try:
        with Dnsmasq(tmp_path) as server:
            assert server.address[1] != taken.getsockname()[1]
            server.set_records("retried.test", ["10.0.5.1"])
    finally:
        taken.close()
