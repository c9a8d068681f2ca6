"""The one error hierarchy of the gateway.

Every failure the gateway reports is a :class:`GatewayError`. Each class carries
the HTTP status and the gRPC status code name it maps to; the HTTP front end
and the gRPC front end each map it exactly once (``frontend/http.py``,
``frontend/grpc.py``). The code name is a string so that modules below the
transports (codec, routing, config) import no grpc.

    GatewayError
    ├── InvalidRequest        400  INVALID_ARGUMENT   malformed body, bad tensor, bad header
    │   ├── LimitExceeded     400  INVALID_ARGUMENT   a request over a hard limit (names the limit)
    │   ├── NegativeDimension 400  INVALID_ARGUMENT   a tensor shape with a negative dimension
    │   └── MalformedMessage  400  INTERNAL           a gRPC request's message cut short or followed by more
    ├── ModelNotFound         404  NOT_FOUND          no route for the model / version
    ├── PayloadTooLarge       413  RESOURCE_EXHAUSTED body over the configured limit
    ├── HeadTooLarge          431  RESOURCE_EXHAUSTED a request head over max_header_count / max_header_bytes
    ├── Unsupported           400  UNIMPLEMENTED      a valid request the gateway cannot carry
    ├── UnsupportedEncoding   415  INVALID_ARGUMENT   a body in a Content-Encoding other than gzip/deflate
    ├── Unauthenticated       401  UNAUTHENTICATED    no credential, or one that does not verify
    ├── PermissionDenied      403  PERMISSION_DENIED  a credential not allowed this model / operation
    ├── RateLimited           429  RESOURCE_EXHAUSTED a credential's or a model's rate limit (Retry-After)
    ├── RequestTimeout        408  DEADLINE_EXCEEDED  the client stopped sending its request body
    ├── Overloaded            503  UNAVAILABLE        admission control refused it (max_inflight_bytes; Retry-After)
    ├── NoEndpointAvailable   503  UNAVAILABLE        no endpoint of the backend answered
    │   └── ModelNotReady     503  UNAVAILABLE        the route exists; no endpoint has the model ready
    ├── UpstreamTimeout       504  DEADLINE_EXCEEDED  the backend did not answer in time
    ├── UpstreamReset         502  UNAVAILABLE        the backend reset, cancelled or closed mid-answer
    ├── BadUpstreamResponse   502  INTERNAL           the backend's answer could not be decoded
    │   ├── UpstreamFraming   502  INTERNAL           its HTTP framing is invalid (RFC 9112)
    │   ├── UpstreamTooLarge  502  INTERNAL           its head or body is over the gateway's limit
    │   └── UpstreamEncoding  502  INTERNAL           a Content-Encoding / grpc-encoding not readable
    └── UpstreamError         any  any                the backend's own error, relayed as-is

Not GatewayErrors, also defined here: ListenError (a listener could not be bound) and ConfigError
(an invalid configuration file); neither ever reaches a client.

A backend's fault is never a client's 4xx: what the gateway refuses of a backend's answer is a
502 (INTERNAL), a reset the client did not cause 502 (UNAVAILABLE), never 413 / 429 /
RESOURCE_EXHAUSTED / CANCELLED, which would tell the client to change its own request. The class
name is the ``kind`` label of ``oip_gateway_upstream_errors_total``.
"""
from __future__ import annotations

__all__ = [
    "GRPC_TO_HTTP",
    "INTERNAL_MESSAGE",
    "HTTP_TO_GRPC",
    "SHARED_MEMORY_REFUSAL",
    "BadUpstreamResponse",
    "ConfigError",
    "GatewayError",
    "HeadTooLarge",
    "InvalidRequest",
    "LimitExceeded",
    "ListenError",
    "MalformedMessage",
    "ModelNotFound",
    "ModelNotReady",
    "NegativeDimension",
    "NoEndpointAvailable",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RequestTimeout",
    "Unauthenticated",
    "Unsupported",
    "UnsupportedEncoding",
    "UpstreamEncoding",
    "UpstreamError",
    "UpstreamFraming",
    "UpstreamReset",
    "UpstreamTimeout",
    "UpstreamTooLarge",
]


# What a client is told of a failure of the gateway's own (a bug; logged with its traceback):
# every transport says this and nothing more (HTTP 500, gRPC INTERNAL).
INTERNAL_MESSAGE = "internal gateway error"


class GatewayError(Exception):
    """Base of every error a client can see. ``str(err)`` is the client-facing message."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"
    # Seconds after which a retry may succeed (HTTP Retry-After; gRPC trailing metadata
    # retry-after and grpc-retry-pushback-ms), for refusals that are about load.
    retry_after: int | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(GatewayError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class LimitExceeded(InvalidRequest):
    """A request over one of the hard limits (``limits`` in the config); the message names
    the limit's key, so an operator knows what to raise."""


class NegativeDimension(InvalidRequest):
    """A tensor shape with a negative dimension, refused before routing on every path
    (codec/limits.py). Its own class so that the wire walk, which leaves malformed messages to
    protobuf's parser, does not take it for one."""


class MalformedMessage(InvalidRequest):
    """A gRPC request whose framing is broken: its stream ends inside its message, or a unary
    call carries more than one. INTERNAL, as grpc's own servers answer it; the client's fault."""

    grpc_code = "INTERNAL"


