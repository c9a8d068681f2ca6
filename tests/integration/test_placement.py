"""Placement (issue 40: the ``placement`` pool option) against real Triton processes in explicit
model-control mode sharing one model repository: models loaded on demand, placed by rendezvous hash,
capacity per endpoint, LRU eviction, a bounded hold queue, copies following demand, replicas agreeing.

Everything is observed from outside the gateway (tests/support/placement.py): each Triton's own
repository index polled every 0.2 s (``CapacityWatch``: never over capacity except while an unload
already under way completes; READY + LOADING never over it at all) and each Triton's own log (every
"successfully loaded '<model>'" line: how many loads, and no load of a model that was still loaded
there — a reload). One module-scoped fleet of three Tritons; every test starts from all of them
empty (``Fleet.reset``). Models: ``m00`` .. ``m11`` (add_sub, 0.3 s to load), ``slow_a`` /
``slow_b`` (5 s to load), ``busy`` (20 ms per execution: requests pile up), ``mem0`` .. ``mem5``
(add_sub on a C backend that reports 100 MB of memory each to Triton's statistics).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.placement import (
    CapacityWatch,
    Fleet,
    GrpcAnswer,
    HttpAnswer,
    grpc_infer,
    http_infer,
    index_states,
    lru_loads,
    memory_held,
    metric,
    optimal_loads,
    shared_repository,
    triton_stats,
)
from tests.support.procs import wait_for
from tests.support.triton import TritonRepositoryError, TritonServer, triton_available

pytestmark = pytest.mark.triton

LOAD_DELAY_S = 0.3
SLOW_S = 5.0
BUSY_EXEC_S = 0.02
CAPACITY = 3
HOT = "m00"
PINNED = "m11"
MEM = 100_000_000
MEM_MODELS = [f"mem{i}" for i in range(6)]


@pytest.fixture(autouse=True)
def _needs_triton(triton_required: None) -> None:
    """Triton processes of this module's own."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    reason = triton_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Triton must run in CI: {reason}")
        pytest.skip(f"Triton unavailable: {reason}")
    root = tmp_path_factory.mktemp("placement")
    repo = shared_repository(root, 12, LOAD_DELAY_S, slow={"slow_a": SLOW_S, "slow_b": SLOW_S},
                             busy={"busy": BUSY_EXEC_S}, memory=dict.fromkeys(MEM_MODELS, MEM))
    with Fleet(repo, root / "fleet", 3) as f:
        yield f


@pytest.fixture
def clean(fleet: Fleet) -> Fleet:
    """The fleet with all three Tritons running and holding nothing."""
    fleet.reset()
    return fleet


# ------------------------------------------------------------------------------------------- helpers


def pool(fleet: Fleet, protocol: str = "grpc", **placement: Any) -> dict[str, Any]:
    return {"protocol": protocol, "endpoints": fleet.urls(protocol),
            "placement": {"capacity_models": CAPACITY, **placement}}


@contextlib.contextmanager
def gateway(tmp_path: Path, backends: dict[str, Any], routes: list[dict[str, Any]] | None = None,
            name: str = "gw", **extra: Any) -> Iterator[GatewayProcess]:
    """A gateway, started and live, every model routed to the backend ``pool`` unless ``routes``
    say otherwise; ``extra``: top-level config keys (``listen`` replaces the default listeners)."""
    cfg = gateway_config(backends, routes or [{"model": "*", "backend": "pool"}], **extra)
    with GatewayProcess(cfg, tmp_path, name) as gw:
        host, port = gw.http_url.split(":")

        def live() -> bool:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            try:
                conn.request("GET", "/v2/health/live")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        wait_for(live, timeout=30, what=f"{name} live")
        yield gw


def gateway_index(gw: GatewayProcess) -> list[dict[str, Any]]:
    host, port = gw.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v2/repository/index", body=b"{}", headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        return list(json.loads(body))
    finally:
        conn.close()


