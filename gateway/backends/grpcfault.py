"""What grpc-core's own reports of a failed call mean, told from a status a backend chose: read
from grpc-core's words in the status details (grpcio 1.85; tests/unit/test_grpc_attribution.py
pins them against the installed grpcio, so an upgrade that changes them fails there). Pure: no
grpc import, no I/O; the backend maps a kind into the error tree (``backends/grpc.py`` ``_mapped``).

The gateway's own HTTP/2 client (``h2channel.py``) knows these kinds first-hand and words them
with the same helpers (:func:`stream_reset`, :func:`went_away`, :func:`own_status`), so a client
sees the same message whichever client made the call."""
from __future__ import annotations

import re

__all__ = ["H2_ERRORS", "Fault", "fault", "never_sent", "own_status", "seconds", "stream_reset", "transport_failure",
           "went_away"]


# grpc's words for a call that never left: no connection could be made.
_NOT_SENT = ("failed to connect", "connection refused", "connect failed", "unreachable", "failed to pick subchannel",
             "dns resolution failed", "connections to all backends failing", "no connection")


def never_sent(details: str) -> bool:
    details = details.lower()
    return any(s in details for s in _NOT_SENT)


def transport_failure(details: str) -> bool:
    """UNAVAILABLE raised by grpc itself (connect failed, connection reset) rather than
    a backend's own answer: grpc's messages for those are fixed strings."""
    details = details.lower()
    return any(s in details for s in (
        "failed to connect", "connection refused", "connection reset", "socket closed", "connect failed",
        "broken pipe", "endpoint closing", "transport closing", "goaway", "unreachable", "no connection",
        "failed to pick subchannel", "dns resolution failed", "connections to all backends failing",
        "recvmsg", "sendmsg", "end of tcp stream", "keepalive", "stream removed"))


class Fault:
    """Kinds of :func:`fault`: what grpc-core says went wrong with an exchange."""

    TIMEOUT = "timeout"  # the deadline passed: UpstreamTimeout
    TRANSPORT = "transport"  # unreachable, or the connection went (no word of GOAWAY): Refused
    UNPROCESSED = "unprocessed"  # GOAWAY before the backend took the stream: Refused (retried)
    REFUSED_STREAM = "refused_stream"  # RST_STREAM(REFUSED_STREAM): Refused (retried)
    RESET = "reset"  # the backend reset or cancelled the call, or went away with it: UpstreamReset
    TOO_LARGE = "too_large"  # an answer over max_message_bytes: UpstreamTooLarge
    ENCODING = "encoding"  # a grpc-encoding or compressed message grpc cannot read: UpstreamEncoding
    FRAMING = "framing"  # an answer that breaks gRPC's framing (no grpc-status): UpstreamFraming
    BAD = "bad"  # another HTTP/2 or gRPC violation grpc-core refused: BadUpstreamResponse


# grpc-core's own words (grpcio 1.85, tests/unit/test_grpc_attribution.py). RFC 9113 section 7
# error codes of a RST_STREAM: grpc-core turns 8 (CANCEL) into CANCELLED, 11 into
# RESOURCE_EXHAUSTED, 12 into PERMISSION_DENIED — a client's codes for a backend's act.
_RST = re.compile(r"Received RST_STREAM with error code (\d+)")
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
              5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
              9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY",
              13: "HTTP_1_1_REQUIRED"}
_GOAWAY = re.compile(r"GOAWAY received; Error code: (\d+)")
# The client side's message-size check; "CLIENT: " since grpc 1.6x, a "Stream removed (...)"
# wrapper when grpc-core ends the stream itself. A backend's own RESOURCE_EXHAUSTED saying it
# received too large a message (the gateway's request, over the backend's limit) has neither.
_TOO_LARGE = re.compile(r"(CLIENT: )?Received message larger than max \((\d+) vs\. (\d+)\)")
_ENCODING = re.compile(r"grpc-encoding|decompress|compression (bit|algorithm)|encoding configured", re.IGNORECASE)
_METADATA = re.compile(r"metadata size exceeds (?:hard |soft )?limit \((\d+) vs\. (\d+)\)")
_LOCAL = "Stream removed ("  # grpc-core's wrapper of the error that ended a stream on its side
_NO_STATUS = "No status received"


