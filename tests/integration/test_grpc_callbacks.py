"""ModelInfer served from callbacks on the gateway's own gRPC listener (frontend/h2infer.py,
``Proxy.infer_grpc_now``, ``GrpcBackend.infer_grpc_now``, h2channel ``Channel.unary_now``): a
whole request is sent on a backend connection with a stream free and answered from that
connection's events, with no task. Everything the awaited path does must still happen on it —
these tests drive the cases where it hands over or ends differently (a client's cancel and
deadline, a refused stream, a retry to another endpoint, a request left to a task after its
checks), through a real gateway process and real sockets, against tests/support/badgrpc.py.
"""
from __future__ import annotations

import time
import urllib.request

import grpc
import pytest

from gateway import h2 as gh2
from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.support.badgrpc import BadGrpc
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.skipif(not gh2.native("client") or not gh2.native("server"),
                                reason="the callback path is the gateway's own HTTP/2's")

INFER = "/inference.GRPCInferenceService/ModelInfer"


def request(model: str, rid: str = "") -> bytes:
    return pb.ModelInferRequest(model_name=model, id=rid).SerializeToString()


def metric(g: GatewayProcess, name: str, *labels: str) -> float:
    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(label in line for label in labels))


def config(endpoints: list[str], **backend: object) -> dict[str, object]:
    return gateway_config({"b": {"protocol": "grpc", "endpoints": endpoints, "timeout_s": 10, **backend}},
                          [{"model": "*", "backend": "b"}], access_log=True,
                          health={"interval_s": 0.2, "timeout_s": 1.0})


def warm(call) -> None:
    """A first call: it connects the backend's channel (through the awaited path); the calls
    after it find a stream free and are served from callbacks."""
    wait_for(lambda: pb.ModelInferResponse.FromString(call(request("ok"), timeout=10)).model_name == "ok",
             timeout=20, interval=0.1, what="the backend to answer")


def test_answers_metrics_and_access_log_from_callbacks(tmp_path):
    """Served from callbacks: the backend's answer byte for byte, the request counted OK under its
    route and backend, and its access record whole (endpoint, protocol out, bytes both ways)."""
    with BadGrpc() as bad, GatewayProcess(config([bad.address]), tmp_path, "gw-now") as g:
        with grpc.insecure_channel(g.grpc_url) as ch:
            call = ch.unary_unary(INFER)
            warm(call)
            before = metric(g, "oip_gateway_requests_total", 'api="infer"', 'code="OK"', 'backend="b"')
            for i in range(20):
                answer = call(request("ok", f"now-{i}"), metadata=(("x-request-id", f"now-{i}"),), timeout=10)
                assert pb.ModelInferResponse.FromString(answer).model_name == "ok"
            assert metric(g, "oip_gateway_requests_total", 'api="infer"', 'code="OK"',
                          'backend="b"') == before + 20
            entry = wait_for(lambda: g.access().get("now-19"), timeout=10, what="the access record")
            assert entry["status"] == "OK" and entry["endpoint"] == bad.address and entry["protocol_out"] == "grpc"
            assert entry["bytes_in"] == len(request("ok", "now-19")) and entry["bytes_out"] == len(answer)
            assert entry["route"] == "*" and entry["backend"] == "b"


