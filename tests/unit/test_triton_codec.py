"""codec/triton.py: Triton's model configuration and statistics between JSON and protobuf,
exactly, and statistics summed over endpoints."""
from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._pb import model_config_pb2 as mc
from gateway._pb import triton_extensions_pb2 as tx
from gateway.codec.tritonjson import config_from_json, config_to_json, message_to_json, parse_message
from gateway.codec.tritonstats import stats_from_json, stats_from_pb, stats_sum, stats_to_json
from gateway.errors import BadUpstreamResponse, InvalidRequest

U64 = st.integers(0, (1 << 64) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
F32 = st.floats(width=32, allow_nan=False)


def duration(count: int, ns: int) -> tx.StatisticDuration:
    return tx.StatisticDuration(count=count, ns=ns)


NAMES = st.sampled_from(["a", "b", "c"])
SMALL = st.integers(0, 1 << 40)


@st.composite
def model_stats(draw, name=NAMES, small=SMALL) -> tx.ModelStatistics:
    d = lambda: duration(draw(small), draw(small))
    s = tx.ModelStatistics(name=draw(name), version=draw(st.sampled_from(["1", "2"])),
                           last_inference=draw(small), inference_count=draw(small),
                           execution_count=draw(small))
    s.inference_stats.CopyFrom(tx.InferStatistics(success=d(), fail=d(), queue=d(), compute_input=d(),
                                                  compute_infer=d(), compute_output=d(), cache_hit=d(),
                                                  cache_miss=d()))
    for size in draw(st.lists(st.integers(1, 8), unique=True, max_size=3)):
        s.batch_stats.add(batch_size=size, compute_input=d(), compute_infer=d(), compute_output=d())
    for i in draw(st.lists(st.integers(0, 2), unique=True, max_size=2)):
        s.memory_usage.add(type="CPU", id=i, byte_size=draw(small))
    for key in draw(st.lists(st.sampled_from(["0", "1"]), unique=True, max_size=2)):
        s.response_stats[key].CopyFrom(tx.InferResponseStatistics(success=d(), fail=d(), compute_infer=d()))
    return s


@settings(max_examples=200)
@given(st.lists(model_stats(name=st.text(max_size=5), small=U64), max_size=3))
def test_statistics_round_trip_json_and_protobuf(items):
    msg = tx.ModelStatisticsResponse(model_stats=items)
    doc = orjson.loads(stats_to_json(msg))
    # Numbers, as Triton writes them, never protobuf's strings for uint64.
    for s in doc["model_stats"]:
        assert isinstance(s["inference_count"], int)
        assert isinstance(s["inference_stats"]["success"]["ns"], int)
    assert stats_from_json(stats_to_json(msg)) == msg
    assert stats_from_pb(msg.SerializeToString()) == msg


@settings(max_examples=200)
@given(st.lists(st.lists(model_stats(), max_size=3, unique_by=lambda s: (s.name, s.version)), min_size=1, max_size=4))
def test_statistics_sum(endpoints):
    parts = [tx.ModelStatisticsResponse(model_stats=items) for items in endpoints]
    total = stats_sum(parts)
    keys = {(s.name, s.version) for p in parts for s in p.model_stats}
    assert sorted((s.name, s.version) for s in total.model_stats) == sorted(keys)
    for s in total.model_stats:
        same = [x for p in parts for x in p.model_stats if (x.name, x.version) == (s.name, s.version)]
        assert s.inference_count == sum(x.inference_count for x in same)
        assert s.execution_count == sum(x.execution_count for x in same)
        assert s.last_inference == max(x.last_inference for x in same)
        for f in ("success", "fail", "queue", "compute_infer", "cache_miss"):
            assert getattr(s.inference_stats, f).ns == sum(getattr(x.inference_stats, f).ns for x in same)
            assert getattr(s.inference_stats, f).count == sum(getattr(x.inference_stats, f).count for x in same)
        sizes = {b.batch_size for x in same for b in x.batch_stats}
        assert sorted(b.batch_size for b in s.batch_stats) == sorted(sizes)
        for b in s.batch_stats:
            assert b.compute_infer.ns == sum(y.compute_infer.ns for x in same for y in x.batch_stats
                                             if y.batch_size == b.batch_size)
        for key, rs in s.response_stats.items():
            assert rs.success.count == sum(x.response_stats[key].success.count for x in same
                                           if key in x.response_stats)
        for mu in s.memory_usage:
            assert mu.byte_size == sum(y.byte_size for x in same for y in x.memory_usage
                                       if (y.type, y.id) == (mu.type, mu.id))


def test_statistics_sum_beyond_uint64_is_an_error_not_a_wrap():
    big = tx.ModelStatistics(name="m", version="1", inference_count=(1 << 64) - 1)
    with pytest.raises(BadUpstreamResponse, match="inference_count"):
        stats_sum([tx.ModelStatisticsResponse(model_stats=[big]), tx.ModelStatisticsResponse(model_stats=[big])])


@st.composite
def configs(draw) -> mc.ModelConfig:
    c = mc.ModelConfig(name=draw(st.text(max_size=8)), backend="python", max_batch_size=draw(st.integers(0, 64)))
    for i in range(draw(st.integers(0, 3))):
        c.input.add(name=f"IN{i}", data_type=draw(st.sampled_from(list(mc.DataType.values()))),
                    dims=draw(st.lists(I64, max_size=3)))
        if draw(st.booleans()):
            c.input[-1].reshape.shape.extend(draw(st.lists(I64, max_size=3)))
    c.version_policy.specific.versions.extend(draw(st.lists(I64, max_size=2)))
    if draw(st.booleans()):
        db = c.dynamic_batching
        db.max_queue_delay_microseconds = draw(U64)
        db.priority_levels = draw(U64)
        db.default_queue_policy.default_timeout_microseconds = draw(U64)
        db.priority_queue_policy[draw(U64)].default_timeout_microseconds = draw(U64)
    else:
        sb = c.sequence_batching
        sb.max_sequence_idle_microseconds = draw(U64)
        sb.direct.minimum_slot_utilization = draw(F32)
        ctl = sb.control_input.add(name="START").control.add()
        ctl.fp32_false_true.extend(draw(st.lists(F32, max_size=2)))
        sb.state.add(input_name="s", dims=draw(st.lists(I64, max_size=2))).initial_state.add(
            name="i", zero_data=True, dims=draw(st.lists(I64, max_size=2)))
    c.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1).secondary_devices.add(device_id=draw(I64))
    c.parameters["p"].string_value = draw(st.text(max_size=5))
    return c


