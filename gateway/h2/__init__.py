"""HTTP/2 on libnghttp2: the gateway's own gRPC data path (docs/h2-design.md).

``gateway.h2._h2`` is a C extension (gateway/h2/_h2.c, documented in _h2.pyi) with one type per
side of a TCP connection, ``ServerConnection`` and ``ClientConnection``, each wrapping one
nghttp2 session. Python feeds it received bytes and writes what it flushes; it sees coarse events
(a request or answer head, its body, its trailers, an abnormal close), never a frame. Flow
control, header-list limits and flood limits (rapid reset, CONTINUATION, PING, SETTINGS, ...) run
in C.

The extension is built only where libnghttp2's header is installed (setup.py), so importers ask
``available()`` first, and ``native(side)`` whether a side of the gRPC data path runs on it.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["ENGINE_VARIABLE", "available", "describe", "native"]

# Which engine carries gRPC: "native" (the default where the extension is built), "grpcio" (both
# sides on grpcio: the fallback, also where the extension is missing), or one side native only:
# "native-server" (the gRPC listener) or "native-client" (calls to gRPC backends).
ENGINE_VARIABLE = "OIP_GATEWAY_HTTP2"
_ENGINES = ("native", "grpcio", "native-server", "native-client")


def available() -> bool:
    """Whether the compiled extension ``gateway.h2._h2`` is built and imports."""
    try:
        from gateway.h2 import _h2  # noqa: F401
    except ImportError:
        return False
    return True


def native(side: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``side`` ("server": the gRPC listener, "client": gRPC backends) runs on the
    extension. ValueError for an engine name that is not one of the four."""
    env = os.environ if environ is None else environ
    engine = env.get(ENGINE_VARIABLE, "native") or "native"
    if engine not in _ENGINES:
        raise ValueError(f"{ENGINE_VARIABLE}={engine!r}: expected one of {', '.join(_ENGINES)}")
    if engine == "grpcio" or engine == f"native-{'client' if side == 'server' else 'server'}":
        return False
    return available()


def describe(environ: Mapping[str, str] | None = None) -> str:
    """What the start-up log says of it."""
    server, client = native("server", environ), native("client", environ)
    if server and client:
        return "gRPC on the gateway's own HTTP/2 (libnghttp2) for the listener and the backends"
    if not available():
        return ("gRPC on grpcio: gateway.h2._h2 is not built (install libnghttp2-dev and reinstall for the "
                "gateway's own HTTP/2)")
    sides = "the listener" if server else "the backends" if client else "neither side"
    return f"gRPC on the gateway's own HTTP/2 for {sides}, grpcio for the rest ({ENGINE_VARIABLE})"
