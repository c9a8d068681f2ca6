"""Sequence affinity: finding sequence_id on the wire and pinning it to one endpoint."""
from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec.content import sequence_key, sequence_of_json
from gateway.codec.wire import scan_infer_routing
from gateway.routing import RoundRobin


def grpc_message(**param) -> bytes:
    msg = pb.ModelInferRequest(model_name="m", model_version="2")
    msg.parameters["priority"].int64_param = 3
    for kind, value in param.items():
        setattr(msg.parameters["sequence_id"], kind, value)
    msg.raw_input_contents.append(b"\0" * 64)
    return msg.SerializeToString()


@pytest.mark.parametrize("param, want", [
    ({}, None),
    ({"int64_param": 42}, "42"),
    ({"int64_param": -7}, "-7"),
    ({"int64_param": 0}, None),
    ({"uint64_param": 2**64 - 1}, str(2**64 - 1)),
    ({"string_param": "corr-1"}, "corr-1"),
    ({"string_param": ""}, None),
])
def test_grpc_sequence_id(param, want):
    assert scan_infer_routing(grpc_message(**param)) == ("m", "2", want)


@pytest.mark.parametrize("doc, want", [
    ({"inputs": []}, None),
    ({"parameters": {"sequence_id": 9, "sequence_start": True}, "inputs": []}, "9"),
    ({"parameters": {"sequence_id": "abc"}, "inputs": []}, "abc"),
    ({"parameters": {"sequence_id": 0}, "inputs": []}, None),
    ({"parameters": {"sequence_id": True}, "inputs": []}, None),
    ({"inputs": [{"name": "sequence_id", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}, None),
])
def test_json_sequence_id(doc, want):
    assert sequence_of_json(orjson.dumps(doc), None) == want


def test_json_sequence_id_only_in_the_json_part():
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "parameters": {"binary_data_size": 13}}]})
    body = header + b'"sequence_id"'
    assert sequence_of_json(body, str(len(header))) is None
    assert sequence_of_json(b"{not json", None) is None
    assert sequence_key(5) == "5" and sequence_key(None) is None and sequence_key(1.5) is None


@dataclass
class Ep:
    address: str
    inflight: int = 0


def test_same_key_same_endpoint_and_keys_spread():
    eps = [Ep(f"10.0.0.{i}:8001") for i in range(3)]
    rr = RoundRobin()
    first = {key: rr.order(eps, key)[0].address for key in map(str, range(300))}
    for key in ("1", "77", "299"):
        assert all(rr.order(eps, key)[0].address == first[key] for _ in range(5))
    counts = {a: list(first.values()).count(a) for a in {e.address for e in eps}}
    assert len(counts) == 3 and min(counts.values()) > 50, counts


def test_endpoint_leaving_moves_only_its_own_sequences():
    eps = [Ep(f"10.0.0.{i}:8001") for i in range(3)]
    rr = RoundRobin()
    before = {key: rr.order(eps, key)[0].address for key in map(str, range(300))}
    after = {key: rr.order(eps[1:], key)[0].address for key in map(str, range(300))}
    for key in before:
        if before[key] != eps[0].address:
            assert after[key] == before[key]
        else:
            assert after[key] != eps[0].address
