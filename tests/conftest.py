"""Shared fixtures: the reference server and gateways started as real processes."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.compiled import stale_extensions
from tests.support.gateway import GatewayProcess, ReferenceServer, gateway_config
from tests.support.procs import wait_for

# No per-example deadline: the machine is shared and noisy; correctness is what is asserted here.
settings.register_profile("oip", deadline=None)
settings.load_profile("oip")



def pytest_sessionstart(session: pytest.Session) -> None:
    # A compiled hot-path module older than its source would be imported instead of it: the
    # run would test the code as it was (setup.py).
    stale = stale_extensions()
    if stale:
        pytest.exit(f"compiled extensions older than their sources: {', '.join(stale)}; rebuild them with "
                    "`.venv/bin/pip install -e .` (or run `bash scripts/test.sh`)", returncode=2)


# Every model both test backends serve (tests/models/triton and gateway/demo).
MODELS = ["add_sub", "string_reverse"]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    with ReferenceServer(tmp_path_factory.mktemp("reference")) as server:
        yield server


def start_gateway(workdir, http_url: str, grpc_url: str, backend: str, *, models=MODELS,
                  backend_extra: dict | None = None, **extra) -> GatewayProcess:
    """A gateway routing every model ('*') to its backend ``backend`` ("http" or "grpc", named
    for the protocol it speaks to the one server behind both).

    The exact routes for ``models`` make server readiness wait for them; ``backend_extra``:
    keys added to that backend's config.
    """
    backends = {
        "http": {"protocol": "http", "endpoints": [http_url]},
        "grpc": {"protocol": "grpc", "endpoints": [grpc_url]},
    }
    backends[backend].update(backend_extra or {})
    routes = [{"model": m, "backend": backend} for m in models] + [{"model": "*", "backend": backend}]
    gw = GatewayProcess(gateway_config(backends, routes, **extra), workdir, name=f"gateway-{backend}")
    gw.start()
    try:
        import tritonclient.http as httpclient

        def ready() -> bool:
            with httpclient.InferenceServerClient(gw.http_url) as c:
                return c.is_server_ready()

        wait_for(ready, timeout=30, what="gateway readiness")
    except Exception:
        gw.stop()
        raise
    return gw
