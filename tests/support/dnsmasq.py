"""Run Debian's real ``dnsmasq`` on loopback as the DNS server of DNS-discovery tests.

How records are served and changed: every name is one file in a hosts directory (``--hostsdir``),
in /etc/hosts format. dnsmasq watches that directory with inotify (close-write, moved-to and delete
events) and, since 2.88, drops the records a changed or deleted file had before re-reading it; so a
change is live within a millisecond or two, without SIGHUP (whose re-read of --addn-hosts races
with the queries that follow). We write each file under a dot-name (dnsmasq ignores dotfiles) and
rename it into place, so dnsmasq never reads half a file; an empty record set deletes the file.
:meth:`Dnsmasq.set_records` still waits until dnsmasq answers exactly the new set.

``--local=/#/`` makes dnsmasq the authority for every name: an unknown name is NXDOMAIN and a name
with only A records answers AAAA with NOERROR/no data, as a real zone does (without it, dnsmasq has
no upstream and answers REFUSED). ``--local-ttl=0`` (the default, spelled out) keeps clients from
caching.

Ports: dnsmasq cannot bind port 0 (``--port=0`` disables DNS), so this is the one place where we pick
a port ourselves: the kernel hands us a free UDP port, we release it and start dnsmasq on it. If
another process takes the port in between (dnsmasq binds UDP and TCP and exits with "Address already
in use"), we retry with a new one. A per-instance sentinel name proves that the server answering is
ours, not whoever took the port.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Self

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from .procs import terminate, terminate_with_parent, wait_for

__all__ = ["Dnsmasq", "DnsmasqStartupError", "dnsmasq_available"]

HOST = "127.0.0.1"
_MIN_VERSION = (2, 88)  # --hostsdir drops the records of changed and deleted files
_PORT_TRIES = 20
_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*$")


class DnsmasqStartupError(RuntimeError):
    """dnsmasq did not come up; the message ends with its output."""


def _binary() -> str | None:
    # /usr/sbin is not on every user's PATH.
    return shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin:/sbin")


@cache
def dnsmasq_available() -> str | None:
    """``None`` when dnsmasq can run here, else the reason it cannot."""
    binary = _binary()
    if binary is None:
        return "dnsmasq is not installed (Debian: apt-get install dnsmasq-base; scripts/test.sh does it)"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot execute {binary}: {exc!r}"
    match = re.search(r"Dnsmasq version (\d+)\.(\d+)", out.stdout)
    if match is None:
        return f"{binary} --version printed no version: {out.stdout[-500:]}{out.stderr[-500:]}"
    if (int(match[1]), int(match[2])) < _MIN_VERSION:
        return f"dnsmasq {match[1]}.{match[2]} is older than 2.88 (--hostsdir does not drop changed records)"
    if "no-inotify" in out.stdout:
        return "dnsmasq was built without inotify; --hostsdir would not pick up changes"
    return None


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def query(address: tuple[str, int], name: str, *, timeout: float = 1.0) -> frozenset[str]:
    """The A and AAAA addresses ``address`` answers for ``name`` (empty for NXDOMAIN / no data)."""
    found: set[str] = set()
    for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
        request = dns.message.make_query(name, rdtype)
        # A large record set does not fit a UDP reply (TC set): ask again over TCP.
        reply, _ = dns.query.udp_with_fallback(request, address[0], port=address[1], timeout=timeout)
        if reply.rcode() not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
            raise RuntimeError(f"{name} {rdtype.name}: {dns.rcode.to_text(reply.rcode())}")
        for rrset in reply.answer:
            if rrset.rdtype == rdtype:
                found.update(str(ipaddress.ip_address(rdata.address)) for rdata in rrset)
    return frozenset(found)


class Dnsmasq:
    """A dnsmasq serving the records given to :meth:`set_records` on ``127.0.0.1:<port>``."""

    def __init__(self, workdir: Path | None = None, *, startup_timeout: float = 10.0) -> None:
        self._own_workdir = workdir is None
        self._workdir = Path(tempfile.mkdtemp(prefix="dnsmasq-")) if workdir is None else workdir
        self._hosts = self._workdir / "hosts"
        self._log = self._workdir / "dnsmasq.log"
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        # A name only this instance serves: whoever answers it is our dnsmasq.
        self._sentinel = f"ready-{uuid.uuid4().hex}.dnsmasq.test"

    @property
    def address(self) -> tuple[str, int]:
        if self._port is None:
            raise RuntimeError("dnsmasq is not running")
        return (HOST, self._port)

    def start(self) -> Self:
        reason = dnsmasq_available()
        if reason is not None:
            raise DnsmasqStartupError(reason)
        self._hosts.mkdir(parents=True, exist_ok=True)
        self._write(self._sentinel, ["127.0.0.1"])
        failures: list[str] = []
        for _ in range(_PORT_TRIES):
            port = _free_udp_port()
            output = self._try_start(port)
            if output is None:
                return self
            if "Address already in use" not in output:
                raise DnsmasqStartupError(f"dnsmasq on port {port} failed:\n{output}")
            failures.append(f"port {port}: address in use")
        raise DnsmasqStartupError(f"dnsmasq found no free port in {_PORT_TRIES} tries: {failures}")

    def _try_start(self, port: int) -> str | None:
        """Start on ``port``; ``None`` once it answers, else its output after it exited."""
        stderr = self._workdir / "dnsmasq.stderr"
        cmd = [
            str(_binary()),
            "--keep-in-foreground",
            "--conf-file=/dev/null",  # not /etc/dnsmasq.conf
            "--no-resolv",  # no upstream servers: every answer is ours
            "--no-hosts",  # not /etc/hosts
            "--no-poll",
            "--local=/#/",  # authoritative for all names (NXDOMAIN, not REFUSED, for unknown ones)
            "--local-ttl=0",
            f"--hostsdir={self._hosts}",
            f"--listen-address={HOST}",
            "--bind-interfaces",  # bind 127.0.0.1 only, not the wildcard address
            f"--port={port}",
            "--pid-file=",  # none
            f"--log-facility={self._log}",
            # Run as whoever we are: as root, dnsmasq would otherwise switch to a "dnsmasq"/"nobody"
            # user that may not exist or may not read our temporary directory.
            f"--user={pwd.getpwuid(os.getuid()).pw_name}",
            f"--group={grp.getgrgid(os.getgid()).gr_name}",
        ]
        parent = os.getpid()
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: terminate_with_parent(parent),
            )

        def up() -> bool:
            if proc.poll() is not None:
                return True
            return query((HOST, port), self._sentinel, timeout=0.1) == {"127.0.0.1"}

        try:
            wait_for(up, timeout=self._startup_timeout, what=f"dnsmasq on {HOST}:{port}")
        except TimeoutError:
            terminate(proc)
            raise DnsmasqStartupError(f"dnsmasq on port {port} did not answer:\n{self._output(stderr)}") from None
        if proc.poll() is not None:
            return f"exit code {proc.returncode}\n{self._output(stderr)}"
        self._proc, self._port = proc, port
        return None

    def _output(self, stderr: Path) -> str:
        parts = [p.read_text(errors="replace")[-4000:] for p in (stderr, self._log) if p.exists()]
        return "\n".join(parts)

    def _write(self, name: str, addresses: Sequence[str]) -> None:
        path = self._hosts / name
        if not addresses:
            path.unlink(missing_ok=True)
            return
        tmp = self._hosts / f".{name}.tmp"  # a dotfile: dnsmasq ignores it until the rename
        tmp.write_text("".join(f"{address} {name}\n" for address in addresses))
        os.replace(tmp, path)

    def set_records(self, name: str, addresses: Sequence[str], *, timeout: float = 5.0) -> None:
        """Replace the A/AAAA records of ``name`` (empty: remove it); return once dnsmasq serves them."""
        name = name.rstrip(".").lower()
        if not _NAME.match(name):
            raise ValueError(f"not a host name: {name!r}")
        expected = frozenset(str(ipaddress.ip_address(a)) for a in addresses)
        self._write(name, addresses)
        address = self.address
        wait_for(lambda: query(address, name) == expected, timeout=timeout, what=f"dnsmasq to serve {name}")

    def stop(self) -> None:
        if self._proc is not None:
            terminate(self._proc)
            self._proc, self._port = None, None
        if self._own_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