def stream_reset(code: int) -> tuple[str, str]:
    """A backend's RST_STREAM with HTTP/2 error ``code``, before its answer was complete."""
    if code == 7:  # RFC 9113 section 8.7: "the stream was not processed", safe to retry
        return Fault.REFUSED_STREAM, "refused the stream (RST_STREAM REFUSED_STREAM) before processing it"
    return Fault.RESET, f"reset the stream (RST_STREAM {H2_ERRORS.get(code, str(code))}) before its answer was complete"


def went_away(code: int, processed: bool) -> tuple[str, str]:
    """A backend's GOAWAY with error ``code``; ``processed``: the call's stream was at or below
    its last stream id (it may have run) and the connection closed unanswered."""
    name = H2_ERRORS.get(code, str(code))
    if processed:
        return Fault.RESET, f"went away (GOAWAY {name}, then closed the connection) with the call in flight, unanswered"
    return Fault.UNPROCESSED, f"went away (GOAWAY {name}) before processing the call; it may be sent elsewhere"


def own_status(code: str, details: str) -> tuple[str, str] | None:
    """A status the backend itself sent that still reads as a fault: CANCELLED (the gateway's own
    cancel never comes back as a status) and DEADLINE_EXCEEDED."""
    if code == "DEADLINE_EXCEEDED":
        return Fault.TIMEOUT, "did not answer in time"
    if code == "CANCELLED":
        return Fault.RESET, f"cancelled the call, which the gateway did not cancel ({details or 'no message'})"
    return None


def fault(code: str, details: str) -> tuple[str, str] | None:
    """What grpc-core itself reports of a failed call (``code``: the status code's name), as
    (a :class:`Fault` kind, why — for the message after "backend 'x' endpoint h:p: "); None when
    the status is the backend's own answer, to relay as it is. Not the client's fault either
    way: a call the gateway cancels itself (its client left) raises CancelledError, never a
    status, so a CANCELLED status is always the backend's doing."""
    if code == "DEADLINE_EXCEEDED":
        return Fault.TIMEOUT, "did not answer in time"
    rst = _RST.search(details)
    if rst is not None:
        return stream_reset(int(rst.group(1)))
    goaway = _GOAWAY.search(details)
    if goaway is not None:
        # "Socket closed": the stream was at or below GOAWAY's last stream id: it may have run.
        return went_away(int(goaway.group(1)), "socket closed" in details.lower())
    if code == "CANCELLED":
        return own_status(code, details)
    if code == "RESOURCE_EXHAUSTED":
        big = _TOO_LARGE.search(details)
        if big is not None and (big.group(1) or details.startswith(_LOCAL)):
            return Fault.TOO_LARGE, (f"answered with a message of {big.group(2)} bytes, over the backend's "
                                     f"max_message_bytes ({big.group(3)})")
        meta = _METADATA.search(details)
        if meta is not None and details.startswith(_LOCAL):
            # grpc-core's own bound on a head (grpc.max_metadata_size): the answer's headers
            return Fault.TOO_LARGE, (f"answered with {meta.group(1)} bytes of headers (metadata), over grpc's "
                                     f"limit ({meta.group(2)})")
        if details.startswith(_LOCAL):
            return Fault.TOO_LARGE, f"sent more than the gateway accepts ({details})"
        return None
    if code in ("INTERNAL", "UNIMPLEMENTED") and _ENCODING.search(details):
        return Fault.ENCODING, f"answered in an encoding the gateway cannot read ({details})"
    if code == "UNKNOWN" and details == _NO_STATUS:
        return Fault.FRAMING, "ended its answer without a grpc-status (the gRPC protocol requires one in trailers)"
    if code == "UNAVAILABLE":
        return (Fault.TRANSPORT, details) if transport_failure(details) else None
    if details.startswith(_LOCAL):
        return Fault.BAD, f"broke the HTTP/2 exchange off ({details})"
    return None


def seconds(tmo: float | None) -> str:
    return "its deadline" if tmo is None else f"{tmo:.3g} s"
