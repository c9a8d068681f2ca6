"""Traffic shaping with real Tritons: a 95/5 split over 10,000 requests per transport (counted
by each Triton's own statistics), a split whose small side is not ready, header routes on both
transports, and mirroring — the shadow receives its exact share (its own statistics), a dead
shadow never reaches the client and its copies in flight stay within the bound."""
from __future__ import annotations

import asyncio
import json
import queue
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fleet import slow_repository
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer, triton_available

T = TypeVar("T")

pytestmark = pytest.mark.triton

MODELS = ["m", "h", "s", "s2"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, black_hole: str) -> Iterator[dict]:
    reason = triton_available()
    if reason is not None:
        pytest.skip(f"Triton unavailable: {reason}")
    root = tmp_path_factory.mktemp("shaping")
    repo = slow_repository(root, MODELS, 0)
    a, b = TritonServer(repo), TritonServer(repo)
    a.start(root / "a")
    b.start(root / "b")
    backends = {
        "a_http": {"protocol": "http", "endpoints": [a.http_url]},
        "a_grpc": {"protocol": "grpc", "endpoints": [a.grpc_url]},
        "b_http": {"protocol": "http", "endpoints": [b.http_url]},
        "b_grpc": {"protocol": "grpc", "endpoints": [b.grpc_url]},
        "hole": {"protocol": "http", "endpoints": [black_hole], "timeout_s": 20, "retries": 0},
    }
    routes = [
        {"model": "m", "split": [{"backend": "a_http", "weight": 95}, {"backend": "b_grpc", "weight": 5}]},
        {"model": "h", "headers": {"X-Variant": "canary"}, "backend": "b_http"},
        {"model": "h", "backend": "a_grpc"},
        {"model": "s", "backend": "a_http", "mirror": {"backend": "b_grpc", "percent": 25}},
        {"model": "s2", "backend": "a_grpc", "mirror": {"backend": "hole", "percent": 100, "max_inflight": 4}},
    ]
    gw = GatewayProcess(gateway_config(backends, routes), root, "gw-shaping")
    try:
        gw.start()
        wait_for(lambda: httpclient.InferenceServerClient(gw.http_url).is_server_ready(), timeout=60,
                 what="gateway readiness")
        yield {"a": a, "b": b, "gw": gw}
    finally:
        gw.stop()
        a.stop()
        b.stop()


def count(triton: TritonServer, model: str) -> int:
    stats = httpclient.InferenceServerClient(triton.http_url).get_inference_statistics(model)
    return sum(s["inference_count"] for s in stats["model_stats"])


def settled(read: Callable[[], T], want: T) -> T:
    """``read()`` once it equals ``want``, or its value after 10 s (the caller asserts it). Triton
    counts an inference in its statistics as it finishes it, which may come just after the
    client has its answer: a count read at once can be one short."""
    try:
        wait_for(lambda: read() == want, timeout=10, what=f"Triton's counts to reach {want}")
    except TimeoutError:
        pass
    return read()


def many(protocol: str, url: str, model: str, n: int, headers: dict | None = None) -> None:
    """``n`` requests, 8 in flight (bounded; every one must succeed). HTTP: aiohttp with
    tritonclient's JSON body (tritonclient.http's gevent pool manages ~100 requests/s here);
    gRPC: tritonclient's async_infer on one channel."""
    mod = httpclient if protocol == "http" else grpcclient
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = mod.InferInput(name, [2], "FP32")
        i.set_data_from_numpy(np.ones(2, dtype=np.float32))
        inputs.append(i)
    if protocol == "http":
        asyncio.run(_many_http(url, model, n, headers or {}))
        return
    c = grpcclient.InferenceServerClient(url)
    try:
        for start in range(0, n, 8):
            done: queue.Queue = queue.Queue()
            k = min(8, n - start)
            for _ in range(k):
                c.async_infer(model, inputs, callback=lambda result, error, done=done: done.put(error),
                              headers=headers)
            errors = [done.get(timeout=60) for _ in range(k)]
            assert errors == [None] * k, errors
    finally:
        c.close()


