"""Fixtures for integration tests against real upstream servers.

A backend that cannot run here is a skip on a developer machine and a failure
in CI (``CI`` set, as ``scripts/test.sh`` does): CI must prove the real thing.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from tests.support.mlserver import MLServerProcess, mlserver_available
from tests.support.triton import TritonServer, triton_available


def _unavailable(what: str, reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} must run in CI: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture
def triton_required() -> None:
    """For tests that start Triton processes of their own (fleet faults)."""
    reason = triton_available()
    if reason is not None:
        _unavailable("Triton", reason)


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One real Triton (tests/models/triton) for the whole session."""
    reason = triton_available()
    if reason is not None:
        _unavailable("Triton", reason)
    server = TritonServer()
    server.start(tmp_path_factory.mktemp("triton"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerProcess]:
    """One real MLServer (tests/models/mlserver, its own venv) for the whole session."""
    reason = mlserver_available()
    if reason is not None:
        _unavailable("MLServer", reason)
    with MLServerProcess(workdir=tmp_path_factory.mktemp("mlserver")) as server:
        yield server


@pytest.fixture(scope="module")
def black_hole() -> Iterator[str]:
    """A real TCP listener that accepts connections and never answers: a hung backend
    (a request to it stays in flight until its timeout_s)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
