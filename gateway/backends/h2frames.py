"""gRPC's framing on HTTP/2 as the backend client reads and writes it: the request head, the
length-prefixed messages of an answer, and the status it ends with. Pure: no I/O.

The reference is "gRPC over HTTP2" (doc/PROTOCOL-HTTP2.md in grpc/grpc): a message is
``Compressed-Flag`` (1 byte) + ``Message-Length`` (4 bytes, big-endian) + the message; an answer
is a head (``:status 200``, ``content-type application/grpc...``), messages and trailers carrying
``grpc-status`` — or, for an answer without messages, one head carrying it all ("Trailers-Only").
Every way an answer breaks these rules raises :class:`AnswerFault` with the
:class:`~.grpcfault.Fault` kind that says who is at fault.
"""
from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence

from ..codec import grpcframe
from ..codec.grpcframe import ACCEPT_ENCODING, FrameError, decode_message
from ..codec.grpcframe import frame as prefix
from .grpcfault import Fault

__all__ = ["ACCEPT_ENCODING", "STATUS_NAMES", "AnswerFault", "CallError", "Head", "MessageReader", "Status",
           "answer_head", "answer_status", "fault_error", "metadata_headers", "prefix", "timeout_value"]

# grpc-status values (doc/statuscodes.md in grpc/grpc); any other value reads as UNKNOWN, as
# grpc-core reads it.
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")

# Request header names the client sets itself, or that HTTP/2 forbids on a request (RFC 9113
# section 8.2.2): metadata never carries them.
_RESERVED = frozenset({
    "content-type", "te", "user-agent", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "connection",
    "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "content-length",
})
_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")


# The status a fault ends the call with (grpc-core's for the same events).
_FAULT_CODES = {Fault.TIMEOUT: "DEADLINE_EXCEEDED", Fault.TRANSPORT: "UNAVAILABLE", Fault.UNPROCESSED: "UNAVAILABLE",
                Fault.REFUSED_STREAM: "UNAVAILABLE", Fault.RESET: "UNAVAILABLE", Fault.TOO_LARGE: "RESOURCE_EXHAUSTED",
                Fault.ENCODING: "INTERNAL", Fault.FRAMING: "INTERNAL", Fault.BAD: "INTERNAL"}


class CallError(Exception):
    """A call that failed. ``code``: a gRPC status name; ``details``: the backend's
    ``grpc-message`` (percent-decoded) or the gateway's words; ``fault``: (a :class:`Fault`
    kind, why) when the exchange failed rather than the backend answering with a status (None
    then); ``never_sent``: the request never left (no connection could be made), so even a
    request of a sequence may go elsewhere; ``status_details``: the backend's
    ``grpc-status-details-bin`` (decoded), for relaying."""

    def __init__(self, code: str, details: str, fault: tuple[str, str] | None = None, *, never_sent: bool = False,
                 status_details: bytes | None = None) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.fault = fault
        self.never_sent = never_sent
        self.status_details = status_details


def fault_error(kind: str, why: str, never_sent: bool = False) -> CallError:
    """The CallError of a fault: the status grpc-core gives the same event, ``why`` as details."""
    return CallError(_FAULT_CODES[kind], why, (kind, why), never_sent=never_sent)