def run_threads(n: int, target: Callable[[int], Any], timeout: float = 120.0) -> list[Any]:
    """``target(i)`` in ``n`` threads released together; their results in order (an exception is a result)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"requests still running after {timeout}s"
    return results


def retry_after_ok(value: str | None) -> bool:
    return value is not None and value.strip().isdigit()


def settle(fleet: Fleet, timeout: float = 30.0) -> None:
    """Until no Triton has a model LOADING or UNLOADING (so the logs hold every load and unload)."""
    wait_for(lambda: all(s is not None and all(st == "READY" for st in s.values())
                         for s in fleet.states().values()),
             timeout=timeout, what="no load or unload under way")


# ---------------------------------------------------------------------------------------- the harness


def test_harness_sees_loads_reloads_and_capacity(clean: Fleet) -> None:
    """What the other tests rely on, checked against Triton alone: the watch sees a server over a
    capacity of 1 (span, strict sample, one unload time); the log shows every load; a load sent for
    a model READY there (its directory changed) is a reload, one sent while it was UNLOADING is not."""
    fleet = clean
    t0 = fleet[0]
    mark = fleet.mark()
    with CapacityWatch(fleet, capacity=1) as watch:
        t0.load_model("m00", transport="grpc")
        t0.load_model("m01", transport="grpc")
        wait_for(lambda: watch.max_count["t0"] == 2, timeout=5, what="two models seen on t0")
        (fleet.repository / "m00" / "config.pbtxt").touch()  # as the first load's __pycache__ would
        t0.load_model("m00", transport="grpc")  # READY there: Triton reloads it
        t0.unload_model("m01")
        wait_for(lambda: watch.ever("m01", "UNLOADING"), timeout=5, what="m01 seen UNLOADING")
        t0.load_model("m01", transport="grpc")  # a new copy beside the one unloading
        t0.unload_model("m01")
        wait_for(lambda: len(watch.unload_durations) >= 1 and not fleet.where("m01", "UNLOADING"), timeout=10,
                 what="the unloads seen through")
    assert fleet.loads(mark) == Counter({("t0", "m00"): 2, ("t0", "m01"): 2}), fleet.log_report(mark)
    assert [(e.server, e.model) for e in fleet.reloads(mark)] == [("t0", "m00"), ("t0", "m01")]
    assert [(e.server, e.model) for e in fleet.reloads(mark, watch)] == [("t0", "m00")], watch.transitions
    assert [(e.server, e.model) for e in fleet.loads_while_unloading(mark, watch)] == [("t0", "m01")]
    assert watch.over and watch.strict and watch.violations(grace_s=0.5), watch.report()
    assert 0.2 < watch.one_unload_s() < 5.0, watch.report()
    assert watch.max_count == {"t0": 2, "t1": 0, "t2": 0}


# -------------------------------------------------------------------------------------- cycling, LRU


def cycle_sequence(seed: int, rounds: int = 2) -> list[str]:
    """Every cold model (m01..m10) once per round in a seeded random order, HOT after each."""
    rng = random.Random(seed)
    cold = [f"m{i:02d}" for i in range(1, 11)]
    seq: list[str] = []
    for _ in range(rounds):
        order = cold[:]
        rng.shuffle(order)
        for model in order:
            seq += [model, HOT]
    return seq


def test_cycling_twelve_models_over_three_tritons(clean: Fleet, tmp_path: Path) -> None:
    """Three Tritons, capacity 3 each, 12 models (HOT every other request, PINNED never requested,
    the other ten in a seeded random order, twice), tritonclient over HTTP and gRPC alternately:

    - every answer right; the pinned model loaded at start with no request, never evicted;
    - no Triton over 3 (READY/LOADING/UNLOADING, polled every 0.2 s) beyond one unload time, and
      READY + LOADING never over 3;
    - HOT loaded once and never unloaded; no reload of a loaded model;
    - each model on one endpoint (its hash order's first: min_residency_s 0, so the first can always
      evict), and the loads no more than an LRU cache of each endpoint's own request sequence needs
      (+2; Belady's optimum reported), and never more than one per request;
    - the gateway's index shows where HOT is; its metrics count loads (ok) and evictions.
    """
    fleet = clean
    mark = fleet.mark()
    seq = cycle_sequence(40)
    backends = {"pool": pool(fleet, "grpc", min_residency_s=0, pinned=[PINNED], load_timeout_s=60)}
    failures: list[str] = []
    with CapacityWatch(fleet, CAPACITY) as watch, gateway(tmp_path, backends) as gw:
        # Pinned: loaded at start, before (and without) any request.
        wait_for(lambda: fleet.where(PINNED), timeout=30, what=f"{PINNED} loaded at start")
        assert sum(fleet.loads(mark).values()) == 1, fleet.log_report(mark)
        with httpclient.InferenceServerClient(gw.http_url, network_timeout=120, connection_timeout=120) as hc, \
                grpcclient.InferenceServerClient(gw.grpc_url) as gc:
            for i, model in enumerate(seq):
                kind = "http" if (i // 2) % 2 == 0 else "grpc"
                a = np.arange(4, dtype=np.float32) + i
                b = np.full(4, 0.5 + i % 5, dtype=np.float32)
                mod: Any = httpclient if kind == "http" else grpcclient
                inputs = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                try:
                    r = (hc if kind == "http" else gc).infer(model, inputs)
                    if not (np.array_equal(r.as_numpy("OUTPUT0"), a + b)
                            and np.array_equal(r.as_numpy("OUTPUT1"), a - b)):
                        failures.append(f"#{i} {model} over {kind}: wrong answer")
                except Exception as exc:
                    failures.append(f"#{i} {model} over {kind}: {exc}")
        hot_at = fleet.where(HOT)
        index = {e["name"]: e for e in gateway_index(gw)}
        loads_ok = metric(gw.metrics_url, "oip_gateway_placement_loads_total", backend="pool", outcome="ok")
        evictions = metric(gw.metrics_url, "oip_gateway_placement_unloads_total", backend="pool", reason="evict")
        held_count = metric(gw.metrics_url, "oip_gateway_hold_seconds_count")
        unloading_now = sum(1 for s in fleet.states().values() for st in (s or {}).values() if st == "UNLOADING")
    assert not failures, "\n".join(failures)
    watch.assert_capacity()
    log = fleet.log_report(mark)
    assert fleet.reloads(mark, watch) == [], log
    loads = fleet.loads(mark)
    # HOT and PINNED: loaded once, never unloaded.
    for model in (HOT, PINNED):
        assert sum(n for (_, m), n in loads.items() if m == model) == 1, f"{model} loaded more than once:\n{log}"
        assert watch.ever(model, "UNLOADING") == [], f"{model} unloaded:\n{log}"
    assert len(hot_at) == 1
    hot_url = fleet[hot_at[0]].grpc_url
    assert HOT in index and list(index[HOT].get("endpoints", [])) == [hot_url], index.get(HOT)
    # One home per model; loads within LRU's count for each endpoint's own sequence.
    homes: dict[str, set[str]] = {}
    for server, model in loads:
        homes.setdefault(model, set()).add(server)
    assert all(len(h) == 1 for h in homes.values()), f"a model placed on two endpoints: {homes}\n{log}"
    home = {m: next(iter(h)) for m, h in homes.items()}
    requested = [m for m in seq if m in home]
    assert set(requested) == set(seq)
    lru = opt = 0
    for server in fleet.names:
        sub = [m for m in requested if home[m] == server]
        cap = CAPACITY - (1 if home[PINNED] == server else 0)
        lru += lru_loads(sub, cap)
        opt += optimal_loads(sub, cap)
    placed = sum(n for (_, m), n in loads.items() if m != PINNED)
    print(f"\nplacement loads: {placed}; LRU per endpoint {lru}; optimum {opt}; cold requests {sum(1 for m in seq if m != HOT)}")
    cold_requests = sum(1 for m in seq if m != HOT)
    assert placed <= cold_requests + 1, f"{placed} loads for {cold_requests} cold requests + HOT"
    assert placed <= lru + 2, f"{placed} loads; LRU per endpoint needs {lru}, the optimum {opt}\n{log}"
    # Metrics: the loads (ok) and the evictions the logs show.
    unloaded = sum(fleet.unloads(mark).values())
    assert 0 < loads_ok <= sum(loads.values()), (loads_ok, loads)
    # The metric counts the unloads the gateway sent (its log names each); Triton logs an unload
    # only once it ends, and not at all when the model is loaded again while still UNLOADING.
    sent = gw.log_path.read_text(errors="replace").count("(evict)")
    assert 0 < evictions == sent, (evictions, sent)
    assert unloaded <= sent + unloading_now, (unloaded, sent, unloading_now)
    assert held_count > 0


# -------------------------------------------------------------------------------------- capacity_bytes


def test_capacity_bytes_holds_by_tritons_own_memory_reports(clean: Fleet, tmp_path: Path) -> None:
    """Six models that report 100 MB each to Triton's statistics, two Tritons of capacity_models 3
    and capacity_bytes 250 MB — two models each by memory:

    - first pass, every model once: a model's size is known only once it has loaded somewhere, so
      a first load may take an endpoint to 300 MB; the placer then evicts until the memory Triton
      reports is within 250 MB again (never more than capacity_models meanwhile);
    - then 30 requests in a seeded random order, sizes known: no Triton holds more than two models
      (polled every 0.2 s) beyond one unload time, and none reports more than 250 MB at the end;
    - every answer right.
    """
    fleet = clean
    # Two of the Tritons: six models cannot sit two to an endpoint, so evictions must happen
    # (over three, the hash order may place them two, two and two).
    backends = {"pool": {**pool(fleet, "grpc", min_residency_s=0, load_timeout_s=60, capacity_bytes=250_000_000),
                         "endpoints": fleet.urls("grpc")[:2]}}
    rng = random.Random(250)
    seq = [*MEM_MODELS, *(rng.choice(MEM_MODELS) for _ in range(30))]
    wrong: list[str] = []

    def within() -> bool:
        held = [memory_held(t) for t in fleet]
        return all(h is not None and sum(h.values()) <= 250_000_000 for h in held)

    with CapacityWatch(fleet, CAPACITY) as by_models, gateway(tmp_path, backends) as gw:
        for i, model in enumerate(seq[:len(MEM_MODELS)]):
            a = http_infer(gw.http_url, model, seed=i) if i % 2 else grpc_infer(gw.grpc_url, model, seed=i)
            if not a.right:
                wrong.append(f"#{i} {model}: {a}")
        wait_for(within, timeout=30, what="every Triton within 250 MB after the first loads")
        with CapacityWatch(fleet, 2) as by_bytes:
            for i, model in enumerate(seq[len(MEM_MODELS):], len(MEM_MODELS)):
                a = http_infer(gw.http_url, model, seed=i) if i % 2 else grpc_infer(gw.grpc_url, model, seed=i)
                if not a.right:
                    wrong.append(f"#{i} {model}: {a}")
        settle(fleet)
        final = {fleet.name_of(t): memory_held(t) for t in fleet}
        evictions = gw.log_path.read_text(errors="replace").count("(evict)")
    assert not wrong, "\n".join(wrong)
    by_models.assert_capacity()
    by_bytes.assert_capacity()
    # Triton itself reports the memory the gateway counted: 100 MB for every model it holds.
    for name, held in final.items():
        assert held is not None and all(n == MEM for n in held.values()), (name, held)
        assert sum(held.values()) <= 250_000_000, final
    assert any(h for h in final.values()), final
    assert evictions > 0  # (capacity_models alone would have let three stay)


def test_an_http_pool_sends_its_loads_to_the_grpc_port(clean: Fleet, tmp_path: Path) -> None:
    """``placement.grpc_port``: an http backend's loads and unloads go to its servers' gRPC port
    (Triton holds its other HTTP traffic while an HTTP repository call runs). Read from the Triton's
    own verbose log, which names every HTTP request and every gRPC call: with grpc_port three
    models are loaded (the third evicting the first: an unload too) by RepositoryModelLoad /
    Unload and no HTTP repository request; without it, the load is an HTTP request. Every
    answer right."""
    with TritonServer(clean.repository, startup_models=(), log_verbose=1) as triton:
        assert triton.log_path is not None
        placement = {"capacity_models": 2, "min_residency_s": 0, "load_timeout_s": 30}
        over_grpc = {"pool": {"protocol": "http", "endpoints": [triton.http_url],
                              "placement": {**placement, "grpc_port": triton.grpc_port}}}
        with gateway(tmp_path, over_grpc) as gw:
            answers = [http_infer(gw.http_url, model, seed=i) for i, model in enumerate(("m01", "m02", "m03"))]
            wait_for(lambda: (index_states(triton) or {}).get("m01") not in ("READY", "UNLOADING"), timeout=15,
                     what="m01 unloaded")
        log = triton.log_path.read_text(errors="replace")
        over_http = {"pool": {"protocol": "http", "endpoints": [triton.http_url], "placement": placement}}
        with gateway(tmp_path, over_http, name="gw-http") as gw:
            answers.append(http_infer(gw.http_url, "m04", seed=4))
        log_after = triton.log_path.read_text(errors="replace")[len(log):]
    assert all(a.right for a in answers), answers
    assert log.count("Done for RepositoryModelLoad") == 3, log
    assert log.count("Done for RepositoryModelUnload") >= 1, log
    assert "/v2/repository/models/" not in log, log
    assert "HTTP request: 2 /v2/repository/models/m04/load" in log_after, log_after


# --------------------------------------------------------------------------------------------- burst


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_burst_of_fifty_for_one_unloaded_model(clean: Fleet, tmp_path: Path, protocol: str) -> None:
    """50 concurrent requests (HTTP and gRPC clients, half each) for a model loaded nowhere, on a
    pool of either protocol: exactly one load on one endpoint (Triton's log), all 50 answered right."""
    fleet = clean
    mark = fleet.mark()
    model = "m03"
    with CapacityWatch(fleet, CAPACITY) as watch, gateway(tmp_path, {"pool": pool(fleet, protocol)}) as gw:

        def one(i: int) -> HttpAnswer | GrpcAnswer:
            if i % 2:
                return grpc_infer(gw.grpc_url, model, seed=i)
            return http_infer(gw.http_url, model, seed=i)

        answers = run_threads(50, one)
    wrong = [(i, a) for i, a in enumerate(answers) if not getattr(a, "right", False)]
    assert not wrong, wrong[:5]
    loads = fleet.loads(mark)
    assert len(loads) == 1 and set(loads.values()) == {1}, f"not one load: {loads}\n{fleet.log_report(mark)}"
    ((server, _),) = loads
    assert fleet.where(model) == [server]
    assert fleet.reloads(mark, watch) == []
    watch.assert_capacity()


# ------------------------------------------------------------------------------------- queue, timeout


def test_queue_bound_refuses_with_retry_after(clean: Fleet, tmp_path: Path) -> None:
    """queue 2, a model that takes 5 s to load: of 10 concurrent requests at most 2 wait (and are
    answered once it is loaded), the others get 503 at once with Retry-After and a message naming
    the model; a gRPC request meanwhile gets UNAVAILABLE with a retry-after trailer; an already
    loaded model keeps answering."""
    fleet = clean
    mark = fleet.mark()
    backends = {"pool": pool(fleet, "grpc", queue=2, load_timeout_s=30)}
    with gateway(tmp_path, backends) as gw:
        assert http_infer(gw.http_url, "m00").right
        answers: list[tuple[int, HttpAnswer]] = []
        lock = threading.Lock()

        barrier = threading.Barrier(10)

        def one(i: int) -> None:
            barrier.wait(30)
            a = http_infer(gw.http_url, "slow_a", seed=i)
            with lock:
                answers.append((i, a))

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(10)]
        began = time.monotonic()
        for t in threads:
            t.start()
        # The refusals come at once: well before the 5 s load ends.
        wait_for(lambda: len(answers) >= 8, timeout=SLOW_S - 1.5, what="8 refusals before the load ends")
        refused_by = time.monotonic() - began
        with lock:
            early = list(answers)
        g = grpc_infer(gw.grpc_url, "slow_a", seed=99)
        other = http_infer(gw.http_url, "m00", seed=7)
        still_waiting = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join(60)
        refusals_metric = metric(gw.metrics_url, "oip_gateway_hold_refusals_total", reason="queue_full")
    assert len(early) >= 8 and refused_by < SLOW_S, (refused_by, early)
    for i, a in early:
        assert a.status == 503, (i, a.status, a.error)
        assert retry_after_ok(a.retry_after), a.headers
        assert "slow_a" in a.error, a.error
    assert g.code == "UNAVAILABLE" and "slow_a" in g.details, (g.code, g.details)
    assert retry_after_ok(g.trailers.get("retry-after")), g.trailers
    assert other.right and other.seconds < 2.0, other
    assert still_waiting <= 2
    early_ids = {i for i, _ in early}
    late = [a for i, a in answers if i not in early_ids]
    assert len(answers) == 10 and len(late) <= 2
    assert all(a.right for a in late), [(a.status, a.error) for a in late]
    assert sum(n for (_, m), n in fleet.loads(mark).items() if m == "slow_a") == 1
    assert refusals_metric >= 9


def test_load_timeout_refuses_with_retry_after(clean: Fleet, tmp_path: Path) -> None:
    """load_timeout_s 1, a 5 s load: the held requests (HTTP and gRPC) get 503 / UNAVAILABLE after
    about 1 s, with Retry-After and the model named; an already loaded model answers meanwhile;
    the load itself goes on, and once it is done the model answers."""
    fleet = clean
    backends = {"pool": pool(fleet, "grpc", load_timeout_s=1)}
    with gateway(tmp_path, backends) as gw:
        assert http_infer(gw.http_url, "m00").right
        results: dict[str, Any] = {}
        calls = {"http": lambda: http_infer(gw.http_url, "slow_b"), "grpc": lambda: grpc_infer(gw.grpc_url, "slow_b")}
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, calls[k]()), daemon=True)
                   for k in calls]
        for t in threads:
            t.start()
        other = http_infer(gw.http_url, "m00", seed=3)
        for t in threads:
            t.join(30)
        h, g = results["http"], results["grpc"]
        timeouts = metric(gw.metrics_url, "oip_gateway_hold_refusals_total", reason="timeout")
        # Not abandoned: Triton finishes the load and the gateway then serves the model.
        wait_for(lambda: fleet.where("slow_b"), timeout=SLOW_S + 15, what="slow_b loaded in the end")
        wait_for(lambda: http_infer(gw.http_url, "slow_b", seed=5).right, timeout=10, what="slow_b answered")
    assert other.right and other.seconds < 2.0, other
    assert h.status == 503 and retry_after_ok(h.retry_after) and "slow_b" in h.error, (h.status, h.headers, h.error)
    assert 0.8 <= h.seconds < SLOW_S, h.seconds
    assert g.code == "UNAVAILABLE" and "slow_b" in g.details, (g.code, g.details)
    assert retry_after_ok(g.trailers.get("retry-after")), g.trailers
    assert 0.8 <= g.seconds < SLOW_S, g.seconds
    assert timeouts >= 2