class Unauthenticated(GatewayError):
    """No credential where the route needs one, or one that does not verify. HTTP answers
    carry ``WWW-Authenticate: Bearer`` (RFC 6750 section 3)."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class PermissionDenied(GatewayError):
    """A valid credential that may not use this model (or model control / settings)."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class RateLimited(GatewayError):
    """Over a credential's or a model's rate limit: retry after ``retry_after`` seconds."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotFound(GatewayError):
    http_status = 404
    grpc_code = "NOT_FOUND"


class PayloadTooLarge(GatewayError):
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class HeadTooLarge(GatewayError):
    """A request head past ``max_header_count`` / ``max_header_bytes`` (RFC 6585 section 5);
    the connection is closed after the answer (its body is not read)."""

    http_status = 431
    grpc_code = "RESOURCE_EXHAUSTED"


class Unsupported(GatewayError):
    http_status = 400
    grpc_code = "UNIMPLEMENTED"


class UnsupportedEncoding(GatewayError):
    """A request body in a Content-Encoding the gateway cannot read (only gzip and deflate)."""

    http_status = 415
    grpc_code = "INVALID_ARGUMENT"


class NoEndpointAvailable(GatewayError):
    http_status = 503
    grpc_code = "UNAVAILABLE"


class ModelNotReady(NoEndpointAvailable):
    """The model is routed, but no endpoint of its backend has it ready now (a pod still
    loading it, or every endpoint down): retry later. Not a 404: the route exists."""


class Overloaded(GatewayError):
    """Admission control refused the request (max_inflight_bytes): retry later."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    retry_after = 1


class RequestTimeout(GatewayError):
    """The client stopped sending its request body (a streamed upload stalled)."""

    http_status = 408
    grpc_code = "DEADLINE_EXCEEDED"


class UpstreamTimeout(GatewayError):
    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class UpstreamReset(GatewayError):
    """The backend broke the exchange off: the connection closed or reset mid-answer, an HTTP/2
    stream reset (RST_STREAM, even with CANCEL) or GOAWAY the client did not cause. UNAVAILABLE,
    not CANCELLED: the client did not cancel."""

    http_status = 502
    grpc_code = "UNAVAILABLE"


class BadUpstreamResponse(GatewayError):
    """A backend's answer the gateway cannot read or will not relay (a broken or non-V2
    backend). The subclasses say why."""

    http_status = 502
    grpc_code = "INTERNAL"


class UpstreamFraming(BadUpstreamResponse):
    """An HTTP answer whose framing is invalid or ambiguous (RFC 9112 section 6): conflicting or
    bad lengths, a malformed head, an unexpected 101, bytes where no answer was due."""


class UpstreamTooLarge(BadUpstreamResponse):
    """An answer over one of the gateway's limits on backends: its head (header count or
    bytes), its body (the backend's ``max_message_bytes``; a health or index answer's own cap).
    A 502, never a 413 / RESOURCE_EXHAUSTED: the client's request was fine."""


class UpstreamEncoding(BadUpstreamResponse):
    """An answer in a Content-Encoding (or grpc-encoding) the gateway cannot read."""


# Status mapping used when an error crosses protocols (HTTP backend → gRPC client
# and the reverse), following Triton's own mapping of its error codes.
HTTP_TO_GRPC: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ALREADY_EXISTS",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
GRPC_TO_HTTP: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INTERNAL": 500,
    "DATA_LOSS": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


class UpstreamError(GatewayError):
    """The backend answered with an error; relay its status and message unchanged.

    ``body`` is the backend's HTTP error body when it came over HTTP, so that an
    HTTP client sees exactly what the backend said; ``status_details`` its gRPC
    ``grpc-status-details-bin`` (a serialized google.rpc.Status), relayed to a gRPC client.
    """

    def __init__(
        self,
        message: str,
        *,
        http_status: int | None = None,
        grpc_code: str | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        status_details: bytes | None = None,
    ) -> None:
        super().__init__(message)
        if http_status is None:
            http_status = GRPC_TO_HTTP.get(grpc_code or "UNKNOWN", 500)
        if grpc_code is None:
            grpc_code = HTTP_TO_GRPC.get(http_status, "UNKNOWN" if http_status >= 500 else "INVALID_ARGUMENT")
        self.http_status = http_status
        self.grpc_code = grpc_code
        self.body = body
        self.content_type = content_type
        self.status_details = status_details


# Triton's shared-memory extension (system and CUDA) registers regions of one host's memory;
# through a gateway the client and the server are on different hosts.
SHARED_MEMORY_REFUSAL = (
    "shared memory cannot cross the gateway: a region lives in the memory of one host or GPU, and the "
    "gateway sits on a network hop between the client and the server; send the tensors in the request")


class ListenError(Exception):
    """A listener could not be bound (port taken, address not local). Not a GatewayError."""


class ConfigError(Exception):
    """A configuration file is invalid. Not a GatewayError: it never reaches a client.

    ``problems`` lists one message per error, each naming the key; ``digest`` is the
    SHA-256 of the file's bytes when it could be read.
    """

    def __init__(self, problems: list[str], digest: bytes | None = None) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.digest = digest
