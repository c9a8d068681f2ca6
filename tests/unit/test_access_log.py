"""The JSON access log: one object per request with the fields operators filter on,
written only for the sampled share of requests; nothing allocated when off."""
from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import random

import pytest

from gateway.config import parse_config
from gateway.observability.access import AccessLog, current, note_endpoint
from gateway.observability.metrics import Metrics


def test_one_json_object_per_request(caplog):
    contextvars.copy_context().run(_one_request, caplog)


def _one_request(caplog) -> None:  # in a context of its own, as each served request is
    log = AccessLog()
    with caplog.at_level(logging.INFO, logger="oip_gateway.access"):
        record = log.begin("req-7", 123)
        assert record is not None and current() is record
        note_endpoint("10.0.0.3:8001", "grpc")
        record.bytes_out = 45
        record.reason = "model 'm' is not ready on any endpoint of backend 'p'; retry later"
        log.write(record, "http", "infer", "m", "2", "m", "p", 503, 0.0123)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "oip_gateway.access"]
    entry = json.loads(line)
    assert entry["request_id"] == "req-7" and entry["endpoint"] == "10.0.0.3:8001"
    assert (entry["protocol"], entry["protocol_out"], entry["backend"], entry["status"]) == ("http", "grpc", "p", 503)
    assert entry["pool"] == entry["backend"]  # the deprecated alias, same value
    assert (entry["bytes_in"], entry["bytes_out"], entry["duration_ms"]) == (123, 45, 12.3)
    assert entry["reason"].startswith("model 'm' is not ready") and entry["time"].endswith("+00:00")


def test_sampling_logs_about_the_share_asked():
    random.seed(7)
    log = AccessLog(sample=0.25)

    async def one() -> bool:  # each request in a task of its own, as the servers run them
        return log.begin(None) is not None

    async def many() -> list[bool]:
        return await asyncio.gather(*(one() for _ in range(4000)))

    chosen = sum(asyncio.run(many()))
    assert 800 < chosen < 1200, chosen


def test_off_by_default_and_sample_validated():
    assert Metrics().access is None
    assert Metrics(access_log=True, access_sample=0.1).access.sample == 0.1  # type: ignore[union-attr]
    base = {"backends": {"b": {"protocol": "http", "endpoints": ["h:1"]}}, "routes": [{"model": "m", "backend": "b"}]}
    cfg = parse_config(dict(base, access_log={"sample": 0.1}))
    assert cfg.access_log and cfg.access_log_sample == 0.1
    from gateway.errors import ConfigError

    for bad in ({"sample": 0}, {"sample": 2}, {"rate": 0.1}, "yes"):
        with pytest.raises(ConfigError) as info:
            parse_config(dict(base, access_log=bad))
        assert any(p.startswith("access_log") or "access_log" in p for p in info.value.problems), info.value.problems