class AnswerFault(Exception):
    """An answer that breaks gRPC's rules: ``kind`` is a :class:`Fault` kind, ``why`` reads
    after "backend 'x' endpoint h:p: "."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


# grpc-timeout units, finest first: the value is the deadline rounded up in the finest unit
# whose count fits the spec's 8 digits ("TimeoutValue → {positive integer as ASCII string of
# at most 8 digits}").
_UNITS = ((1e3, b"m"), (1.0, b"S"), (1 / 60, b"M"), (1 / 3600, b"H"))


def timeout_value(seconds: float) -> bytes:
    """``grpc-timeout`` for a deadline ``seconds`` away: milliseconds (rounded up, at least 1)
    while they fit in 8 digits, else seconds, minutes or hours."""
    for scale, unit in _UNITS:
        count = max(1, math.ceil(round(seconds * scale, 6)))
        if count < 100_000_000:
            return str(count).encode("ascii") + unit
    return b"99999999H"


def metadata_headers(metadata: Sequence[tuple[str, str | bytes]]) -> list[tuple[bytes, bytes]]:
    """A call's metadata as request header fields: names in lower case; a ``-bin`` name's value
    base64-encoded without padding (PROTOCOL-HTTP2.md "Binary-Header"); names HTTP/2 or gRPC
    reserve, names with characters gRPC does not allow and values with CR, LF or NUL left out."""
    out: list[tuple[bytes, bytes]] = []
    for key, value in metadata:
        name = key.lower()
        if name.startswith((":", "grpc-")) or name in _RESERVED:
            continue
        raw = name.encode("ascii", "replace")
        if not raw or not _NAME_CHARS.issuperset(raw):
            continue
        data = value if isinstance(value, bytes) else value.encode("utf-8")
        if name.endswith("-bin"):
            data = base64.b64encode(data).rstrip(b"=")
        else:
            data = data.strip(b" \t")
            if b"\r" in data or b"\n" in data or b"\0" in data:
                continue
        out.append((raw, data))
    return out


class Status:
    """How a call ended, as the backend said: ``code`` (a status name), ``message`` (its
    ``grpc-message``, percent-decoded) and ``details`` (``grpc-status-details-bin``, decoded;
    None when absent or not base64)."""

    __slots__ = ("code", "details", "message")

    def __init__(self, code: str, message: str, details: bytes | None) -> None:
        self.code = code
        self.message = message
        self.details = details


def _decode_bin(value: bytes) -> bytes | None:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def answer_status(fields: dict[bytes, bytes]) -> Status | None:
    """The status in trailers (or a Trailers-Only head); None without ``grpc-status``."""
    raw = fields.get(b"grpc-status")
    if raw is None:
        return None
    n = int(raw) if raw.isdigit() and len(raw) <= 3 else -1
    code = STATUS_NAMES[n] if 0 <= n < len(STATUS_NAMES) else "UNKNOWN"
    message = fields.get(b"grpc-message")
    details = fields.get(b"grpc-status-details-bin")
    return Status(code, "" if message is None else decode_message(message),
                  None if details is None else _decode_bin(details))


class Head:
    """An answer's head, checked: its ``encoding`` (``grpc-encoding``, b"" when absent) and, for
    a Trailers-Only answer, its ``status``."""

    __slots__ = ("encoding", "status")

    def __init__(self, encoding: bytes, status: Status | None) -> None:
        self.encoding = encoding
        self.status = status


def answer_head(headers: list[tuple[bytes, bytes]], end: bool) -> Head:
    """Checks an answer's head (``end``: no body follows, a Trailers-Only answer). Raises
    AnswerFault for an HTTP status other than 200, a content-type that is not gRPC's, or a
    Trailers-Only answer without grpc-status."""
    fields = dict(headers)
    status = fields.get(b":status")
    if status != b"200":
        shown = "none" if status is None else status.decode("latin-1")
        raise AnswerFault(Fault.BAD, f"answered with HTTP status {shown} (a gRPC answer has 200)")
    ctype = fields.get(b"content-type")
    if ctype is None or not (ctype == b"application/grpc" or ctype.startswith((b"application/grpc+",
                                                                                  b"application/grpc;"))):
        shown = "none" if ctype is None else repr(ctype.decode("latin-1"))
        raise AnswerFault(Fault.BAD, f"answered with content-type {shown}, not application/grpc")
    if not end:
        return Head(fields.get(b"grpc-encoding", b""), None)
    trailers_only = answer_status(fields)
    if trailers_only is None:
        raise AnswerFault(Fault.FRAMING, "ended its answer without a grpc-status (the gRPC protocol requires one "
                                         "in trailers)")
    return Head(b"", trailers_only)


class MessageReader(grpcframe.MessageReader):
    """The codec's message reader (codec/grpcframe.py), its refusals in a backend's words
    (AnswerFault: the backend sent it)."""

    __slots__ = ()

    @property
    def partial(self) -> bool:
        """Whether a message has begun and not ended."""
        return self.pending > 0

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes (often none or one). Raises AnswerFault."""
        try:
            return super().feed(data)
        except FrameError as err:
            raise _fault(err, self.limit) from None


def _fault(err: FrameError, limit: int) -> AnswerFault:
    if err.kind == FrameError.TOO_LARGE:
        if err.size >= 0:
            return AnswerFault(Fault.TOO_LARGE, f"answered with a message of {err.size} bytes, over the backend's "
                                                f"max_message_bytes ({limit})")
        return AnswerFault(Fault.TOO_LARGE, f"answered with a message of over {limit} bytes once decompressed, over "
                                            f"the backend's max_message_bytes ({limit})")
    if err.kind == FrameError.ENCODING:
        return AnswerFault(Fault.ENCODING, f"answered in an encoding the gateway cannot read ({err.message})")
    return AnswerFault(Fault.FRAMING, f"sent {err.message}")