def test_a_client_cancel_resets_the_backends_stream(tmp_path):
    """A client that cancels a call under way from callbacks: the backend's stream is reset
    (RST_STREAM), the call is counted CANCELLED with the client's reason, and the gateway goes on
    serving on the same backend connection."""
    with BadGrpc() as bad, GatewayProcess(config([bad.address]), tmp_path, "gw-cancel") as g:
        with grpc.insecure_channel(g.grpc_url) as ch:
            call = ch.unary_unary(INFER)
            warm(call)
            connections = bad.connections
            for i in range(3):
                resets = bad.resets
                seen = bad.seen.count("silent")
                future = call.future(request("silent", f"cancel-{i}"), metadata=(("x-request-id", f"cancel-{i}"),),
                                     timeout=30)
                wait_for(lambda n=seen: bad.seen.count("silent") > n, timeout=10, what="the call to reach the backend")
                future.cancel()
                wait_for(lambda n=resets: bad.resets > n, timeout=10, what="the backend's stream to be reset")
            entry = wait_for(lambda: g.access().get("cancel-2"), timeout=10, what="the access record")
            assert entry["status"] == "CANCELLED" and entry["reason"] == "the client cancelled the call"
            assert metric(g, "oip_gateway_requests_total", 'api="infer"', 'code="CANCELLED"') == 3
            assert pb.ModelInferResponse.FromString(call(request("ok"), timeout=10)).model_name == "ok"
            assert bad.connections == connections  # (a reset stream, not a lost connection)
        assert "Traceback" not in g.log_tail(200)


def test_the_clients_deadline_ends_the_call_and_resets_the_backends_stream(tmp_path):
    """The client's grpc-timeout passes while the backend is silent: DEADLINE_EXCEEDED from the
    gateway, the backend's stream reset, and the next call answered."""
    with BadGrpc() as bad, GatewayProcess(config([bad.address]), tmp_path, "gw-deadline") as g:
        with grpc.insecure_channel(g.grpc_url) as ch:
            call = ch.unary_unary(INFER)
            warm(call)
            resets = bad.resets
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                call(request("silent"), timeout=0.5)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - start < 5  # (the backend's timeout_s is 10 s)
            wait_for(lambda: bad.resets > resets, timeout=10, what="the backend's stream to be reset")
            assert pb.ModelInferResponse.FromString(call(request("ok"), timeout=10)).model_name == "ok"


def test_a_refused_stream_is_sent_again(tmp_path):
    """The backend refuses the stream unread (RST_STREAM REFUSED_STREAM, RFC 9113 section 8.7) on
    every other call: each refused one is sent again (the awaited path takes it over) and every
    call is answered; nothing counts as the endpoint's failure, no retry is spent."""
    with BadGrpc() as bad, GatewayProcess(config([bad.address], retries=0), tmp_path, "gw-refused") as g:
        with grpc.insecure_channel(g.grpc_url) as ch:
            call = ch.unary_unary(INFER)
            warm(call)
            for _ in range(6):
                answer = pb.ModelInferResponse.FromString(call(request("refused_once"), timeout=10))
                assert answer.model_name == "refused_once"
            assert bad.refusals == 12  # each call refused once, answered once
            assert metric(g, "oip_gateway_upstream_errors_total", 'backend="b"') == 0


def test_a_request_an_endpoint_drops_goes_to_another(tmp_path):
    """One endpoint closes its connection with the call in flight (nothing can have run: it is
    taken for unreachable), the other answers: with retries every call is answered, each drop
    is counted as a retry, and the dropping endpoint gets no more traffic until a check."""
    with BadGrpc(override={"ok": "close"}) as dropping, BadGrpc() as good:
        cfg = config([dropping.address, good.address], retries=1, outlier={"consecutive_failures": 1000})
        with GatewayProcess(cfg, tmp_path, "gw-retry") as g:
            with grpc.insecure_channel(g.grpc_url) as ch:
                call = ch.unary_unary(INFER)
                retries = metric(g, "oip_gateway_backend_events_total", 'event="retry"')
                for i in range(10):
                    answer = call(request("ok", f"retry-{i}"), metadata=(("x-request-id", f"retry-{i}"),),
                                  timeout=10)
                    assert pb.ModelInferResponse.FromString(answer).model_name == "ok"
                dropped = dropping.seen.count("ok")
                assert dropped >= 1
                assert metric(g, "oip_gateway_backend_events_total", 'event="retry"') == retries + dropped
                assert good.seen.count("ok") == 10


