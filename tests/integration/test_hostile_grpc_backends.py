"""Hostile gRPC backends (issue 35): a backend that resets its streams, goes away, answers
over the backend's message limit, in an encoding the gateway cannot read, with a message that is
not a ModelInferResponse, with an unknown status, without a status, or not at all. Each comes
out as a clear error naming the party at fault — the backend: 502 / UNAVAILABLE for a reset or a
cancel the client did not cause (never CANCELLED / 499), 502 / INTERNAL for an answer the gateway
refuses or cannot read (never 413 / 429 / RESOURCE_EXHAUSTED), 504 "did not answer within N s" —
with a reason in the access log and its class as the ``kind`` of
``oip_gateway_upstream_errors_total``; the backend's own statuses are relayed as they are; a
client that really cancels still sees CANCELLED; and the gateway and its healthy backend keep
serving. The backend is tests/support/badgrpc.py (HTTP/2 by ``h2`` on a real socket); the
clients are tritonclient's, over HTTP (the converting path) and gRPC (pass-through)."""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.backends.grpc import GrpcBackend
from gateway.config.backends import BackendSpec
from gateway.config.network import HostPort
from gateway import h2 as gh2
from gateway.errors import NoEndpointAvailable, UpstreamReset
from tests.support.badgrpc import BEHAVIOURS, STATUS_DETAILS, BadGrpc
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

LIMIT = 1 << 20  # the bad backend's max_message_bytes
TIMEOUT_S = 1.0  # the bad backend's timeout_s

# model -> (HTTP status, gRPC code, kind label, words of the message); kind None: relayed as the
# backend's own (UpstreamError, no reason in the access log).
EXPECTED: dict[str, tuple[int, str, str, str]] = {
    "reset_before_headers": (502, "UNAVAILABLE", "UpstreamReset", "reset the stream (RST_STREAM CANCEL)"),
    "reset_after_headers": (502, "UNAVAILABLE", "UpstreamReset", "reset the stream (RST_STREAM CANCEL)"),
    "reset_mid_message": (502, "UNAVAILABLE", "UpstreamReset", "reset the stream (RST_STREAM CANCEL)"),
    "reset_internal": (502, "UNAVAILABLE", "UpstreamReset", "reset the stream (RST_STREAM INTERNAL_ERROR)"),
    "goaway_processed": (502, "UNAVAILABLE", "UpstreamReset", "went away (GOAWAY INTERNAL_ERROR"),
    "own_cancelled": (502, "UNAVAILABLE", "UpstreamReset",
                      "cancelled the call, which the gateway did not cancel (the backend cancelled this"),
    "goaway_unprocessed": (503, "UNAVAILABLE", "NoEndpointAvailable", "went away (GOAWAY NO_ERROR) before processing"),
    "refused_stream": (503, "UNAVAILABLE", "NoEndpointAvailable", "refused the stream (RST_STREAM REFUSED_STREAM)"),
    # The connection closed under the call, no GOAWAY: as the HTTP backends' "closed before a byte
    # of the answer", the endpoint is taken for unreachable (Refused: retried elsewhere if any).
    "close": (503, "UNAVAILABLE", "NoEndpointAvailable",
              # (grpcio's client says "Stream removed (Socket closed)" or, when the close met
              # request bytes still unread and became a reset, "Stream removed (recvmsg:
              # Connection reset by peer)": a race of the fake's close, the same fault)
              "the connection closed with the call in flight" if gh2.native("client") else
              "Stream removed ("),
    "too_large": (502, "INTERNAL", "UpstreamTooLarge",
                  f"answered with a message of {LIMIT + 1024} bytes, over the backend's max_message_bytes ({LIMIT})"),
    "huge_metadata": (502, "INTERNAL", "UpstreamTooLarge", "bytes of headers (metadata), over grpc's limit"),
    "bad_encoding": (502, "INTERNAL", "UpstreamEncoding", "answered in an encoding the gateway cannot read"),
    "bad_gzip": (502, "INTERNAL", "UpstreamEncoding", "answered in an encoding the gateway cannot read"),
    "compressed_identity": (502, "INTERNAL", "UpstreamEncoding", "answered in an encoding the gateway cannot read"),
    "no_status": (502, "INTERNAL", "UpstreamFraming", "without a grpc-status"),
    "bad_frame": (502, "INTERNAL", "UpstreamFraming", "answered OK without a complete response message"),
    "silent": (504, "DEADLINE_EXCEEDED", "UpstreamTimeout", "did not answer within 1 s"),
}
RELAYED: dict[str, tuple[int, str, str]] = {
    "unknown_status": (500, "UNKNOWN", "a status no gRPC version defines"),  # grpc-core reads 42 as UNKNOWN
    "own_exhausted": (429, "RESOURCE_EXHAUSTED", "Exceeds maximum queue size"),  # its queue: its own word
    # The backend's own grpc refusing the gateway's request as over ITS limit: the client's request.
    "own_too_large": (429, "RESOURCE_EXHAUSTED", "Received message larger than max (5000000 vs. 4194304)"),
    "own_details": (400, "INVALID_ARGUMENT", "bad input"),
}


