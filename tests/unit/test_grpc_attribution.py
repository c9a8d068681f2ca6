"""Who is at fault when a gRPC backend's call fails (backends/grpcfault.py ``fault`` and
``GrpcBackend._mapped``): grpc-core reports a backend's reset as CANCELLED and an answer over the
channel's receive limit as RESOURCE_EXHAUSTED — a client's codes — so what grpc-core says
itself is told apart from the status a backend chose. The table pins grpc-core's words; the
last test checks them against the installed grpcio, on a real socket (tests/support/badgrpc.py)."""
from __future__ import annotations

import grpc
import pytest
from grpc import aio

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.backends.grpc import GrpcBackend
from gateway.backends.grpc_endpoint import METHOD_PREFIX, channel_options
from gateway.backends.grpcfault import Fault, fault
from gateway.backends.refusal import Refused
from gateway.config.backends import BackendSpec
from gateway.config.network import HostPort
from gateway.errors import (
    GatewayError,
    NoEndpointAvailable,
    UpstreamEncoding,
    UpstreamError,
    UpstreamFraming,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from tests.support.badgrpc import BadGrpc

RST8 = "Stream removed (RST_STREAM (Received RST_STREAM with error code 8))"

# (status code name, details as grpc-core gives them) -> Fault kind, or None: the backend's own.
TABLE = [
    ("CANCELLED", RST8, Fault.RESET),
    ("INTERNAL", "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))", Fault.RESET),
    ("RESOURCE_EXHAUSTED", "Stream removed (RST_STREAM (Received RST_STREAM with error code 11))", Fault.RESET),
    ("PERMISSION_DENIED", "Stream removed (RST_STREAM (Received RST_STREAM with error code 12))", Fault.RESET),
    ("UNAVAILABLE", "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))", Fault.REFUSED_STREAM),
    ("UNAVAILABLE", "Stream removed (GOAWAY received; Error code: 0; Debug Text: )", Fault.UNPROCESSED),
    ("UNAVAILABLE", "Stream removed (Socket closed (GOAWAY received; Error code: 2; Debug Text: ))", Fault.RESET),
    ("CANCELLED", "the backend cancelled this request itself", Fault.RESET),  # not the client's cancel
    ("CANCELLED", "", Fault.RESET),
    ("RESOURCE_EXHAUSTED", "Stream removed (CLIENT: Received message larger than max (1048676 vs. 1048576))",
     Fault.TOO_LARGE),
    ("RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max (5 vs. 4)", Fault.TOO_LARGE),
    ("RESOURCE_EXHAUSTED", "Stream removed (received metadata size exceeds hard limit (16732 vs. 16384);  "
     ":status:42B x-pad-0:1039B)", Fault.TOO_LARGE),  # an answer head over grpc's metadata limit
    ("INTERNAL", "Stream removed (Error parsing 'grpc-encoding' metadata)", Fault.ENCODING),
    ("INTERNAL", "Decompression failed due to zlib error", Fault.ENCODING),
    ("INTERNAL", "Compression bit set but no encoding configured", Fault.ENCODING),
    ("UNKNOWN", "No status received", Fault.FRAMING),
    ("DEADLINE_EXCEEDED", "Stream removed (Deadline Exceeded)", Fault.TIMEOUT),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", Fault.TIMEOUT),
    ("UNAVAILABLE", "Stream removed (Socket closed)", Fault.TRANSPORT),
    ("UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused",
     Fault.TRANSPORT),
    ("INTERNAL", "Stream removed (Failed parsing HTTP/2)", Fault.BAD),
    # The backend's own words: relayed.
    ("RESOURCE_EXHAUSTED", "Exceeds maximum queue size", None),
    ("RESOURCE_EXHAUSTED", "Received message larger than max (5000000 vs. 4194304)", None),  # its limit: our request
    ("RESOURCE_EXHAUSTED", "SERVER: Received message larger than max (5000000 vs. 4194304)", None),
    ("UNAVAILABLE", "Exceeds maximum queue size", None),
    ("UNKNOWN", "a status no gRPC version defines", None),  # grpc-status 42 reads as UNKNOWN
    ("INTERNAL", "boom", None),
    ("INVALID_ARGUMENT", "unexpected inference input 'X'", None),
]


@pytest.mark.parametrize("code, details, kind", TABLE)
def test_fault_tells_grpc_cores_words_from_the_backends(code, details, kind):
    found = fault(code, details)
    assert (found and found[0]) == kind, found


def _error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=details)


# What the backend raises for each, and how a client sees it.
MAPPED = [
    (grpc.StatusCode.CANCELLED, RST8, UpstreamReset, 502, "UNAVAILABLE",
     "reset the stream (RST_STREAM CANCEL) before its answer was complete"),
    (grpc.StatusCode.CANCELLED, "cancelled by me", UpstreamReset, 502, "UNAVAILABLE",
     "cancelled the call, which the gateway did not cancel (cancelled by me)"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stream removed (CLIENT: Received message larger than max (9 vs. 8))",
     UpstreamTooLarge, 502, "INTERNAL", "answered with a message of 9 bytes, over the backend's max_message_bytes (8)"),
    (grpc.StatusCode.INTERNAL, "Stream removed (Error parsing 'grpc-encoding' metadata)", UpstreamEncoding, 502,
     "INTERNAL", "answered in an encoding the gateway cannot read"),
    (grpc.StatusCode.UNKNOWN, "No status received", UpstreamFraming, 502, "INTERNAL", "without a grpc-status"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", UpstreamTimeout, 504, "DEADLINE_EXCEEDED",
     "did not answer within 2.5 s"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Exceeds maximum queue size", UpstreamError, 429, "RESOURCE_EXHAUSTED",
     "Exceeds maximum queue size"),
    (grpc.StatusCode.UNKNOWN, "odd", UpstreamError, 500, "UNKNOWN", "odd"),
]