# ----------------------------------------------------------------------------------- unknown model


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_model_the_repository_lacks_is_the_backends_error(clean: Fleet, tmp_path: Path, protocol: str) -> None:
    """A model no repository has: what Triton itself answers to loading it (measured here: HTTP
    500 / gRPC INTERNAL "failed to load 'absent', failed to poll from model repository"), relayed —
    not a 503 of the gateway's; the gateway keeps serving others."""
    fleet = clean
    direct: dict[str, TritonRepositoryError] = {}
    for transport in ("http", "grpc"):
        with pytest.raises(TritonRepositoryError) as info:
            fleet[0].load_model("absent", transport=transport, timeout=30)
        direct[transport] = info.value
    with gateway(tmp_path, {"pool": pool(fleet, protocol)}) as gw:
        h = http_infer(gw.http_url, "absent")
        g = grpc_infer(gw.grpc_url, "absent")
        ok = http_infer(gw.http_url, "m00")
        failed = metric(gw.metrics_url, "oip_gateway_placement_loads_total", backend="pool", outcome="failed")
    assert h.status == direct["http"].status and h.status != 503, (h.status, h.error, direct["http"])
    assert "absent" in h.error and "failed to load" in h.error, h.error
    assert g.code == direct["grpc"].status, (g.code, g.details, direct["grpc"])
    assert "absent" in g.details and "failed to load" in g.details, g.details
    assert ok.right
    assert failed >= 1
    assert all(models <= {"m00"} for models in fleet.held().values()), fleet.held()


