"""Helpers to run real server processes in tests.

Servers bind port 0 themselves; we read back the ports they actually listen on
from /proc (their socket inodes matched against /proc/net/tcp{,6}), so no test
ever probes for a free port and races another process for it.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

__all__ = ["dies_with_parent", "listening_ports", "tcp_sockets", "terminate", "terminate_with_parent", "wait_for",
           "wait_for_ports"]

T = TypeVar("T")
_LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except (FileNotFoundError, PermissionError):
        return inodes
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
    except OSError:
        pass
    return out


def listening_ports(pid: int, *, include_children: bool = True) -> set[int]:
    """TCP ports in LISTEN state owned by ``pid`` (and, by default, its descendants)."""
    pids = [pid]
    if include_children:
        i = 0
        while i < len(pids):
            pids.extend(_children(pids[i]))
            i += 1
    inodes: set[str] = set()
    for p in pids:
        inodes |= _socket_inodes(p)
    return {port for port, state, inode in tcp_sockets() if state == _LISTEN and inode in inodes}


def tcp_sockets() -> Iterator[tuple[int, str, str]]:
    """(local port, state code, socket inode) of every TCP socket on this host (IPv4 and IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    yield int(parts[1].rsplit(":", 1)[1], 16), parts[3], parts[9]
        except FileNotFoundError:
            continue


def wait_for(predicate: Callable[[], T], *, timeout: float, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last error: {last_exc!r}")
        time.sleep(interval)


def wait_for_ports(proc: subprocess.Popen, count: int, *, timeout: float = 60.0) -> set[int]:
    """Wait until ``proc`` listens on at least ``count`` TCP ports; fail early if it exits."""

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        ports = listening_ports(proc.pid)
        if len(ports) >= count:
            return ports
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args!r} listened on {sorted(ports)} after {timeout}s; wanted {count} ports")
        time.sleep(0.05)


def terminate(proc: subprocess.Popen, *, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reap."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, in the parent: a preexec_fn runs between fork and exec of a process with
# threads, where loading a library (dlopen's locks, held by another thread at the fork) can
# crash or hang the child.
_PRCTL = _prctl()


# util-linux's setpriv sets PR_SET_PDEATHSIG and then execs the command (same process, same pid).
_SETPRIV = shutil.which("setpriv")


def dies_with_parent(cmd: Sequence[str]) -> list[str] | None:
    """``cmd`` run so that it gets SIGTERM when the thread that starts it exits, through setpriv
    rather than a preexec_fn: with a preexec_fn the child runs Python's after-fork code before
    exec, and in a test process whose other threads are busy (a Triton restarted under load)
    that has crashed the child (a segfault in threading's ``_after_fork``). None when setpriv is
    missing (use :func:`terminate_with_parent` then)."""
    if _SETPRIV is None:
        return None
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *cmd]


def terminate_with_parent(parent_pid: int) -> None:
    """preexec_fn: SIGTERM the child when the process that started it dies, even by SIGKILL
    (Linux only), so no test server outlives a killed test run."""
    if _PRCTL is None:
        return
    _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
