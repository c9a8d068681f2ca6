"""The HTTP/1.1 client's own failures (the pools map them into the gateway's error tree:
upstream/http.py)."""
from __future__ import annotations

__all__ = ["ConnectFailed", "ConnectionDropped", "SourceStalled"]


class ConnectFailed(Exception):
    """No TCP connection could be made (refused, unreachable, connect timeout)."""


class SourceStalled(Exception):
    """A streamed request body stopped arriving from its client (idle past the timeout)."""


class ConnectionDropped(Exception):
    """The connection closed or broke before a complete answer arrived."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response