# -------------------------------------------------------------------------------------------- kill


def test_killed_triton_models_come_back_elsewhere_and_restart_takes_models(clean: Fleet, tmp_path: Path) -> None:
    """Six models placed (min_residency_s 30: nothing evictable during the test); the Triton holding
    most of them killed while another client keeps using the others (all answered): each lost
    model answered right on its very next request, from a survivor; restarted (empty, same ports),
    it takes the next new models (the survivors are full and may not evict)."""
    fleet = clean
    mark = fleet.mark()
    warm = [f"m{i:02d}" for i in range(6)]
    backends = {"pool": pool(fleet, "grpc", min_residency_s=30, load_timeout_s=20)}
    with CapacityWatch(fleet, CAPACITY) as watch, gateway(tmp_path, backends) as gw:
        first = run_threads(len(warm), lambda i: grpc_infer(gw.grpc_url, warm[i], seed=i))
        assert all(a.right for a in first), first
        held = fleet.held()
        victim = max(fleet.names, key=lambda n: len(held[n] & set(warm)))
        lost = sorted(held[victim] & set(warm))
        kept = sorted(set(warm) - set(lost))
        assert len(lost) >= 2 and kept, held
        stop = threading.Event()
        background: list[GrpcAnswer] = []

        def keep_using() -> None:
            import grpc

            with grpc.insecure_channel(gw.grpc_url) as ch:
                i = 0
                while not stop.is_set():
                    background.append(grpc_infer(gw.grpc_url, kept[i % len(kept)], seed=i, channel=ch, timeout=30))
                    i += 1

        user = threading.Thread(target=keep_using, daemon=True)
        user.start()
        wait_for(lambda: len(background) >= 5, timeout=10, what="the other client under way")
        fleet[victim].kill()
        again = {m: http_infer(gw.http_url, m, seed=i) for i, m in enumerate(lost)}
        served_from = {m: fleet.where(m) for m in lost}
        stop.set()
        user.join(30)
        fleet[victim].restart()
        fresh = ["m06", "m07"]
        for model in fresh:

            def answered(model: str = model) -> bool:
                return http_infer(gw.http_url, model, seed=11).right

            wait_for(answered, timeout=30, what=f"{model} answered with {victim} back")
        fresh_at = {m: fleet.where(m) for m in fresh}
    assert all(a.right for a in again.values()), {m: (a.status, a.error) for m, a in again.items()}
    assert all(w and victim not in w for w in served_from.values()), served_from
    bad = [a for a in background if not a.right]
    assert not bad and background, bad[:5]
    assert all(w == [victim] for w in fresh_at.values()), fresh_at
    relaunched = fleet[victim].launches
    assert any(e.server == victim and e.launch == relaunched for e in fleet.events(mark, kinds=("loaded",)))
    assert fleet.reloads(mark, watch) == []
    watch.assert_capacity()


