"""The HTTP/1.1 client's own failures (the HTTP backends map them into the gateway's error tree:
backends/http_exchange.py)."""
from __future__ import annotations

from typing import ClassVar

__all__ = ["BadAnswer", "ConnectFailed", "ConnectionDropped", "SourceStalled"]


class ConnectFailed(Exception):
    """No TCP connection could be made (refused, unreachable, connect timeout)."""


class SourceStalled(Exception):
    """A streamed request body stopped arriving from its client (idle past the timeout)."""


class ConnectionDropped(Exception):
    """The connection closed or broke before a complete answer arrived."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class BadAnswer(Exception):
    """The client refused what the backend sent (its connection is closed, never reused).
    ``kind``: FRAMING (invalid or ambiguous HTTP framing, RFC 9112 section 6; a malformed head;
    bytes where no answer was due) or TOO_LARGE (a head or body over the client's limits)."""

    FRAMING: ClassVar[str] = "framing"  # (ClassVar: class constants, also when mypyc compiles this module)
    TOO_LARGE: ClassVar[str] = "too_large"

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
