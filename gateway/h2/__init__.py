"""HTTP/2 on libnghttp2: the gateway's own gRPC data path (docs/h2-design.md).

``gateway.h2._h2`` is a C extension (gateway/h2/_h2.c, documented in _h2.pyi) with one type per
side of a TCP connection, ``ServerConnection`` and ``ClientConnection``, each wrapping one
nghttp2 session. Python feeds it received bytes and writes what it flushes; it sees coarse events
(a request or answer head, its body, its trailers, an abnormal close), never a frame. Flow
control, header-list limits and flood limits (rapid reset, CONTINUATION, PING, SETTINGS, ...) run
in C.

The extension is built only where libnghttp2's header is installed (setup.py), so importers ask
``available()`` first.
"""
from __future__ import annotations


def available() -> bool:
    """Whether the compiled extension ``gateway.h2._h2`` is built and imports."""
    try:
        from gateway.h2 import _h2  # noqa: F401
    except ImportError:
        return False
    return True