@pytest.mark.parametrize("code, details, cls, status, grpc_code, words", MAPPED)
async def test_the_backend_raises_the_error_of_the_party_at_fault(code, details, cls, status, grpc_code, words):
    backend = GrpcBackend(BackendSpec("b", "grpc", (HostPort("127.0.0.1", 1),)))
    ep = backend._make(HostPort("127.0.0.1", 1))
    error = backend._mapped(ep, _error(code, details), 2.5)
    assert type(error) is cls and isinstance(error, GatewayError)
    assert (error.http_status, error.grpc_code) == (status, grpc_code)
    assert words in error.message
    if cls is not UpstreamError:  # the gateway's own finding names the backend and endpoint
        assert error.message.startswith("backend 'b' endpoint 127.0.0.1:1: ")


@pytest.mark.parametrize("details, kind", [
    ("Stream removed (GOAWAY received; Error code: 0; Debug Text: )", Refused.TRANSPORT),
    ("Stream removed (RST_STREAM (Received RST_STREAM with error code 7))", Refused.BUSY),
    ("Stream removed (Socket closed)", Refused.TRANSPORT),
])
async def test_what_was_not_processed_is_refused_so_another_endpoint_may_take_it(details, kind):
    backend = GrpcBackend(BackendSpec("b", "grpc", (HostPort("127.0.0.1", 1),)))
    ep = backend._make(HostPort("127.0.0.1", 1))
    error = backend._mapped(ep, _error(grpc.StatusCode.UNAVAILABLE, details), 1.0)
    assert isinstance(error, Refused) and error.kind == kind
    assert isinstance(error.error, NoEndpointAvailable)
    assert error.error.message.startswith("backend 'b' endpoint 127.0.0.1:1: ")


@pytest.mark.parametrize("details, sent", [
    ("Socket closed", True),
    ("Connection reset by peer", True),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused", False),
])
async def test_a_request_of_a_sequence_is_never_sent_twice(details, sent):
    """A connection that went after the call may have been sent: a sequence's step is not sent
    again (UpstreamReset); one that never connected is refused, so another endpoint may take it."""
    backend = GrpcBackend(BackendSpec("b", "grpc", (HostPort("127.0.0.1", 1),)))
    ep = backend._make(HostPort("127.0.0.1", 1))
    error = backend._mapped(ep, _error(grpc.StatusCode.UNAVAILABLE, details), 1.0, "m", "", True)
    if sent:
        assert type(error) is UpstreamReset and "not sent again" in error.message
    else:
        assert isinstance(error, Refused) and error.kind == Refused.TRANSPORT
    assert isinstance(backend._mapped(ep, _error(grpc.StatusCode.UNAVAILABLE, details), 1.0), Refused)


# model of tests/support/badgrpc.py -> the kind grpc-core's own report of it must be read as.
WIRE = {
    "reset_before_headers": Fault.RESET, "reset_after_headers": Fault.RESET, "reset_mid_message": Fault.RESET,
    "reset_internal": Fault.RESET, "refused_stream": Fault.REFUSED_STREAM, "goaway_unprocessed": Fault.UNPROCESSED,
    "goaway_processed": Fault.RESET, "close": Fault.TRANSPORT, "too_large": Fault.TOO_LARGE,
    "bad_encoding": Fault.ENCODING, "bad_gzip": Fault.ENCODING, "compressed_identity": Fault.ENCODING,
    "no_status": Fault.FRAMING, "silent": Fault.TIMEOUT, "huge_metadata": Fault.TOO_LARGE, "own_cancelled": Fault.RESET,
    "own_exhausted": None, "own_too_large": None, "unknown_status": None,
}


async def test_the_installed_grpcio_says_what_the_table_expects():
    """Each hostile behaviour on a real socket, through grpc.aio's call:
    grpc-core's code and words for it read as the table says (a grpcio upgrade that changes
    them fails here, not in production)."""
    limit = 1 << 16
    with BadGrpc(large=limit + 1) as bad:
        for model, kind in WIRE.items():
            # (A channel each: a GOAWAY or a close ends the connection.)
            async with aio.insecure_channel(bad.address, options=channel_options(limit)) as ch:
                method = METHOD_PREFIX + "ModelInfer"
                for call in (ch.unary_unary(method),):
                    with pytest.raises(aio.AioRpcError) as info:
                        # (Only the silent one waits out its deadline: the others must not meet
                        # theirs on a loaded machine.)
                        await call(pb.ModelInferRequest(model_name=model).SerializeToString(),
                                   timeout=0.5 if kind == Fault.TIMEOUT else 10)
                    found = fault(info.value.code().name, info.value.details() or "")
                    assert (found and found[0]) == kind, (model, info.value.code(), info.value.details())
