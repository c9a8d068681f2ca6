"""The wire scanner (routing fields of a gRPC message) and the one error tree."""
from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import errors
from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec.wire import scan_name_version


@given(name=st.text(max_size=50), version=st.text(max_size=10), raw=st.lists(st.binary(max_size=64), max_size=4))
def test_scan_matches_protobuf(name, version, raw):
    msg = pb.ModelInferRequest(model_name=name, model_version=version, id="x", raw_input_contents=raw)
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    msg.parameters["k"].int64_param = -5
    assert scan_name_version(msg.SerializeToString()) == (name, version)


def test_scan_field_order_free_and_last_wins():
    a = pb.ModelInferRequest(raw_input_contents=[b"\x00" * 10]).SerializeToString()
    b = pb.ModelInferRequest(model_name="first").SerializeToString()
    c = pb.ModelInferRequest(model_name="second", model_version="3").SerializeToString()
    assert scan_name_version(a + b + c) == ("second", "3")


@pytest.mark.parametrize("bad", [b"\x0a\x05ab", b"\x0a", b"\x80", b"\x0b", b"\x00\x01"])
def test_scan_rejects_malformed(bad):
    with pytest.raises(errors.InvalidRequest):
        scan_name_version(bad)


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_error_maps_to_http_and_grpc():
    for cls in _all_subclasses(errors.GatewayError):
        err = cls("boom") if cls is not errors.UpstreamError else cls("boom", http_status=418)
        assert 400 <= err.http_status <= 599, cls
        assert isinstance(getattr(grpc.StatusCode, err.grpc_code), grpc.StatusCode), cls
        assert err.grpc_code != "OK"


def test_upstream_error_crosses_protocols():
    assert errors.UpstreamError("x", http_status=404).grpc_code == "NOT_FOUND"
    assert errors.UpstreamError("x", http_status=400).grpc_code == "INVALID_ARGUMENT"
    assert errors.UpstreamError("x", grpc_code="INVALID_ARGUMENT").http_status == 400
    assert errors.UpstreamError("x", grpc_code="UNAVAILABLE").http_status == 503
    for code in errors.HTTP_TO_GRPC.values():
        assert hasattr(grpc.StatusCode, code)
    for code in errors.GRPC_TO_HTTP:
        assert hasattr(grpc.StatusCode, code)
