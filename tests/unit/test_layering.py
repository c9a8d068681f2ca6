"""Imports point down (DESIGN.md "Layout"): the codec, routing and config import no transport."""
from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("aiohttp", "grpc", "starlette", "uvicorn", "asyncio", "prometheus_client")


def test_pure_layers_import_no_transport():
    code = (
        "import sys\n"
        "import gateway.codec.http, gateway.codec.grpc, gateway.codec.content, gateway.codec.wire\n"
        "import gateway.routing, gateway.config, gateway.model, gateway.errors\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"pure layers pulled in: {out}"
