"""gateway.backends.dns without a DNS server: literals, failures mapped to DnsFailure, bad input."""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from gateway.backends.dns import DnsFailure, DnsResolver


@pytest.fixture
def silent_server() -> Iterator[tuple[str, int]]:
    """A UDP socket that receives queries and never answers: a nameserver that times out."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()
    sock.close()


@pytest.fixture
def closed_port() -> tuple[str, int]:
    """A loopback UDP port nobody listens on (queries get ICMP port unreachable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("10.1.2.3", ("10.1.2.3",)),
        ("::1", ("::1",)),
        ("2001:DB8:0:0::7", ("2001:db8::7",)),  # canonical text, like the addresses from DNS
        ("[fd00::1]", ("fd00::1",)),  # the bracketed form of a URL authority
    ],
)
async def test_ip_literal_needs_no_query(silent_server, host, expected):
    # The only nameserver never answers: a query would time out instead of returning.
    resolver = DnsResolver([silent_server], timeout_s=5.0)
    started = time.monotonic()
    assert await resolver.resolve(host) == expected
    assert time.monotonic() - started < 1.0


async def test_silent_nameserver_is_a_dns_failure(silent_server):
    resolver = DnsResolver([silent_server], timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(DnsFailure, match=r"'backend\.example'.*timed out") as info:
        await resolver.resolve("backend.example")
    assert time.monotonic() - started < 2.0
    assert info.value.__cause__ is not None


async def test_closed_port_is_a_dns_failure(closed_port):
    resolver = DnsResolver([closed_port], timeout_s=0.5)
    with pytest.raises(DnsFailure, match=r"backend\.example"):
        await resolver.resolve("backend.example")


@pytest.mark.parametrize("host", ["a..b", "", "x" * 64 + ".example", ".leading.dot"])
async def test_malformed_name_is_a_dns_failure(silent_server, host):
    resolver = DnsResolver([silent_server], timeout_s=5.0)
    started = time.monotonic()
    with pytest.raises(DnsFailure):
        await resolver.resolve(host)
    assert time.monotonic() - started < 1.0  # refused before any query


async def test_missing_resolv_conf_fails_on_use(monkeypatch, tmp_path):
    import dns.resolver

    # The system configuration is read through read_resolv_conf; point it at a file that is not there.
    missing = tmp_path / "resolv.conf"
    real_read = dns.resolver.BaseResolver.read_resolv_conf
    monkeypatch.setattr(dns.resolver.BaseResolver, "read_resolv_conf", lambda self, f: real_read(self, missing))
    resolver = DnsResolver()  # constructing must not raise
    assert await resolver.resolve("127.0.0.1") == ("127.0.0.1",)
    with pytest.raises(DnsFailure, match=r"'backend\.example'.*resolv\.conf"):
        await resolver.resolve("backend.example")


@pytest.mark.parametrize(
    ("nameservers", "timeout_s"),
    [([], 1.0), ([("not-an-ip", 53)], 1.0), ([("127.0.0.1", 53)], 0.0)],
)
def test_bad_configuration_is_rejected_at_construction(nameservers, timeout_s):
    with pytest.raises(ValueError):
        DnsResolver(nameservers, timeout_s=timeout_s)