# ------------------------------------------------------------------------------------------ copies


def test_hot_model_gets_a_second_copy_and_loses_it_when_idle(clean: Fleet, tmp_path: Path) -> None:
    """max_copies 2, scale_up_per_copy 1, scale_up_after_s 1, copy_idle_s 3: twelve clients in a
    closed loop on ``busy`` (20 ms per execution: requests queue) make a second Triton load it and
    get requests too; once they stop, one copy is unloaded after about copy_idle_s (no earlier than
    copy_idle_s - 1 s, within copy_idle_s + 6 s); two loads in all, no reload, capacity held."""
    fleet = clean
    mark = fleet.mark()
    copy_idle_s = 3.0
    backends = {"pool": pool(fleet, "grpc", copies=1, max_copies=2, scale_up_per_copy=1, scale_up_after_s=1,
                             copy_idle_s=copy_idle_s, min_residency_s=1)}
    stop = threading.Event()
    wrong: list[HttpAnswer] = []

    def copies_of(model: str, n: int) -> list[str]:
        where = fleet.where(model)
        return where if len(where) == n else []

    with CapacityWatch(fleet, CAPACITY) as watch, gateway(tmp_path, backends) as gw:

        def client(i: int) -> None:
            host, port = gw.http_url.split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            n = 0
            try:
                while not stop.is_set():
                    a = http_infer(gw.http_url, "busy", seed=i * 1000 + n, conn=conn)
                    n += 1
                    if not a.right:
                        wrong.append(a)
                        conn.close()
                        conn = http.client.HTTPConnection(host, int(port), timeout=60)
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(12)]
        for t in threads:
            t.start()
        try:
            two = wait_for(lambda: copies_of("busy", 2), timeout=30, what="a second copy of busy")
            loaded = [e.server for e in sorted(fleet.events(mark, kinds=("loaded",), model="busy"),
                                               key=lambda e: e.t)]
            second = loaded[-1]
            assert set(loaded) == set(two) and len(loaded) == 2, loaded
            wait_for(lambda: (triton_stats(fleet[second], "busy") or {}).get("inference_count", 0) > 0,
                     timeout=10, what=f"requests sent to the copy on {second}")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        stopped = time.monotonic()
        one = wait_for(lambda: copies_of("busy", 1), timeout=copy_idle_s + 15, what="the extra copy unloaded")
        # (the watch polls every 0.2 s: it may see the unload a poll after the index query above)
        unloading_at = wait_for(lambda: min((t.t for t in watch.transitions_of("busy") if t.after == "UNLOADING"),
                                            default=None), timeout=5, what="the watch seeing the unload")
        idle_unloads = metric(gw.metrics_url, "oip_gateway_placement_unloads_total", backend="pool",
                              reason="idle_copy")
        assert http_infer(gw.http_url, "busy").right  # the remaining copy serves
    assert not wrong, [(a.status, a.error) for a in wrong[:5]]
    assert len(one) == 1 and one[0] in two
    assert unloading_at is not None
    assert copy_idle_s - 1.0 <= unloading_at - stopped <= copy_idle_s + 6.0, unloading_at - stopped
    assert idle_unloads >= 1
    assert sum(n for (_, m), n in fleet.loads(mark).items() if m == "busy") == 2
    assert fleet.reloads(mark, watch) == []
    watch.assert_capacity()


