"""A request is planned once and checked once (the HTTP front end asks the data plane for one
``Plan`` and the body's JSON passes the limits check once), whichever backend protocol it goes to:
a gateway in this process, in front of the demo's reference V2 server on HTTP and gRPC (``add_sub``
routes to the HTTP backend, ``identity_FP32`` to the gRPC backend), with real sockets between them.
"""
from __future__ import annotations

import asyncio
import http.client
from collections import Counter

import orjson
import pytest

from gateway.codec.limits import JsonCheck
from gateway.config.network import HostPort
from gateway.demo.serve import demo_config, start_reference
from gateway.proxy import Proxy
from gateway.server import Gateway

LOOPBACK = HostPort("127.0.0.1", 0)

ADD_SUB = orjson.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
    {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]})
IDENTITY = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})


def _post(port: int, model: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"content-type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("model", "body", "protocol"), [("add_sub", ADD_SUB, "http"),
                                                         ("identity_FP32", IDENTITY, "grpc")])
async def test_one_plan_and_one_json_check_per_request(monkeypatch, model, body, protocol):
    checks: list[int] = []
    plans: list[str] = []
    check = JsonCheck.check
    plan = Proxy.plan_http

    def counted_check(self, part):
        checks.append(id(self))  # (per front end: the reference server's checks what it receives too)
        return check(self, part)

    def counted_plan(self, m, v, headers):
        plans.append(m)
        return plan(self, m, v, headers)

    monkeypatch.setattr(JsonCheck, "check", counted_check)
    monkeypatch.setattr(Proxy, "plan_http", counted_plan)
    ref = await start_reference(LOOPBACK, LOOPBACK, 64 << 20)
    gw = Gateway(demo_config(ref.ports, http=LOOPBACK, grpc=LOOPBACK, metrics=LOOPBACK))
    try:
        ports = await gw.start()
        assert gw.proxy.routing.backends[gw.proxy.routing.table.resolve(model, "").backend].protocol == protocol
        assert ports.http is not None
        for _ in range(3):  # (the first request may find no kept-alive connection: another path)
            checks.clear()
            plans.clear()
            status, answer = await asyncio.to_thread(_post, ports.http, model, body)
            assert status == 200, answer
            assert orjson.loads(answer)["model_name"] == model
            # The gateway's front end checks the body once; behind an HTTP backend the reference
            # server's own front end (in this process too) checks what it receives once.
            assert sorted(Counter(checks).values()) == ([1, 1] if protocol == "http" else [1]), \
                f"JSON checks per front end of one {protocol} request: {Counter(checks)}"
            assert plans == [model], f"{len(plans)} plans of one {protocol} request"
    finally:
        await gw.stop()
        await ref.stop(grace=1.0)
