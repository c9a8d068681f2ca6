"""DNS discovery building blocks: resolve a backend endpoint's host name to all of its addresses.

A backend endpoint may be a DNS name with one record per replica (a Kubernetes headless Service has one
A/AAAA record per ready pod), so the gateway re-resolves it periodically. ``socket.getaddrinfo`` would
block the event loop (asyncio runs it in a thread pool, uvloop too) and hides the difference between
"no such name" and "the resolver is down"; dnspython's asyncio resolver does neither, which is why we
use it here.

The distinction matters to callers: a successful answer with zero addresses (NXDOMAIN, or no A/AAAA
data, RFC 2308 section 2) means the name really has no endpoints, while :class:`DnsFailure` means we do not
know, and the caller keeps the addresses it last knew.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.inet
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver

__all__ = ["DnsFailure", "DnsResolver"]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class DnsFailure(Exception):
    """The name could not be resolved (timeout, SERVFAIL/REFUSED, no nameserver reachable, malformed
    name or answer). Not "zero addresses": callers keep their last known addresses."""


class DnsResolver:
    """Resolves host names to all their A and AAAA addresses, without blocking the event loop.

    ``nameservers``: ``(ip, port)`` pairs, or ``None`` for the system's /etc/resolv.conf.
    ``timeout_s``: the budget for one :meth:`resolve` (both families are queried concurrently).
    """

    def __init__(self, nameservers: Sequence[tuple[str, int]] | None = None, timeout_s: float = 2.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._timeout_s = timeout_s
        self._unconfigured: str | None = None  # why there is no usable configuration, if there is none
        if nameservers is None:
            try:
                resolver = dns.asyncresolver.Resolver(configure=True)
            except (dns.exception.DNSException, OSError, ValueError) as exc:
                # Missing/unreadable /etc/resolv.conf or one without nameservers: fail on use, not at
                # construction, so a gateway whose backends need no DNS still starts.
                resolver = dns.asyncresolver.Resolver(configure=False)
                self._unconfigured = f"no usable /etc/resolv.conf ({exc})"
        else:
            if not nameservers:
                raise ValueError("nameservers must not be empty (use None for /etc/resolv.conf)")
            resolver = dns.asyncresolver.Resolver(configure=False)
            servers: list[dns.nameserver.Nameserver] = []
            for ip, port in nameservers:
                if not dns.inet.is_address(ip):
                    raise ValueError(f"nameserver must be an IP address, got {ip!r}")
                servers.append(dns.nameserver.Do53Nameserver(ip, port))
            resolver.nameservers = servers
        # We re-resolve on purpose to follow changes: no answer cache (dnsmasq/CoreDNS send TTL 0 or
        # small TTLs anyway). Half the budget per attempt leaves room for one retry of a lost datagram.
        resolver.cache = None
        resolver.lifetime = timeout_s
        resolver.timeout = timeout_s / 2
        self._resolver = resolver

    async def resolve(self, host: str) -> tuple[str, ...]:
        """All A and AAAA addresses of ``host``: deduplicated, IPv4 first, each family in address order.

        An IP literal is returned as is. NXDOMAIN or no data for both families returns ``()``.
        Raises :class:`DnsFailure` for anything else that goes wrong, never another exception.
        """
        literal = _ip_literal(host)
        if literal is not None:
            return (str(literal),)
        if not host:
            raise DnsFailure("cannot resolve an empty host name")
        if self._unconfigured is not None:
            raise DnsFailure(f"cannot resolve {host!r}: {self._unconfigured}")
        try:
            qname, search = _qname(host)
        except Exception as exc:  # dns.name.EmptyLabel, LabelTooLong, IDNAException, ...
            raise DnsFailure(f"cannot resolve {host!r}: invalid name ({exc})") from exc
        results = await asyncio.gather(
            self._query(host, qname, search, dns.rdatatype.A),
            self._query(host, qname, search, dns.rdatatype.AAAA),
            return_exceptions=True,
        )
        found: set[_IPAddress] = set()
        for result in results:
            if isinstance(result, DnsFailure):
                raise result
            if isinstance(result, Exception):  # _query maps everything; belt and braces
                raise DnsFailure(f"cannot resolve {host!r}: {result!r}") from result
            if isinstance(result, BaseException):  # cancellation and friends are not ours to map
                raise result
            found.update(result)
        return tuple(str(ip) for ip in sorted(found, key=lambda ip: (ip.version, int(ip))))

    async def _query(
        self, host: str, qname: dns.name.Name, search: bool, rdtype: dns.rdatatype.RdataType
    ) -> list[_IPAddress]:
        family = dns.rdatatype.to_text(rdtype)
        try:
            answer = await self._resolver.resolve(qname, rdtype, search=search, raise_on_no_answer=False)
            if answer.rrset is None:  # NOERROR without data for this family
                return []
            return [ipaddress.ip_address(rdata.address) for rdata in answer.rrset]
        except dns.resolver.NXDOMAIN:
            return []
        except dns.exception.Timeout as exc:
            raise DnsFailure(f"cannot resolve {host!r} ({family}): timed out after {self._timeout_s}s") from exc
        except dns.resolver.NoNameservers as exc:
            raise DnsFailure(f"cannot resolve {host!r} ({family}): no nameserver answered ({exc})") from exc
        except dns.exception.DNSException as exc:
            raise DnsFailure(f"cannot resolve {host!r} ({family}): {exc}") from exc
        except Exception as exc:  # a malformed answer or an I/O error surfacing raw: still "we do not know"
            raise DnsFailure(f"cannot resolve {host!r} ({family}): {exc!r}") from exc


def _ip_literal(host: str) -> _IPAddress | None:
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _qname(host: str) -> tuple[dns.name.Name, bool]:
    """A dotted name is queried as an absolute name (no search list: "svc.example" never becomes
    "svc.example.cluster.local"); a single label goes through the search list, as Kubernetes short
    Service names need (resolv.conf(5) "search", "ndots")."""
    if "." in host:
        return dns.name.from_text(host if host.endswith(".") else host + ".", origin=dns.name.root), False
    return dns.name.from_text(host, origin=None), True