@settings(max_examples=300)
@given(configs())
def test_config_round_trip_is_exact(config):
    answer = tx.ModelConfigResponse(config=config).SerializeToString()
    body = config_to_json(answer)
    doc = orjson.loads(body)
    assert tx.ModelConfigResponse.FromString(config_from_json(body)) == tx.ModelConfigResponse(config=config)
    # Triton's forms: 64-bit integers as numbers, except the three fields it leaves as strings.
    for i in doc.get("input", []):
        assert all(isinstance(x, int) for x in i["dims"])
    if "sequence_batching" in doc:
        state = doc["sequence_batching"]["state"][0]
        assert all(isinstance(x, int) for x in state["dims"])
        assert all(isinstance(x, str) for x in state["initial_state"][0]["dims"])
    assert isinstance(doc["instance_group"][0]["secondary_devices"][0]["device_id"], str)


def test_config_float_text_is_tritons():
    c = mc.ModelConfig(name="m")
    ctl = c.sequence_batching.control_input.add(name="S").control.add()
    ctl.fp32_false_true.extend([0.0, 1.0, -0.0, 0.5])
    doc = orjson.loads(config_to_json(tx.ModelConfigResponse(config=c).SerializeToString()))
    values = doc["sequence_batching"]["control_input"][0]["control"][0]["fp32_false_true"]
    assert values[:2] == [0, 1] and all(type(v) is int for v in values[:2])
    assert math.copysign(1.0, values[2]) < 0  # -0.0 stays negative
    assert values[3] == 0.5


def test_unknown_fields_are_refused_not_dropped():
    answer = tx.ModelConfigResponse(config=mc.ModelConfig(name="m")).SerializeToString()
    newer = answer + b"\xf8\x01\x07"  # field 31 (varint 7): a field from a newer Triton
    with pytest.raises(BadUpstreamResponse, match="#31"):
        config_to_json(newer)
    inner = tx.ModelConfigResponse.FromString(answer)
    inner.config.input.add(name="x")
    raw = inner.SerializeToString()
    nested = tx.ModelConfigResponse(config=mc.ModelConfig(name="m", input=[mc.ModelInput(name="x")]))
    assert nested.SerializeToString() == raw
    with pytest.raises(BadUpstreamResponse):
        parse_message(tx.ModelConfigResponse, b"\x0a\x05\x0a\x03ab", "model configuration")  # truncated


def test_unknown_json_key_is_refused_naming_it():
    with pytest.raises(BadUpstreamResponse, match="future_field"):
        config_from_json(b'{"name": "m", "future_field": 1}')
    with pytest.raises(BadUpstreamResponse, match="not valid JSON"):
        config_from_json(b"{")
    with pytest.raises(BadUpstreamResponse, match="JSON object"):
        stats_from_json(b"[1]")


def test_message_to_json_prints_defaults_like_triton():
    doc = message_to_json(mc.ModelConfig(name="m"))
    assert doc["max_batch_size"] == 0 and doc["input"] == [] and doc["parameters"] == {}
    assert "dynamic_batching" not in doc  # an unset sub-message is left out, as Triton leaves it
    assert InvalidRequest  # the client-fault class exists for request bodies (load, settings)


# -- hostile input: every converter answers with our error, never another exception --------
from gateway.codec.tritoncontrol import (  # noqa: E402
    control_from_json,
    control_to_json,
    log_to_json,
    log_to_pb,
    trace_to_json,
    trace_to_pb,
    version_refusal,
)
from gateway.errors import GatewayError  # noqa: E402

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
bodies = st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()))


def _only_ours(call, *args, **kw) -> None:
    try:
        call(*args, **kw)
    except GatewayError:
        pass


@settings(max_examples=300)
@given(bodies, st.booleans())
def test_json_side_converters_refuse_cleanly(body, answer):
    for fn in (config_from_json, stats_from_json):
        _only_ours(fn, body)
    _only_ours(trace_to_pb, body, "m", answer=answer)
    _only_ours(log_to_pb, body, answer=answer)
    _only_ours(control_from_json, body, "m", answer)
    wrapped = json.dumps({"parameters": json.loads(body)}).encode() if _is_json(body) else body
    _only_ours(control_from_json, wrapped, "m", answer)


def _is_json(body: bytes) -> bool:
    try:
        orjson.loads(body)
        return True
    except orjson.JSONDecodeError:
        return False


@settings(max_examples=300)
@given(st.binary(max_size=96), st.booleans())
def test_protobuf_side_converters_refuse_cleanly(message, answer):
    _only_ours(config_to_json, message)
    _only_ours(stats_from_pb, message)
    _only_ours(trace_to_json, message, answer=answer)
    _only_ours(log_to_json, message, answer=answer)
    _only_ours(control_to_json, message, answer)


@given(st.text(max_size=12))
def test_version_refusal_never_raises(version):
    got = version_refusal(version)
    assert got is None or version in got