@pytest.fixture(scope="module")
def bad():
    with BadGrpc(large=LIMIT + 1024) as server:
        yield server


@pytest.fixture(scope="module")
def gw(bad, reference, tmp_path_factory):
    backends = {
        "bad": {"protocol": "grpc", "endpoints": [bad.address], "max_message_bytes": LIMIT, "timeout_s": TIMEOUT_S,
                "retries": 0},
        "good": {"protocol": "grpc", "endpoints": [reference.grpc_url]},
    }
    routes = [{"model": "add_sub", "backend": "good"}, {"model": "ok", "backend": "bad"},
              {"model": "*", "backend": "bad"}]
    g = GatewayProcess(gateway_config(backends, routes, access_log=True), tmp_path_factory.mktemp("hostile-grpc"))
    g.start()
    try:
        def ready() -> bool:
            with httpclient.InferenceServerClient(g.http_url) as c:
                return c.is_server_ready() and c.is_model_ready("ok")

        wait_for(ready, timeout=30, what="gateway readiness")
        yield g
    finally:
        g.stop()


def _inputs(module, shape=(1, 2)):
    x = module.InferInput("INPUT0", list(shape), "FP32")
    x.set_data_from_numpy(np.ones(shape, np.float32))
    return [x]


def _infer(protocol: str, url: str, model: str, request_id: str, **kw):
    if protocol == "http":
        with httpclient.InferenceServerClient(url, network_timeout=30) as c:
            return c.infer(model, _inputs(httpclient), request_id=request_id, headers={"x-request-id": request_id},
                           **kw)
    with grpcclient.InferenceServerClient(url) as c:
        return c.infer(model, _inputs(grpcclient), request_id=request_id, headers={"x-request-id": request_id},
                       **kw)


def _access(g: GatewayProcess) -> dict[str, dict]:
    """The access log's entries by request id."""
    return g.access()


def _metric(g: GatewayProcess, name: str, *labels: str) -> float:
    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(label in line for label in labels))


def _entry(g: GatewayProcess, request_id: str) -> dict:
    return wait_for(lambda: _access(g).get(request_id) or {}, timeout=10, what=f"access log entry {request_id}")


def _healthy(g: GatewayProcess) -> None:
    """The gateway and its healthy backend still serve, over both protocols."""
    a = np.arange(16, dtype=np.float32)
    for module, url in ((httpclient, g.http_url), (grpcclient, g.grpc_url)):
        with module.InferenceServerClient(url) as c:
            inputs = [module.InferInput(name, [16], "FP32") for name in ("INPUT0", "INPUT1")]
            for x in inputs:
                x.set_data_from_numpy(a)
            assert c.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
    assert g.proc is not None and g.proc.poll() is None


