"""What the HTTP/1.1 client accepts of a backend's answer: everything a backend sends is
bounded, as everything a client sends is (the listener's ``max_header_count`` /
``max_header_bytes``)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AnswerLimits", "MAX_INTERIM"]

# Interim (1xx) answers accepted before the final one of an exchange (RFC 9110 section 15.2:
# a client must be able to read several; more than this is a backend looping).
MAX_INTERIM = 8


@dataclass(frozen=True, slots=True)
class AnswerLimits:
    """``max_header_count`` headers and ``max_head_bytes`` bytes of status line and headers
    per answer head (interim heads count with the final one); ``max_body_bytes`` of body,
    whatever its framing (Content-Length, chunked or read to the connection's end): a
    Content-Length over it is refused before a byte of the body is read, others as soon
    as the bytes that arrived pass it."""

    max_header_count: int = 100
    max_head_bytes: int = 65536
    max_body_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_header_count < 1 or self.max_head_bytes < 1024 or self.max_body_bytes < 1:
            raise ValueError("answer limits: max_header_count >= 1, max_head_bytes >= 1024, max_body_bytes >= 1")