def test_a_request_left_to_a_task_after_its_checks_is_rate_counted_once(tmp_path):
    """The callback path runs the guard (auth and rate) before routing; a request the data plane
    then leaves to a task — the first call, before the backend's channel has a connection; every
    call of a split route — is not charged again: a burst of 3 admits 3 calls, then
    RESOURCE_EXHAUSTED."""
    with BadGrpc() as a, BadGrpc() as b:
        backends = {"a": {"protocol": "grpc", "endpoints": [a.address]},
                    "b": {"protocol": "grpc", "endpoints": [b.address]}}
        routes = [{"model": "ok", "backend": "a", "rate": {"per_s": 0.01, "burst": 3}},
                  {"model": "refused_once", "split": [{"backend": "a", "weight": 50}, {"backend": "b", "weight": 50}],
                   "rate": {"per_s": 0.01, "burst": 3}}]
        cfg = gateway_config(backends, routes, health={"interval_s": 0.2, "timeout_s": 1.0})
        with GatewayProcess(cfg, tmp_path, "gw-rate") as g:
            with grpc.insecure_channel(g.grpc_url) as ch:
                call = ch.unary_unary(INFER)
                for model in ("ok", "refused_once"):
                    codes = []
                    for _ in range(4):
                        try:
                            call(request(model), timeout=10)
                            codes.append("OK")
                        except grpc.RpcError as err:
                            codes.append(err.code().name)
                    assert codes == ["OK", "OK", "OK", "RESOURCE_EXHAUSTED"], (model, codes)


def _identity_calls(port: int, n: int) -> list[str]:
    """``n`` ModelInfer calls of the demo's identity_FP32 through the gateway (a thread's grpc client)."""
    req = pb.ModelInferRequest(model_name="identity_FP32")
    x = req.inputs.add()
    x.name, x.datatype = "INPUT0", "FP32"
    x.shape.extend([1, 3])
    x.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    names = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(INFER)
        for _ in range(n):
            names.append(pb.ModelInferResponse.FromString(call(req.SerializeToString(), timeout=10)).model_name)
    return names


async def test_a_call_with_a_stream_free_is_served_from_callbacks(monkeypatch):
    """In this process, a gateway in front of the demo's reference server over gRPC: once the
    backend's channel is connected, every ModelInfer goes through ``infer_grpc_now`` and none
    through the awaited ``infer_grpc`` — the path this file proves is the one calls take."""
    import asyncio

    from gateway.config.network import HostPort
    from gateway.demo.serve import demo_config, start_reference
    from gateway.proxy import Proxy
    from gateway.server import Gateway

    taken: list[bool] = []
    awaited: list[str] = []
    now, later = Proxy.infer_grpc_now, Proxy.infer_grpc

    def counted_now(self, *args, **kwargs):
        result = now(self, *args, **kwargs)
        taken.append(result is not None)
        return result

    def counted_later(self, *args, **kwargs):
        awaited.append(args[1])
        return later(self, *args, **kwargs)

    monkeypatch.setattr(Proxy, "infer_grpc_now", counted_now)
    monkeypatch.setattr(Proxy, "infer_grpc", counted_later)
    loopback = HostPort("127.0.0.1", 0)
    ref = await start_reference(loopback, loopback, 64 << 20)
    gw = Gateway(demo_config(ref.ports, http=loopback, grpc=loopback, metrics=loopback))
    try:
        ports = await gw.start()
        assert gw.proxy.routing.backends[gw.proxy.routing.table.resolve("identity_FP32", "").backend].protocol == "grpc"
        assert ports.grpc is not None
        assert await asyncio.to_thread(_identity_calls, ports.grpc, 1) == ["identity_FP32"]  # (connects the channel)
        taken.clear()
        awaited.clear()
        assert await asyncio.to_thread(_identity_calls, ports.grpc, 5) == ["identity_FP32"] * 5
        assert taken == [True] * 5 and awaited == []
    finally:
        await gw.stop()
        await ref.stop(grace=1.0)