def test_the_bad_backend_serves_when_it_behaves(gw):
    for protocol, url in (("http", gw.http_url), ("grpc", gw.grpc_url)):
        result = _infer(protocol, url, "ok", f"ok-{protocol}")
        assert result.as_numpy("OUTPUT0").tolist() == [[1.5, -2.0]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", list(EXPECTED))
def test_each_backend_fault_is_a_clear_error_naming_the_backend(gw, bad, protocol, model):
    status, code, kind, words = EXPECTED[model]
    before = _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', f'kind="{kind}"')
    rid = f"{model}-{protocol}"
    with pytest.raises(InferenceServerException) as info:
        _infer(protocol, gw.http_url if protocol == "http" else gw.grpc_url, model, rid)
    err = info.value
    assert err.status() == (str(status) if protocol == "http" else f"StatusCode.{code}"), err
    message = err.message()
    assert words in message, message
    assert f"backend 'bad' endpoint {bad.address}: " in message, message  # names the party at fault
    entry = _entry(gw, rid)
    assert entry["status"] == (status if protocol == "http" else code)
    assert entry["backend"] == "bad" and entry["endpoint"] == bad.address
    assert words in entry["reason"]  # the gateway decided it: the access log says why
    assert _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', f'kind="{kind}"') == before + 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", list(RELAYED))
def test_the_backends_own_statuses_are_relayed(gw, protocol, model):
    status, code, words = RELAYED[model]
    rid = f"{model}-{protocol}"
    with pytest.raises(InferenceServerException) as info:
        _infer(protocol, gw.http_url if protocol == "http" else gw.grpc_url, model, rid)
    err = info.value
    assert err.status() == (str(status) if protocol == "http" else f"StatusCode.{code}"), err
    assert words in err.message()
    entry = _entry(gw, rid)
    assert entry["status"] == (status if protocol == "http" else code) and "reason" not in entry


def test_the_backends_status_details_reach_a_grpc_client_unchanged(gw):
    """grpc-status-details-bin (a serialized google.rpc.Status, gRPC's richer error model) is the
    backend's: relayed byte for byte with its status and message."""
    request = pb.ModelInferRequest(model_name="own_details").SerializeToString()
    with grpc.insecure_channel(gw.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request, timeout=10)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == "bad input"
    assert dict(err.trailing_metadata())["grpc-status-details-bin"] == STATUS_DETAILS


def test_an_answer_that_is_not_a_model_infer_response_is_a_502_on_the_converting_path(gw, bad):
    before = _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', 'kind="BadUpstreamResponse"')
    with pytest.raises(InferenceServerException) as info:
        _infer("http", gw.http_url, "garbage", "garbage-http")
    assert info.value.status() == "502"
    assert f"backend 'bad' endpoint {bad.address}: sent an unreadable response" in info.value.message()
    entry = _entry(gw, "garbage-http")
    assert entry["status"] == 502 and "unreadable" in entry["reason"]
    assert _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', 'kind="BadUpstreamResponse"') == \
        before + 1


def test_a_client_that_cancels_still_sees_cancelled(gw):
    """The client's own cancel (gRPC) and disconnect (HTTP) are not the backend's fault: the
    client sees CANCELLED, nothing is counted as an UpstreamReset."""
    resets = _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', 'kind="UpstreamReset"')
    results = []
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        ctx = c.async_infer("silent", _inputs(grpcclient), lambda result, error: results.append((result, error)),
                            request_id="cancel-grpc", headers={"x-request-id": "cancel-grpc"})
        time.sleep(0.3)
        ctx.cancel()
        wait_for(lambda: results or None, timeout=10, what="the cancelled call's callback")
    _, error = results[0]
    assert error is not None and error.status() == "StatusCode.CANCELLED"
    # An HTTP client that leaves mid-call.
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    with socket.create_connection(("127.0.0.1", int(gw.http_url.rsplit(":", 1)[1]))) as s:
        s.sendall(b"POST /v2/models/silent/infer HTTP/1.1\r\nHost: gw\r\nx-request-id: cancel-http\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
    time.sleep(TIMEOUT_S + 0.5)  # whatever the gateway does with the call it was left with is done
    for rid in ("cancel-grpc", "cancel-http"):
        entry = _access(gw).get(rid)
        if entry is not None:  # (never blamed on the backend as a reset)
            assert entry["status"] not in (502, "UNAVAILABLE"), entry
    assert _metric(gw, "oip_gateway_upstream_errors_total", 'backend="bad"', 'kind="UpstreamReset"') == resets
    _healthy(gw)


def test_the_access_log_says_the_client_cancelled(gw, bad):
    asked = bad.seen.count("silent")
    with grpcclient.InferenceServerClient(gw.grpc_url) as c:
        ctx = c.async_infer("silent", _inputs(grpcclient), lambda result, error: None,
                            headers={"x-request-id": "cancel-grpc-2"})
        wait_for(lambda: bad.seen.count("silent") > asked, timeout=10, what="the call reaching the backend")
        ctx.cancel()
    entry = _entry(gw, "cancel-grpc-2")
    assert (entry["status"], entry.get("reason")) == ("CANCELLED", "the client cancelled the call"), entry


def test_the_access_log_says_the_http_client_left(gw, bad):
    """An HTTP client that leaves while the backend works: the listener cancels the request's
    task (and its backend call), and the access log says 499, the client's doing."""
    asked = bad.seen.count("silent")
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    with socket.create_connection(("127.0.0.1", int(gw.http_url.rsplit(":", 1)[1]))) as s:
        s.sendall(b"POST /v2/models/silent/infer HTTP/1.1\r\nHost: gw\r\nx-request-id: cancel-http-2\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: bad.seen.count("silent") > asked, timeout=10, what="the call reaching the backend")
    assert _entry(gw, "cancel-http-2")["status"] == 499


def test_the_gateway_and_the_healthy_backend_keep_serving(gw):
    for model in list(EXPECTED)[:6]:
        with pytest.raises(InferenceServerException):
            _infer("grpc", gw.grpc_url, model, f"again-{model}")
    _healthy(gw)
    assert _infer("http", gw.http_url, "ok", "ok-after").as_numpy("OUTPUT0").tolist() == [[1.5, -2.0]]
    log = gw.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "unhandled error" not in log


# -- in process: which faults a backend retries on another endpoint ------------------------
def _message(model: str) -> bytes:
    return pb.ModelInferRequest(model_name=model).SerializeToString()


async def test_goaway_before_the_call_was_processed_is_retried_elsewhere():
    """RFC 9113 6.8: a stream above GOAWAY's last stream id was not processed: another
    endpoint takes it. One at or below it may have run: never sent again (UpstreamReset)."""
    with BadGrpc() as hostile, BadGrpc(override={"goaway_unprocessed": "ok", "goaway_processed": "ok",
                                                 "refused_stream": "ok"}) as tame:
        eps = tuple(HostPort("127.0.0.1", s.port) for s in (hostile, tame))
        backend = GrpcBackend(BackendSpec("g", "grpc", eps, timeout_s=5, retries=1, balance="round_robin"))
        await backend.start()
        try:
            for model in ("goaway_unprocessed", "refused_stream"):
                for _ in range(2):  # whichever endpoint comes first
                    answer = pb.ModelInferResponse.FromString(
                        await backend.infer_grpc(_message(model), model, "", None, None, ()))
                    assert answer.model_name == model
            for ep in backend.endpoints.values():
                ep.health.set_live(True)  # (the GOAWAY took the hostile one out of rotation: back in)
            hostile.seen.clear()
            tame.seen.clear()
            outcomes = []
            for _ in range(4):
                try:
                    await backend.infer_grpc(_message("goaway_processed"), "goaway_processed", "", None, None, ())
                    outcomes.append("ok")
                except UpstreamReset as exc:
                    assert "went away (GOAWAY INTERNAL_ERROR, then closed the connection)" in exc.message
                    outcomes.append("reset")
                for ep in backend.endpoints.values():
                    ep.health.set_live(True)
            assert "reset" in outcomes
            # Each request went to one endpoint only: none that may have run was sent again.
            assert len(hostile.seen) + len(tame.seen) == 4
        finally:
            await backend.close()


async def test_goaway_on_the_only_endpoint_is_unavailable_and_names_it():
    with BadGrpc() as hostile:
        backend = GrpcBackend(BackendSpec("g", "grpc", (HostPort("127.0.0.1", hostile.port),), timeout_s=5, retries=1))
        await backend.start()
        try:
            with pytest.raises(NoEndpointAvailable) as info:
                await backend.infer_grpc(_message("goaway_unprocessed"), "goaway_unprocessed", "", None, None, ())
            assert re.search(r"endpoint 127\.0\.0\.1:\d+: went away \(GOAWAY NO_ERROR\)", info.value.message)
        finally:
            await backend.close()
