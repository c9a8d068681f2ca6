"""Admission control (``max_inflight_bytes``): past the limit of request bytes in flight a
request is refused at once with 503 / UNAVAILABLE, the gateway keeps serving, and the
in-flight gauge goes back to 0 when the requests are over."""
from __future__ import annotations

import http.client
import threading
import urllib.request
from typing import Any

import grpc
import numpy as np
import orjson
import pytest

from tests.support.clients import In, infer
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

MiB = 1 << 20


@pytest.fixture(scope="module", params=["explicit", "memory-limit"])
def gw(request, reference, black_hole, tmp_path_factory):
    """The same 3 MiB limit, set in the config or (unset there) sized from the memory limit
    the gateway runs under: a fifth of 15 MiB, injected as a cgroup's memory.max would be."""
    backends = {
        "ref": {"protocol": "http", "endpoints": [reference.http_url]},
        "ref-grpc": {"protocol": "grpc", "endpoints": [reference.grpc_url]},
        "hole": {"protocol": "http", "endpoints": [black_hole], "timeout_s": 5},
    }
    routes = [{"model": "slow", "backend": "hole"}, {"model": "identity_UINT8", "backend": "ref-grpc"},
              {"model": "*", "backend": "ref"}]
    if request.param == "explicit":
        cfg = gateway_config(backends, routes, max_message_bytes=2 * MiB, max_inflight_bytes=3 * MiB)
        env = None
    else:
        cfg = gateway_config(backends, routes, max_message_bytes=2 * MiB)
        env = {"OIP_GATEWAY_MEMORY_LIMIT": str(15 * MiB)}
    with GatewayProcess(cfg, tmp_path_factory.mktemp("admission"), "gw-admission", env=env) as g:
        if env is not None:
            assert f"max_inflight_bytes: {3 * MiB} per process" in g.log_tail(200)
        yield g


def inflight(g: GatewayProcess) -> float:
    with urllib.request.urlopen(f"http://{g.metrics_url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("oip_gateway_inflight_request_bytes "):
                return float(line.split()[1])
    return -1.0


def post(url: str, model: str, body: bytes, with_retry: bool = False) -> Any:
    """POST on a keep-alive connection. (urllib sends ``Connection: close``: a server that
    refuses a request before reading its body then closes with the body unread, and the
    client, still sending, sees EPIPE instead of the answer — timing-dependent.)"""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return (r.status, r.read(), r.getheader("retry-after")) if with_retry else (r.status, r.read())
    finally:
        conn.close()


def json_body(nbytes: int) -> bytes:
    """A JSON add_sub request of about ``nbytes`` (valid, so the reference answers 200)."""
    n = max(1, nbytes // 4)  # "0," per element, two inputs
    return orjson.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [n], "datatype": "FP32", "data": [0] * n}
                                    for i in (0, 1)]})


def test_over_the_limit_is_refused_and_recovers(gw):
    assert inflight(gw) == 0
    held = json_body(int(1.5 * MiB))
    results: list[tuple[int, bytes]] = []
    slow = threading.Thread(target=lambda: results.append(post(gw.http_url, "slow", held)))
    slow.start()
    try:
        wait_for(lambda: inflight(gw) >= len(held), timeout=10, what="the held request to be in flight")
        # 1.5 MiB in flight + 2 MiB > 3 MiB: refused at once, on both fronts.
        status, answer, retry = post(gw.http_url, "add_sub", json_body(2 * MiB - 4096), with_retry=True)
        assert status == 503 and "max_inflight_bytes" in orjson.loads(answer)["error"]
        assert retry == "1"  # Retry-After
        with grpc.insecure_channel(gw.grpc_url) as ch:
            from gateway._pb import grpc_predict_v2_pb2 as pb

            msg = pb.ModelInferRequest(model_name="identity_UINT8")
            msg.inputs.add(name="INPUT0", datatype="UINT8", shape=[1, 2 * MiB - 4096])
            msg.raw_input_contents.append(b"\0" * (2 * MiB - 4096))
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(msg.SerializeToString(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert ("grpc-retry-pushback-ms", "1000") in tuple(info.value.trailing_metadata())
            # ModelStreamInfer counts each request while the gateway holds it: a first one past
            # the limit is refused before a backend stream opens; a later one ends the stream
            # after the answers before it.
            assert stream(ch, [2 * MiB - 4096]) == ([], "UNAVAILABLE")
            answers, code = stream(ch, [16, 2 * MiB - 4096, 16])
            assert len(answers) == 1 and code == "UNAVAILABLE"
        # Small requests still fit beside the held one.
        a = np.arange(4, dtype=np.float32)
        r = infer("http", gw.http_url, "add_sub", [In("INPUT0", a, "FP32"), In("INPUT1", a, "FP32")])
        np.testing.assert_array_equal(r.outputs["OUTPUT0"], 2 * a)
    finally:
        slow.join(timeout=30)
    assert results and results[0][0] == 504  # the held request ended by its backend's timeout
    wait_for(lambda: inflight(gw) == 0, timeout=10, what="the gauge back to 0")
    status, _ = post(gw.http_url, "add_sub", json_body(2 * MiB - 4096))
    assert status == 200
    with grpc.insecure_channel(gw.grpc_url) as ch:  # nothing held by the streams refused above
        assert stream(ch, [2 * MiB - 4096, 2 * MiB - 4096]) == ([2 * MiB - 4096] * 2, "OK")
    wait_for(lambda: inflight(gw) == 0, timeout=10, what="the gauge back to 0 after a stream")


def stream(ch: grpc.Channel, sizes: list[int]) -> tuple[list[int], str]:
    """One ModelStreamInfer with an identity_UINT8 request of each size: the sizes of the
    answers' outputs, and the status the stream ended with."""
    from tritonclient.grpc import service_pb2 as pb  # Triton's service: ModelStreamInfer's messages

    def requests():
        for n in sizes:
            msg = pb.ModelInferRequest(model_name="identity_UINT8")
            msg.inputs.add(name="INPUT0", datatype="UINT8", shape=[1, n])
            msg.raw_input_contents.append(b"\1" * n)
            yield msg.SerializeToString()

    answers: list[int] = []
    call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    try:
        for raw in call(requests(), timeout=10):
            answer = pb.ModelStreamInferResponse.FromString(raw)
            assert not answer.error_message, answer.error_message
            answers.append(len(answer.infer_response.raw_output_contents[0]))
    except grpc.RpcError as exc:
        return answers, exc.code().name
    return answers, "OK"
