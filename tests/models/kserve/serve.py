"""Start KServe's ModelServer with the test models (oip_kserve_models.py), bound to loopback.

Run with .kserve-venv's Python (tests/support/kserve.py does): ``python serve.py --http_port 0
--grpc_port 0 [any other kserve.ModelServer argument]``. KServe's own argument parser reads
argv (``kserve.model_server.args``), so every ModelServer option works as on its CLI.

KServe 0.21 binds every interface with no option to change it: its REST server builds
``uvicorn.Config(host="0.0.0.0", ...)`` and its gRPC server calls
``add_insecure_port("[::]:PORT")``. Before kserve is imported, this launcher narrows both
through the public APIs of uvicorn and grpc in this process only: ``uvicorn.Config`` becomes a
subclass whose host is ``OIP_KSERVE_HOST`` (default 127.0.0.1), and ``grpc.aio.server`` returns
servers whose ``add_insecure_port`` keeps the port and replaces the host. The rest — endpoints,
data plane, gRPC servicer and interceptors, ``ModelServer.start`` — is KServe's, unchanged. The
harness checks from /proc that the process listens on loopback only.
"""
from __future__ import annotations

import os
import sys

import grpc.aio
import uvicorn

HOST = os.environ.get("OIP_KSERVE_HOST", "127.0.0.1")


class _LoopbackConfig(uvicorn.Config):
    def __init__(self, *args, **kwargs) -> None:
        kwargs["host"] = HOST
        super().__init__(*args, **kwargs)


_grpc_server = grpc.aio.server


def _loopback_grpc_server(*args, **kwargs):
    server = _grpc_server(*args, **kwargs)
    add_insecure_port = server.add_insecure_port

    def add_loopback_port(address: str) -> int:
        port = address.rsplit(":", 1)[1]
        return add_insecure_port(f"{HOST}:{port}")

    server.add_insecure_port = add_loopback_port
    return server


uvicorn.Config = _LoopbackConfig
grpc.aio.server = _loopback_grpc_server


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kserve
    from oip_kserve_models import all_models

    print(f"kserve {kserve.__version__ if hasattr(kserve, '__version__') else ''} on {HOST}", flush=True)
    kserve.ModelServer().start(all_models())


if __name__ == "__main__":
    main()
