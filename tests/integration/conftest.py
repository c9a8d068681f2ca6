"""Fixtures for integration tests against real upstream servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.triton import TritonServer, triton_available


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One real Triton (tests/models/triton) for the whole session; skips when it cannot run here."""
    reason = triton_available()
    if reason is not None:
        pytest.skip(f"Triton unavailable: {reason}")
    server = TritonServer()
    server.start(tmp_path_factory.mktemp("triton"))
    try:
        yield server
    finally:
        server.stop()
