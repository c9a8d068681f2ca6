"""The gRPC front end's one mapping of a failed call to its status (frontend/grpcunary.py), which
the unary frame and ModelStreamInfer share."""
from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from gateway.errors import InvalidRequest, RateLimited, UpstreamError
from gateway.frontend.grpcunary import abort_with, failure_code
from gateway.observability.access import AccessRecord


class _Aborted(Exception):
    pass


class _Context:
    """What abort_with uses of grpc's ServicerContext: abort, which raises."""

    def __init__(self) -> None:
        self.aborted: tuple | None = None

    async def abort(self, code, details="", trailing_metadata=()):
        self.aborted = (code, details, tuple(trailing_metadata))
        raise _Aborted


def _abort(exc: Exception, record: AccessRecord | None = None) -> tuple:
    ctx = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(abort_with(ctx, exc, record, "infer"))
    assert ctx.aborted is not None
    return ctx.aborted


def test_a_gateway_error_ends_with_its_own_code_message_and_retry_hint():
    record = AccessRecord()
    assert _abort(InvalidRequest("bad shape"), record) == (grpc.StatusCode.INVALID_ARGUMENT, "bad shape", ())
    assert record.reason == "bad shape" and failure_code(InvalidRequest("x")) == "INVALID_ARGUMENT"
    code, _, trailers = _abort(RateLimited("slow down", retry_after=3))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailers == (("retry-after", "3"), ("grpc-retry-pushback-ms", "3000"))


def test_a_backends_error_is_relayed_but_is_not_the_records_reason():
    record = AccessRecord()
    assert _abort(UpstreamError("model crashed", grpc_code="UNAVAILABLE"), record)[:2] == \
        (grpc.StatusCode.UNAVAILABLE, "model crashed")
    assert record.reason == ""


def test_anything_else_is_internal_and_logged_with_its_traceback(caplog):
    with caplog.at_level(logging.ERROR, logger="oip_gateway.grpc"):
        try:
            raise KeyError("surprise")
        except KeyError as exc:
            assert _abort(exc) == (grpc.StatusCode.INTERNAL, "internal gateway error", ())
            assert failure_code(exc) == "INTERNAL"
    [entry] = caplog.records
    assert entry.getMessage() == "unhandled error in infer" and entry.exc_info is not None
