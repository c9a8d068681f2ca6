"""Triton's ModelStreamInfer (tritonclient ``start_stream`` / ``async_stream_infer``) through the
gateway: passed through to a gRPC backend, answers identical to the backend's own, decoupled
models included; clear errors when a stream cannot be served."""
from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import start_gateway
from tests.support.gateway import GatewayProcess, gateway_config


def run_stream(url: str, requests: list[tuple[str, list[grpcclient.InferInput], str]], expect: int,
               timeout: float = 30) -> list[tuple[object, object]]:
    """Send ``requests`` (model, inputs, id) on one stream; collect ``expect`` callbacks
    (result, error) or fewer if the stream ends with an error."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for model, inputs, rid in requests:
            client.async_stream_infer(model, inputs, request_id=rid)
        out = []
        while len(out) < expect:
            item = got.get(timeout=timeout)  # bounded wait for the next callback
            out.append(item)
            if item[1] is not None and "stream" in str(item[1]).lower():
                break
        return out
    finally:
        client.stop_stream()
        client.close()


def fp32_input(name: str, values: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(values.shape), "FP32")
    t.set_data_from_numpy(values)
    return t


def add_sub_requests(n: int) -> list[tuple[str, list[grpcclient.InferInput], str]]:
    reqs = []
    for i in range(n):
        a = np.arange(4, dtype=np.float32) + i
        reqs.append(("add_sub", [fp32_input("INPUT0", a), fp32_input("INPUT1", a * 2)], f"r{i}"))
    return reqs


def summary(items: list[tuple[object, object]]) -> list[tuple]:
    out = []
    for result, error in items:
        if error is not None:
            out.append(("error", str(error)))
            continue
        resp = result.get_response()
        arrays = {o.name: result.as_numpy(o.name).tolist() for o in resp.outputs}
        out.append((resp.model_name, resp.id, sorted(arrays.items())))
    return out


@pytest.fixture(scope="module")
def gw_triton(triton, tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("stream-grpc"), triton.http_url, triton.grpc_url, "grpc")
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def gw_reference(reference, tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("stream-ref"), reference.http_url, reference.grpc_url, "grpc")
    yield gw
    gw.stop()


def test_stream_to_triton_matches_direct(triton, gw_triton):
    direct = summary(run_stream(triton.grpc_url, add_sub_requests(5), 5))
    through = summary(run_stream(gw_triton.grpc_url, add_sub_requests(5), 5))
    assert through == direct
    assert [d[1] for d in direct] == ["r0", "r1", "r2", "r3", "r4"]


def test_decoupled_model_many_answers_per_request(triton, gw_triton):
    """repeat_FP32 sends one answer per element: 3 + 2 answers for two requests."""
    reqs = [("repeat_FP32", [fp32_input("IN", np.array([1, 2, 3], np.float32))], "a"),
            ("repeat_FP32", [fp32_input("IN", np.array([7, 8], np.float32))], "b")]
    direct = summary(run_stream(triton.grpc_url, reqs, 5))
    through = summary(run_stream(gw_triton.grpc_url, reqs, 5))
    assert through == direct, (through, direct)
    assert all(x[0] != "error" for x in through), through
    assert [x[2][0][1] for x in through] == [[1.0], [2.0], [3.0], [7.0], [8.0]]


def test_stream_to_the_reference_server(gw_reference):
    """The embedded reference server streams too (one answer per request, errors in-stream)."""
    reqs = add_sub_requests(2) + [("add_sub", [fp32_input("INPUT0", np.zeros(2, np.float32)),
                                               fp32_input("INPUT1", np.zeros(3, np.float32))], "bad")]
    got = summary(run_stream(gw_reference.grpc_url, reqs, 3))
    assert [g[1] for g in got[:2]] == ["r0", "r1"]
    assert got[2][0] == "error" and "shape" in got[2][1]


@pytest.fixture(scope="module")
def gw_triton_http(triton, tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("stream-http"), triton.http_url, triton.grpc_url, "http")
    yield gw
    gw.stop()


def test_stream_through_an_http_backend_matches_direct(triton, gw_triton_http):
    """Each request of the stream becomes an HTTP inference on one endpoint; the answers come
    back in order, identical to Triton's own stream; a failing request carries its error in
    the stream, which goes on."""
    bad = ("add_sub", [fp32_input("INPUT0", np.zeros(2, np.float32)), fp32_input("INPUT1", np.zeros(3, np.float32))],
           "bad")
    reqs = add_sub_requests(2) + [bad] + add_sub_requests(3)[2:]
    direct = summary(run_stream(triton.grpc_url, reqs, 4))
    through = summary(run_stream(gw_triton_http.grpc_url, reqs, 4))
    assert [t[1] if t[0] != "error" else "error" for t in through] == ["r0", "r1", "error", "r2"]
    assert [t for t in through if t[0] != "error"] == [d for d in direct if d[0] != "error"]


def test_stream_errors(reference, tmp_path_factory):
    """A stream to a model of an HTTP backend is served request by request, an unknown model is
    NOT_FOUND, and a later request routed to another backend ends the stream after the
    answers before it (INVALID_ARGUMENT)."""
    backends = {"h": {"protocol": "http", "endpoints": [reference.http_url]},
                "g": {"protocol": "grpc", "endpoints": [reference.grpc_url]}}
    routes = [{"model": "add_sub", "backend": "g"}, {"model": "string_reverse", "backend": "h"}]
    with GatewayProcess(gateway_config(backends, routes), tmp_path_factory.mktemp("stream-err"), "gw-stream") as g:
        words = grpcclient.InferInput("INPUT0", [1], "BYTES")
        words.set_data_from_numpy(np.array([b"abc"], dtype=object))
        (result, error), = run_stream(g.grpc_url, [("string_reverse", [words], "x")], 1)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [b"cba"]

        (result, error), = run_stream(g.grpc_url, [("nope", [words], "y")], 1)
        assert result is None and "StatusCode.NOT_FOUND" in str(error)

        mixed = add_sub_requests(2) + [("string_reverse", [words], "z")]
        got = run_stream(g.grpc_url, mixed, 3)
        assert [r.get_response().id for r, e in got[:2]] == ["r0", "r1"]
        assert got[2][0] is None and "StatusCode.INVALID_ARGUMENT" in str(got[2][1])
        assert "another backend" in str(got[2][1])
        assert g.proc.poll() is None