BODY = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [2], "data": [1.0, 1.0]}
                              for n in ("INPUT0", "INPUT1")]}).encode()


async def _many_http(url: str, model: str, n: int, headers: dict) -> None:
    import aiohttp
    sem = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        async def one() -> None:
            async with sem, session.post(f"http://{url}/v2/models/{model}/infer", data=BODY,
                                         headers={"content-type": "application/json", **headers}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        await asyncio.gather(*(one() for _ in range(n)))


def metrics(gw: GatewayProcess) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics(gw).items() if n == name and labels.items() <= dict(ls).items())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_95_5_split_over_10000_requests(fleet, protocol):
    a, b, gw = fleet["a"], fleet["b"], fleet["gw"]
    before = count(a, "m"), count(b, "m")
    n = 10_000
    many(protocol, gw.http_url if protocol == "http" else gw.grpc_url, "m", n)
    settled(lambda: count(a, "m") + count(b, "m") - sum(before), n)
    got_a, got_b = count(a, "m") - before[0], count(b, "m") - before[1]
    assert got_a + got_b == n
    assert abs(100 * got_b / n - 5) <= 1.5, (got_a, got_b)
    # The gateway's metrics name the backend each request went to.
    assert metric(gw, "oip_gateway_requests_total", api="infer", route="m", backend="b_grpc") >= got_b


def test_a_split_side_without_the_model_gives_its_share_away(fleet):
    a, b, gw = fleet["a"], fleet["b"], fleet["gw"]
    b.unload_model("m")
    try:
        # Straight away — before the gateway's checker has seen it: a request the split sends
        # to b finds the model gone there and is answered by a instead, never failed.
        before = count(a, "m")
        many("grpc", gw.grpc_url, "m", 100)
        assert settled(lambda: count(a, "m") - before, 100) == 100
        # Then the checker's own view (route_ready) and the split follows it.
        wait_for(lambda: metric(gw, "oip_gateway_route_ready", route="m", backend="b_grpc") == 0, timeout=30,
                 what="the gateway's checker to see m gone from b")
        before = count(a, "m")
        many("http", gw.http_url, "m", 400)
        assert settled(lambda: count(a, "m") - before, 400) == 400  # every one answered, all by the ready side
    finally:
        b.load_model("m")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_header_routes_pick_the_variant(fleet, protocol):
    a, b, gw = fleet["a"], fleet["b"], fleet["gw"]
    url = gw.http_url if protocol == "http" else gw.grpc_url
    before = count(a, "h"), count(b, "h")
    many(protocol, url, "h", 20, headers={"x-variant": "canary"})
    many(protocol, url, "h", 30)
    many(protocol, url, "h", 10, headers={"x-variant": "other"})
    assert settled(lambda: (count(a, "h") - before[0], count(b, "h") - before[1]), (40, 20)) == (40, 20)


def test_mirror_sends_its_exact_share_to_the_shadow(fleet):
    a, b, gw = fleet["a"], fleet["b"], fleet["gw"]
    before = count(a, "s"), count(b, "s")
    for protocol in ("http", "grpc"):
        many(protocol, gw.http_url if protocol == "http" else gw.grpc_url, "s", 200)
    assert settled(lambda: count(a, "s") - before[0], 400) == 400
    wait_for(lambda: count(b, "s") - before[1] == 100, timeout=30, what="the shadow's 25 % (its own statistics)")
    assert metric(gw, "oip_gateway_mirror_requests_total", route="s", backend="b_grpc", outcome="answered") == 100


def test_a_dead_shadow_never_reaches_the_client_and_stays_bounded(fleet):
    a, gw = fleet["a"], fleet["gw"]
    before = count(a, "s2")
    many("grpc", gw.grpc_url, "s2", 60)  # every copy goes to a listener that never answers
    assert settled(lambda: count(a, "s2") - before, 60) == 60  # every client answered, by the primary
    inflight = metric(gw, "oip_gateway_mirror_inflight", route="s2", backend="hole")
    assert 0 < inflight <= 4
    dropped = metric(gw, "oip_gateway_mirror_requests_total", route="s2", backend="hole", outcome="dropped")
    assert dropped >= 60 - 4