# ---------------------------------------------------------------------------------------- replicas


def replica_sequence(seed: int, n: int = 12) -> list[str]:
    """HOT every other request, the others drawn from m01..m11 in a seeded order."""
    rng = random.Random(seed)
    cold = [f"m{i:02d}" for i in range(1, 12)]
    rng.shuffle(cold)
    seq: list[str] = []
    for i in range(n // 2):
        seq += [cold[i % len(cold)], HOT]
    return seq


def mixed_load(urls: tuple[str, str], seeds: tuple[int, int]) -> list[str]:
    """Two clients at once (gRPC on the first URL, HTTP on the second), each its own sequence;
    the failures (an empty list: every answer right)."""
    failures: list[str] = []

    def run(i: int) -> None:
        for j, model in enumerate(replica_sequence(seeds[i])):
            a = grpc_infer(urls[0], model, seed=j) if i == 0 else http_infer(urls[1], model, seed=j)
            if not a.right:
                failures.append(f"client {i} #{j} {model}: {a}")

    crashed = [r for r in run_threads(2, run, timeout=180) if isinstance(r, BaseException)]
    return failures + [repr(r) for r in crashed]


def test_two_replicas_agree(clean: Fleet, tmp_path: Path) -> None:
    """Replica A answers the peers API (listen.peers, port read back from its port file) and decides;
    replica B (top-level peers: [A]) asks it. The same two-client mixed load as through one replica
    alone: every answer right; no Triton over capacity beyond one unload time (READY + LOADING never
    over); no reload of a loaded model; no model unloaded within min_residency_s of being READY
    (no thrash); loads + unloads at most 1.5 x the single replica's (+2)."""
    fleet = clean
    min_residency_s = 1.0
    backends = {"pool": pool(fleet, "grpc", min_residency_s=min_residency_s)}

    # One replica alone: the baseline.
    mark = fleet.mark()
    with CapacityWatch(fleet, CAPACITY) as alone, gateway(tmp_path, backends, name="single") as single:
        failures = mixed_load((single.grpc_url, single.http_url), (1, 2))
        settle(fleet)
    assert not failures, failures
    single_churn = sum(fleet.loads(mark).values()) + sum(fleet.unloads(mark).values())
    assert fleet.reloads(mark, alone) == [], fleet.log_report(mark)
    alone.assert_capacity()

    fleet.reset()
    mark = fleet.mark()
    listen = {"http": "127.0.0.1:0", "grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0", "peers": "127.0.0.1:0"}
    with CapacityWatch(fleet, CAPACITY) as watch:
        with gateway(tmp_path, backends, name="replica-a", listen=listen) as a:
            assert "peers" in a.ports, f"no 'peers' port in {a.port_file}: {a.ports}"
            peer = f"127.0.0.1:{a.ports['peers']}"
            with gateway(tmp_path, backends, name="replica-b", peers=[peer]) as b:
                started = time.monotonic()
                failures = mixed_load((a.grpc_url, b.http_url), (1, 2))
                took = time.monotonic() - started
        settle(fleet)
    assert not failures, failures
    log = fleet.log_report(mark)
    assert fleet.reloads(mark, watch) == [], log
    watch.assert_capacity()
    # READY and UNLOADING are each seen up to one poll late; a load's held requests use it at once.
    short = [(s, m, round(d, 2)) for s, m, d in watch.residencies if d < min_residency_s - 3 * watch.interval]
    assert not short, f"unloaded within min_residency_s of READY: {short}\n{log}"
    churn = sum(fleet.loads(mark).values()) + sum(fleet.unloads(mark).values())
    assert churn <= 1.5 * single_churn + 2, (
        f"two replicas: {churn} loads+unloads in {took:.1f}s; one replica: {single_churn}\n{log}")


def test_symmetric_replicas_elect_one_decider_and_hand_over(clean: Fleet, tmp_path: Path) -> None:
    """Two replicas, each with its own peers port and both listing both (as a headless Service gives
    them; set here by a reload, since the ports are only known once bound): exactly one of them
    loads and unloads (its log), under load through both; capacity held, no reload. The decider
    stopped, the other takes over: a model not yet loaded is loaded through it."""
    fleet = clean
    mark = fleet.mark()
    backends = {"pool": pool(fleet, "grpc", min_residency_s=0)}
    listen = {"http": "127.0.0.1:0", "grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0", "peers": "127.0.0.1:0"}
    with CapacityWatch(fleet, CAPACITY) as watch:
        with gateway(tmp_path, backends, name="sym-a", listen=listen) as a, \
                gateway(tmp_path, backends, name="sym-b", listen=listen) as b:
            peers = [f"127.0.0.1:{a.ports['peers']}", f"127.0.0.1:{b.ports['peers']}"]
            for gw in (a, b):
                cfg = yaml.safe_load(gw.config_path.read_text())
                cfg["peers"] = peers
                gw.config_path.write_text(yaml.safe_dump(cfg))
                assert gw.proc is not None
                gw.proc.send_signal(signal.SIGHUP)
            for gw in (a, b):
                wait_for(lambda gw=gw: metric(gw.metrics_url, "oip_gateway_config_generation") >= 2, timeout=20,
                         what="the peers reload applied")
            failures = mixed_load((a.grpc_url, b.http_url), (3, 4))
            assert not failures, failures
            deciding = [gw for gw in (a, b) if "backend 'pool': loaded" in gw.log_path.read_text(errors="replace")]
            assert len(deciding) == 1, [gw.log_tail(5) for gw in (a, b)]
            other = b if deciding[0] is a else a
            deciding[0].stop()
            ready = {m for states in fleet.states().values() for m, st in (states or {}).items() if st == "READY"}
            unloaded = sorted({f"m{i:02d}" for i in range(12)} - ready)
            assert unloaded, "every model is loaded: nothing left to load through the other replica"
            answer = http_infer(other.http_url, unloaded[0], seed=9)
            assert answer.right, (answer.status, answer.error)
            assert f"loaded '{unloaded[0]}'" in other.log_path.read_text(errors="replace")
        settle(fleet)
    watch.assert_capacity()
    assert fleet.reloads(mark, watch) == [], fleet.log_report(mark)


# -------------------------------------------------------------------------------- hold on any pool


def test_hold_s_on_a_plain_pool(clean: Fleet, tmp_path: Path) -> None:
    """A pool without placement, its only Triton started with no models. A route with hold_s 20:
    a request waits (the hold gauge shows it), the model is then loaded on the Triton directly, the
    request is answered right. A route without hold_s: 503 / UNAVAILABLE at once."""
    fleet = clean
    t0 = fleet[0]
    backends = {"plain": {"protocol": "grpc", "endpoints": [t0.grpc_url]}}
    routes: list[dict[str, Any]] = [{"model": "m07", "backend": "plain", "hold_s": 20},
                                    {"model": "m08", "backend": "plain"}]
    with gateway(tmp_path, backends, routes) as gw:
        refused = http_infer(gw.http_url, "m08")
        refused_g = grpc_infer(gw.grpc_url, "m08")
        result: list[HttpAnswer] = []
        held = threading.Thread(target=lambda: result.append(http_infer(gw.http_url, "m07", seed=4)), daemon=True)
        held.start()
        wait_for(lambda: metric(gw.metrics_url, "oip_gateway_hold_waiting") >= 1, timeout=10,
                 what="the request held")
        assert held.is_alive() and not result
        t0.load_model("m07", transport="grpc")
        held.join(25)
    assert refused.status == 503 and refused.seconds < 2.0, (refused.status, refused.error, refused.seconds)
    assert refused_g.code == "UNAVAILABLE" and refused_g.seconds < 2.0, refused_g
    assert result and result[0].right, result


# ----------------------------------------------------------------------------------------- workers


def test_workers_of_one_gateway_share_one_decider(clean: Fleet, tmp_path: Path) -> None:
    """--workers 2 without ``peers``: worker 0 decides and the other asks it (gateway/peers.py),
    so six clients cycling six models over one Triton of capacity 2 through both workers get
    every answer right, and the Triton never holds more than 2 (READY + LOADING; UNLOADING for at
    most one unload) nor reloads a model."""
    fleet = clean
    mark = fleet.mark()
    server = fleet[0]
    names = [f"m0{i}" for i in range(6)]
    backends = {"pool": {"protocol": "grpc", "endpoints": [server.grpc_url],
                         "placement": {"capacity_models": 2, "min_residency_s": 0}}}
    cfg = gateway_config(backends, [{"model": "*", "backend": "pool"}])
    wrong: list[str] = []

    def client(k: int, url: str) -> None:
        for i in range(12):
            model = names[(i * 5 + k) % len(names)]
            answer = http_infer(url, model, seed=k * 100 + i)
            if not answer.right:
                wrong.append(f"{model}: {answer.status} {answer.error}")

    with CapacityWatch(fleet, 2) as watch, GatewayProcess(cfg, tmp_path, "gw-workers", workers=2) as gw:
        threads = [threading.Thread(target=client, args=(k, gw.http_url), daemon=True) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads), "clients still waiting after 180 s"
    assert not wrong, wrong[:5]
    watch.assert_capacity()
    reloads = fleet.reloads(mark, watch)
    assert reloads == [], fleet.log_report(mark) + "\n" + "\n".join(
        f"{t.wall:.3f} {t.server} {t.model} {t.before}->{t.after}" for e in reloads for t in watch.transitions_of(e.model))
    assert sum(fleet.loads(mark).values()) >= len(names)
