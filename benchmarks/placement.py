"""Placement (issue 40): what the first request for an unloaded model costs against Triton's own load
time for it, and what placement costs a request once its model is placed.

    .venv/bin/python -m benchmarks.placement                      # all three parts, ~8 min on 2 cores
    .venv/bin/python -m benchmarks.placement --quick --out /tmp/p # smoke: ~2.5 min
    .venv/bin/python -m benchmarks.placement --parts steady       # one part (first, evict, steady)
    .venv/bin/python -m benchmarks.placement --report-from DIR    # redo results.md from DIR/results.json

Four parts (``--parts``; the default is ``first,evict,steady``), each bounded in count and time:

1. **first** — first-request latency. ``--tritons`` (3) Tritons in explicit model-control mode, started
   empty (tests/support/placement.py ``Fleet``) on one shared repository of add_sub models that take a
   known time to load (tests/support/fleet.py ``slow_repository``): ``--models`` (5) per load delay of
   ``--delays`` (0.5 s ``f00``.., 2.0 s ``s00``..). Per pool protocol of ``--pool-protocols`` a gateway
   (1 process) with one placement pool of all the Tritons (``capacity_models`` 100: no eviction) and
   ``model: "*"``. For each client protocol of ``--clients`` in turn, one *pair* per model, its halves in
   alternating order: (a) Triton's own load time — the repository ``load`` sent straight to the Triton the model's
   rendezvous order puts first (over the pool's protocol: ``POST /v2/repository/models/<m>/load`` for
   an HTTP pool, ``RepositoryModelLoad`` for a gRPC one, as the gateway sends it), timed until Triton
   answers (it answers when the model is READY); (b) the first inference for the model through the
   gateway (add_sub inputs, answer checked; the client's connection / channel opened and used before,
   so no connect is counted), then a second one (warm: what an inference costs once placed). Between
   halves and pairs the model is unloaded everywhere and the harness waits until every Triton's own
   index no longer lists it (no UNLOADING left) and the gateway's ``oip_gateway_placement_copies``
   series for it is gone (its health checker has seen the unload). Per pair: first request, Triton's
   load, overhead = first − load (and − warm), ratio first ÷ load, the gateway's own measure of its
   load call (``oip_gateway_placement_load_seconds`` delta) and Triton's load time from its log
   ("loading: m:1" → "successfully loaded 'm'") for both halves. Before the pairs every model is
   loaded and unloaded once (its ``__pycache__`` written, every Triton's Python backend warm).
2. **evict** — the same with the endpoint full: a pool of one Triton, ``capacity_models`` 1,
   ``min_residency_s`` 0. The first ``--evict-models`` (3) models of each delay are asked for in turn,
   so every first request (but the very first, not counted) must unload the model before it and then
   load its own. Triton's load time is measured first (load straight to the Triton while the previous
   model is still resident, unload, wait), then the gateway's first request; clients alternate.
3. **steady** — the steady-state cost per request. One Triton (tests/models/triton, explicit mode, no
   model at start), two gateways of 1 process each: *off*, add_sub routed to a plain ``grpc`` pool of
   it; *on*, add_sub routed to the same endpoint as a placement pool (``capacity_models`` 100), add_sub
   placed there by a first request (its latency is recorded). Health checks at the gateway's defaults
   for both. Load: h2load (benchmarks/loadgen.py), closed loop, ``-c C -m1``, ``--duration`` s per run,
   for ``--workloads`` (``grpc_small``: gRPC ModelInfer; ``http_json_small``: HTTP/1.1 JSON, converted
   to gRPC for the pool) at ``--concurrency`` (1, 16): a 1 s warm-up each, then ``--rounds`` (8) rounds
   alternating off / on (the order flipping every round). Before a round the harness waits (at most
   ``--quiet-budget`` 60 s in all) for the rest of the machine to use < 10 % of it. Gateway CPU per
   request from /proc (utime + stime of the gateway process tree, benchmarks/procstat.py, over
   h2load's steady window, as benchmarks/run.py ``measure``), req/s, p50, and the CPU other processes
   used meanwhile (``foreign``). The ratio on ÷ off is taken within each round; reported as the median
   with the min–max over rounds, again over the quiet rounds only (foreign < 5 % in both runs), and
   pooled (all rounds' CPU over all their requests). Target (issue 40): ≤ 1.05.
4. **count** (opt-in: valgrind, ~5 min) — the steady comparison counted, not timed: instructions per
   request under ``valgrind --tool=callgrind`` (benchmarks/instructions.py's method: each side at the
   two request counts of ``--count-requests``, the difference over the difference of requests) of one
   process holding a gateway (placement off, on) or none (direct), its client (gRPC: grpc.aio, HTTP:
   benchmarks/inproc.py's) and a canned gRPC backend that also answers RepositoryIndex. Not moved by
   the machine's noise; blind to system calls and cache misses.

Output: ``<out>/results.json`` (every pair and run, the summary, the machine, the commit) and
``<out>/results.md`` (the tables, printed too); default ``benchmarks/results/<date>-placement``.
Logs (gateway, Triton) stay in a scratch directory, removed at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import http.client
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.routing.rendezvous import rank  # noqa: E402
from tests.support.fleet import slow_repository  # noqa: E402
from tests.support.gateway import GatewayProcess, gateway_config  # noqa: E402
from tests.support.placement import Fleet, grpc_infer, http_infer, index_states, triton_stats  # noqa: E402
from tests.support.procs import wait_for  # noqa: E402
from tests.support.triton import MODEL_REPOSITORY, TritonServer, triton_available  # noqa: E402

from .procstat import cpu_seconds, system_busy_seconds  # noqa: E402
from .report import machine_info  # noqa: E402
from .run import measure  # noqa: E402
from .targets import Target, ensure_tools  # noqa: E402
from .workloads import WORKLOADS, verify, write_bodies  # noqa: E402

TARGET_RATIO = 1.05  # issue 40: placement on costs at most 5 % more CPU per request than off
QUIET = 0.05  # a run is "quiet" when other processes used less than this fraction of the machine
# The first-request gateways check health often, so that the harness learns quickly that the gateway
# saw an unload; the request path does not wait for a health round (a load wakes its waiters).
FIRST_HEALTH = {"interval_s": 0.25, "timeout_s": 0.5}
BIG_CAPACITY = 100


class _Stop(Exception):
    """--part-timeout reached."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------- repository


def group_names(delays: list[float], n: int) -> dict[float, list[str]]:
    """Model names per load delay: f00.. for the first delay, s00.. for the second, d2_00.. after."""
    prefixes = ["f", "s"] + [f"d{i}_" for i in range(2, len(delays))]
    return {d: [f"{prefixes[i]}{j:02d}" for j in range(n)] for i, d in enumerate(delays)}


def build_repository(root: Path, groups: dict[float, list[str]]) -> Path:
    """One repository holding every group's models, each add_sub taking its group's delay to load."""
    repo: Path | None = None
    for delay, names in groups.items():
        part = slow_repository(root, names, delay)
        if repo is None:
            repo = part
            continue
        for name in names:
            shutil.move(str(part / name), str(repo / name))  # model.py is an absolute symlink: still valid
        part.rmdir()
    assert repo is not None
    return repo


# ------------------------------------------------------------------------------------- gateway views


def metrics_text(gw: GatewayProcess) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", gw.ports["metrics"], timeout=5)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def metric_values(gw: GatewayProcess, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of every sample of each of ``names`` on the gateway's metrics page (all labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(metrics_text(gw)):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


def gateway_copies(gw: GatewayProcess, model: str) -> float:
    """``oip_gateway_placement_copies`` for ``model``: where the gateway's health view has it ready
    (0 when the series is gone)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text(gw)):
        for s in family.samples:
            if s.name == "oip_gateway_placement_copies" and s.labels.get("model") == model:
                return s.value
    return 0.0


M_LOAD_SUM = "oip_gateway_placement_load_seconds_sum"
M_LOAD_COUNT = "oip_gateway_placement_load_seconds_count"
M_HOLD_SUM = "oip_gateway_hold_seconds_sum"
M_EVICT = "oip_gateway_placement_unloads_total"
M_LOADS = "oip_gateway_placement_loads_total"
GW_METRICS = (M_LOAD_SUM, M_LOAD_COUNT, M_HOLD_SUM, M_EVICT, M_LOADS)


# ------------------------------------------------------------------------------------- waiting


def unload_everywhere(fleet: Fleet, model: str) -> None:
    for server in fleet:
        states = index_states(server, timeout=5.0) or {}
        if states.get(model) == "READY":
            server.unload_model(model, timeout=10.0)


def gone_from_tritons(fleet: Fleet, model: str) -> bool:
    for server in fleet:
        states = index_states(server, timeout=2.0)
        if states is None or model in states:
            return False
    return True


def wait_unloaded(fleet: Fleet, gw: GatewayProcess | None, model: str, timeout: float = 30.0) -> float:
    """Until no Triton lists ``model`` (READY, LOADING, UNLOADING) and the gateway's health view has
    it nowhere. A health round whose index read began before the unload ends within timeout_s: wait
    that long before asking the gateway. Returns the seconds waited."""
    began = time.monotonic()
    wait_for(lambda: gone_from_tritons(fleet, model), timeout=timeout, interval=0.05,
             what=f"{model} gone from every Triton")
    if gw is not None:
        time.sleep(FIRST_HEALTH["timeout_s"] + 0.1)
        wait_for(lambda: gateway_copies(gw, model) == 0, timeout=timeout, interval=0.05,
                 what=f"the gateway seeing {model} unloaded")
    return time.monotonic() - began


def triton_infer_s(server: TritonServer, model: str) -> float | None:
    """Triton's own time for the inferences of ``model`` so far (statistics: inference_stats.success.ns,
    request arrival to response sent); after the first inference, the first one's."""
    stats = triton_stats(server, model)
    if not stats:
        return None
    success = stats.get("inference_stats", {}).get("success", {})
    return int(success.get("ns", 0)) / 1e9 if int(success.get("count", 0)) == 1 else None


def holds_only(server: TritonServer, model: str) -> bool:
    return (index_states(server) or {}) == {model: "READY"}


def gateway_lost(gw: GatewayProcess, model: str) -> bool:
    return gateway_copies(gw, model) == 0


def triton_log_load_s(fleet: Fleet, mark: Any, model: str) -> float | None:
    """Triton's own load time of ``model`` since ``mark``: its log's "loading: m:1" → "successfully loaded"."""
    events = fleet.events(mark, kinds=("loading", "loaded"), model=model)
    start = next((e for e in events if e.kind == "loading"), None)
    if start is None:
        return None
    done = next((e for e in events if e.kind == "loaded" and e.server == start.server and e.offset > start.offset),
                None)
    return None if done is None else done.t - start.t


# ------------------------------------------------------------------------------------- clients


class Client:
    """One kept-alive HTTP/1.1 connection and one gRPC channel to a server (a gateway or a Triton),
    opened and used once before anything is timed."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        import grpc

        self.http_url, self.grpc_url = http_url, grpc_url
        host, port = http_url.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.conn.request("GET", "/v2/health/live")
        self.conn.getresponse().read()
        self.channel = grpc.insecure_channel(grpc_url)
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.seed = 0

    def infer(self, protocol: str, model: str) -> tuple[float, bool, str]:
        """One add_sub inference: (seconds as the client saw them, answer right, error)."""
        self.seed += 1
        if protocol == "http":
            began = time.perf_counter()
            a = http_infer(self.http_url, model, self.seed, conn=self.conn)
            took = time.perf_counter() - began
            return took, a.right, "" if a.right else f"HTTP {a.status}: {a.error[:200]}"
        began = time.perf_counter()
        g = grpc_infer(self.grpc_url, model, self.seed, timeout=120, channel=self.channel)
        took = time.perf_counter() - began
        return took, g.right, "" if g.right else f"{g.code}: {g.details[:200]}"

    def close(self) -> None:
        self.conn.close()
        self.channel.close()


def start_gateway(cfg: dict[str, Any], work: Path, name: str) -> GatewayProcess:
    gw = GatewayProcess(cfg, work, name)
    gw.start(timeout=60)

    def live() -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", gw.ports["http"], timeout=2)
        try:
            conn.request("GET", "/v2/health/live")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    wait_for(live, timeout=30, what=f"{name} live")
    return gw


# ------------------------------------------------------------------------------------- part 1: first


def direct_load(fleet: Fleet, server: TritonServer, model: str, transport: str, gw: GatewayProcess | None,
                client: Client, protocol: str) -> dict[str, Any]:
    """Triton's own load time for ``model`` on ``server`` and its first inference there straight
    after (what a client of Triton itself pays); then unloaded and waited out."""
    mark = fleet.mark()
    seconds = server.load_model(model, transport=transport, timeout=120)
    infer_s, ok, err = client.infer(protocol, model)
    server_s = triton_infer_s(server, model)
    logged = triton_log_load_s(fleet, mark, model)
    server.unload_model(model, timeout=10)
    waited = wait_unloaded(fleet, gw, model)
    return {"load_s": seconds, "first_infer_s": infer_s, "infer_ok": ok, "infer_error": err,
            "triton_infer_s": server_s, "triton_log_load_s": logged, "unload_wait_s": waited}


def gateway_first(fleet: Fleet, gw: GatewayProcess, client: Client, model: str, protocol: str, *,
                  unload: bool = True) -> dict[str, Any]:
    """The first inference for ``model`` (ready nowhere) through ``gw``, then a warm one."""
    assert not any(model in (index_states(s) or {}) for s in fleet), f"{model} is loaded somewhere"
    m0 = metric_values(gw, GW_METRICS)
    mark = fleet.mark()
    first_s, ok, err = client.infer(protocol, model)
    where = [name for name, states in fleet.states().items() if states and states.get(model) == "READY"]
    server_s = triton_infer_s(fleet[where[0]], model) if len(where) == 1 else None
    warm_s, warm_ok, warm_err = client.infer(protocol, model)
    m1 = metric_values(gw, GW_METRICS)
    row = {
        "first_s": first_s, "ok": ok, "error": err, "warm_s": warm_s, "warm_ok": warm_ok, "warm_error": warm_err,
        "triton_infer_s": server_s,
        "loaded_on": where, "triton_log_load_s": triton_log_load_s(fleet, mark, model),
        "gw_loads": m1[M_LOAD_COUNT] - m0[M_LOAD_COUNT],
        "gw_load_s": (m1[M_LOAD_SUM] - m0[M_LOAD_SUM]) if m1[M_LOAD_COUNT] > m0[M_LOAD_COUNT] else None,
        "gw_hold_s": m1[M_HOLD_SUM] - m0[M_HOLD_SUM],
        "gw_unloads": m1[M_EVICT] - m0[M_EVICT],
    }
    if unload:
        unload_everywhere(fleet, model)
        row["unload_wait_s"] = wait_unloaded(fleet, gw, model)
    return row


def warm_repository(fleet: Fleet, models: list[str]) -> None:
    """Load every model once (spread over the Tritons) and unload it: __pycache__ written in the shared
    repository, every Triton's Python backend started once; none of it timed."""
    servers = list(fleet)
    for i, model in enumerate(models):
        servers[i % len(servers)].load_model(model, transport="grpc", timeout=120)
    for i, model in enumerate(models):
        servers[i % len(servers)].unload_model(model, timeout=10)
    for model in models:
        wait_for(functools.partial(gone_from_tritons, fleet, model), timeout=60, what=f"{model} unloaded (warm-up)")


def part_first(args: argparse.Namespace, work: Path, doc: dict[str, Any], save) -> None:
    groups = group_names(args.delay_list, args.models)
    repo = build_repository(work, groups)
    all_models = [m for names in groups.values() for m in names]
    log(f"first: {args.tritons} Tritons on {repo} ({len(all_models)} models)")
    with Fleet(repo, work / "fleet", args.tritons) as fleet:
        doc["meta"]["triton_version"] = triton_version(fleet[0])
        warm_repository(fleet, all_models)
        for pool_protocol in args.pool_protocol_list:
            urls = fleet.urls(pool_protocol)
            pool = {"protocol": pool_protocol, "endpoints": urls,
                    "placement": {"capacity_models": BIG_CAPACITY}}
            cfg = gateway_config({"pool": pool}, [{"model": "*", "backend": "pool"}], health=dict(FIRST_HEALTH))
            gw = start_gateway(cfg, work, f"gw-first-{pool_protocol}")
            client = Client(gw.http_url, gw.grpc_url)
            direct = {name: Client(srv.http_url, srv.grpc_url) for name, srv in zip(fleet.names, fleet.servers)}
            try:
                k = 0
                deadline = time.monotonic() + args.part_timeout
                # One client protocol after the other over all the models: the gateway's next load of a
                # model comes a whole pass after its last (placement.py treats a model it loaded less
                # than 10 s ago as still there, even when its server has unloaded it since).
                for protocol in args.client_list:
                    for delay, names in groups.items():
                        for model in names:
                            if time.monotonic() > deadline:
                                log(f"  first: --part-timeout {args.part_timeout:g} s reached; stopping")
                                doc["notes"].append(f"first ({pool_protocol} pool): stopped at --part-timeout")
                                raise _Stop
                            first_name = rank(model, urls)[0]
                            name = fleet.name_of(first_name)
                            server = fleet[name]
                            # the order flips every pair, independently of the client's protocol
                            direct_first = (k + k // 2) % 2 == 0
                            if direct_first:
                                d = direct_load(fleet, server, model, pool_protocol, gw, direct[name], protocol)
                                g = gateway_first(fleet, gw, client, model, protocol)
                            else:
                                g = gateway_first(fleet, gw, client, model, protocol)
                                d = direct_load(fleet, server, model, pool_protocol, gw, direct[name], protocol)
                            row = {"part": "first", "pool": pool_protocol, "client": protocol, "model": model,
                                   "delay_s": delay, "tritons": len(urls), "expected_on": name,
                                   "order": "direct,gateway" if direct_first else "gateway,direct",
                                   "direct": d, "gateway": g}
                            doc["pairs"].append(row)
                            k += 1
                            log_pair(row)
                            save()
            except _Stop:
                pass
            finally:
                client.close()
                for c in direct.values():
                    c.close()
                gw.stop()
                keep_log(gw, work, doc)
            fleet.reset()


def log_pair(row: dict[str, Any]) -> None:
    d, g = row["direct"], row["gateway"]
    where = "" if row["part"] != "first" or g["loaded_on"] == [row["expected_on"]] else f"  loaded on {g['loaded_on']}"
    what = (f"{row['pool']} pool, {row['client']:4s} client, {row['model']}" if row["part"] == "first"
            else f"{row['client']:4s} client, {row['evicted']} -> {row['model']}")
    log(f"  {row['part']} {what} ({row['delay_s']:g} s): Triton load {d['load_s'] * 1000:7.1f} + first infer "
        f"{d['first_infer_s'] * 1000:5.1f} ms; gateway first request {g['first_s'] * 1000:7.1f} ms "
        f"(+{(g['first_s'] - d['load_s'] - d['first_infer_s']) * 1000:6.1f}), warm {g['warm_s'] * 1000:5.1f} ms"
        f"{'' if g['ok'] else '  ERROR ' + g['error']}{'' if d['infer_ok'] else '  DIRECT ERROR ' + d['infer_error']}"
        f"{where}")


def keep_log(gw: GatewayProcess, work: Path, doc: dict[str, Any]) -> None:
    """Gateway log lines at WARNING or above (for the report); the file itself stays in the scratch dir."""
    try:
        lines = gw.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return
    bad = [ln for ln in lines if any(w in ln for w in ("WARNING", "ERROR", "Traceback", "CRITICAL"))]
    doc["gateway_logs"][gw.log_path.name] = {"lines": len(lines), "warnings": bad[:50], "warnings_total": len(bad)}


# ------------------------------------------------------------------------------------- part 2: evict


def part_evict(args: argparse.Namespace, work: Path, doc: dict[str, Any], save) -> None:
    groups = group_names(args.delay_list, max(args.models, args.evict_models))
    picked = {d: names[: args.evict_models] for d, names in groups.items()}
    repo = build_repository(work, picked)
    sequence = [m for names in picked.values() for m in names]
    delay_of = {m: d for d, names in picked.items() for m in names}
    log(f"evict: 1 Triton, capacity 1, models {sequence}")
    with Fleet(repo, work / "fleet-evict", 1) as fleet:
        if "triton_version" not in doc["meta"]:
            doc["meta"]["triton_version"] = triton_version(fleet[0])
        warm_repository(fleet, sequence)
        pool_protocol = args.pool_protocol_list[0]
        server = fleet[0]
        pool = {"protocol": pool_protocol, "endpoints": fleet.urls(pool_protocol),
                "placement": {"capacity_models": 1, "min_residency_s": 0}}
        cfg = gateway_config({"pool": pool}, [{"model": "*", "backend": "pool"}], health=dict(FIRST_HEALTH))
        gw = start_gateway(cfg, work, "gw-evict")
        client = Client(gw.http_url, gw.grpc_url)
        direct = Client(server.http_url, server.grpc_url)
        try:
            prev = sequence[0]
            _, ok, err = client.infer("grpc", prev)  # fills the endpoint: not counted
            if not ok:
                raise RuntimeError(f"the first model of the eviction chain failed: {err}")
            deadline = time.monotonic() + args.part_timeout
            for k, model in enumerate(sequence[1:]):
                if time.monotonic() > deadline:
                    doc["notes"].append("evict: stopped at --part-timeout")
                    break
                protocol = args.client_list[k % len(args.client_list)]
                # Triton's own load while the previous model is resident (the endpoint as the gateway finds it)
                d = direct_load(fleet, server, model, pool_protocol, gw, direct, protocol)
                g = gateway_first(fleet, gw, client, model, protocol, unload=False)
                # the evicted model's unload runs to its end before the next pair
                began = time.monotonic()
                wait_for(functools.partial(holds_only, server, model), timeout=30,
                         what=f"{server} holding {model} alone")
                time.sleep(FIRST_HEALTH["timeout_s"] + 0.1)
                wait_for(functools.partial(gateway_lost, gw, prev), timeout=30,
                         what=f"the gateway seeing {prev} evicted")
                g["unload_wait_s"] = time.monotonic() - began
                row = {"part": "evict", "pool": pool_protocol, "client": protocol, "model": model,
                       "delay_s": delay_of[model], "evicted": prev, "tritons": 1, "order": "direct,gateway",
                       "direct": d, "gateway": g}
                doc["pairs"].append(row)
                log_pair(row)
                save()
                prev = model
        finally:
            client.close()
            direct.close()
            gw.stop()
            keep_log(gw, work, doc)


# ------------------------------------------------------------------------------------- part 3: steady


def part_steady(args: argparse.Namespace, work: Path, doc: dict[str, Any], save) -> None:
    ensure_tools(False, ("h2load",))
    names = args.workload_list
    bodies = write_bodies(names, work / "bodies")
    model = "add_sub"
    triton = TritonServer(MODEL_REPOSITORY, startup_models=())
    triton.start(work / "triton-steady")
    gws: list[GatewayProcess] = []
    try:
        if "triton_version" not in doc["meta"]:
            doc["meta"]["triton_version"] = triton_version(triton)
        url = triton.grpc_url if args.steady_pool == "grpc" else triton.http_url
        plain = {"protocol": args.steady_pool, "endpoints": [url], "timeout_s": 300}
        placed = {**plain, "placement": {"capacity_models": BIG_CAPACITY}}
        targets: dict[str, Target] = {}
        for label, backend in (("off", plain), ("on", placed)):
            cfg = gateway_config({"pool": backend}, [{"model": model, "backend": "pool"}])
            cfg.pop("health", None)  # the gateway's own defaults, alike for both
            gw = start_gateway(cfg, work, f"gw-steady-{label}")
            gws.append(gw)
            assert gw.proc is not None
            targets[label] = Target(label, gw.http_url, gw.grpc_url, gw.proc.pid)
        # add_sub placed by a first request through the placement gateway
        client = Client(gws[1].http_url, gws[1].grpc_url)
        try:
            first_s, ok, err = client.infer("grpc", model)
        finally:
            client.close()
        doc["steady_first"] = {"model": model, "first_s": first_s, "ok": ok, "error": err}
        log(f"steady: add_sub placed by a first request in {first_s * 1000:.0f} ms{'' if ok else ' ERROR ' + err}")
        for name in names:
            wl = WORKLOADS[name]
            body, headers = bodies[name]
            for t in targets.values():
                hp = t.grpc_url if wl.protocol == "grpc" else t.http_url
                why = wait_verified(wl, hp, body, headers)
                if why:
                    raise RuntimeError(f"{name} via placement {t.name}: verification failed: {why}")
        quiet_left = args.quiet_budget
        for name in names:
            wl = WORKLOADS[name]
            body, headers = bodies[name]
            for c in args.concurrency_list:
                for t in targets.values():
                    if args.warmup > 0:
                        measure(wl, t, triton.pid, body, headers, concurrency=c, duration=args.warmup, loadgen="h2load")
                for r in range(args.rounds):
                    order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
                    quiet_left -= wait_quiet([triton.pid, *(t.pid for t in targets.values())], quiet_left)
                    for label in order:
                        row = measure(wl, targets[label], triton.pid, body, headers, concurrency=c,
                                      duration=args.duration, loadgen="h2load")
                        row.update(part="steady", workload=name, concurrency=c, round=r, placement=label,
                                   quiet_budget_left_s=quiet_left)
                        doc["runs"].append(row)
                        log(f"  steady {name:16s} c={c:<3d} r{r} placement {label:3s} {row['rps']:8.1f} req/s  "
                            f"p50 {row['p50_us'] / 1000:6.2f} ms  {row['cpu_us_per_req']:6.1f} µs CPU/req  "
                            f"foreign {row['foreign_cpu_frac'] * 100:4.1f} %"
                            f"{'  ERROR ' + row['error'][:200] if row['error'] else ''}")
                        save()
    finally:
        for gw in gws:
            gw.stop()
            keep_log(gw, work, doc)
        triton.stop()


def wait_quiet(pids: list[int | None], budget: float, *, busy: float = 0.10, window: float = 0.5) -> float:
    """Before a round: wait (at most ``budget`` s) until the rest of the machine — everything but
    ``pids``' trees and this harness — uses less than ``busy`` of it over ``window``. Another user of
    the machine changes CPU per request (a starved gateway batches more at c = 16); this keeps the
    rounds where it can. Returns the seconds waited."""
    began = time.monotonic()
    cores = os.cpu_count() or 1
    while True:
        t0, sys0, own0 = time.monotonic(), system_busy_seconds(), _own_cpu()
        ours0 = sum(cpu_seconds(p) for p in pids if p is not None)
        time.sleep(window)
        wall = time.monotonic() - t0
        ours = sum(cpu_seconds(p) for p in pids if p is not None) - ours0
        other = (system_busy_seconds() - sys0) - ours - (_own_cpu() - own0)
        if other / wall / cores < busy or time.monotonic() - began + window > budget:
            return time.monotonic() - began


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def wait_verified(wl: Any, host_port: str, body: Path, headers: Any, timeout: float = 30.0) -> str:
    """verify() until it passes (the plain gateway sees add_sub ready at its next health round)."""
    deadline = time.monotonic() + timeout
    why = verify(wl, host_port, body, headers)
    while why and time.monotonic() < deadline:
        time.sleep(0.25)
        why = verify(wl, host_port, body, headers)
    return why


# ------------------------------------------------------------------------------------- part 4: count


def _canned_triton() -> Any:
    """benchmarks/inproc_grpc.py's canned gRPC backend (every ModelInfer answered with add_sub's
    bytes) that also answers ServerMetadata (Triton) and RepositoryIndex (add_sub READY): enough for
    a placement pool to see add_sub ready and route to it."""
    import grpc
    from tritonclient.grpc import service_pb2 as spb

    from .inproc_grpc import _Backend

    backend = _Backend()
    index = spb.RepositoryIndexResponse()
    entry = index.models.add()
    entry.name, entry.version, entry.state = "add_sub", "1", "READY"
    index_bytes = index.SerializeToString()
    meta = spb.ServerMetadataResponse(name="triton", version="2.51.0").SerializeToString()

    async def repository_index(request: bytes, context: Any) -> bytes:
        return index_bytes

    async def server_metadata(request: bytes, context: Any) -> bytes:
        return meta

    svc = "/inference.GRPCInferenceService/"
    backend.handlers[svc + "RepositoryIndex"] = grpc.unary_unary_rpc_method_handler(repository_index)
    backend.handlers[svc + "ServerMetadata"] = grpc.unary_unary_rpc_method_handler(server_metadata)
    return backend


async def _count_child(side: str, protocol: str, concurrency: int, requests: int) -> None:
    """One side of the instruction count, in this process: ``off`` / ``on`` through a gateway (a plain
    grpc pool, or a placement pool) to the canned backend, ``direct`` the client against a canned
    backend of its own protocol; 50 requests of warm-up, the start-up heap frozen out of the garbage
    collector (as benchmarks/inproc.py), then ``requests`` requests."""
    import gc

    from gateway.config.loader import parse_config
    from gateway.server import Gateway

    from . import inproc, inproc_grpc
    from .workloads import _grpc_small

    backend, backend_port = await inproc_grpc._server(_canned_triton())
    gateway = None
    http_server = None
    if side in ("off", "on"):
        pool: dict[str, Any] = {"protocol": "grpc", "endpoints": [f"127.0.0.1:{backend_port}"], "timeout_s": 300}
        if side == "on":
            pool["placement"] = {"capacity_models": BIG_CAPACITY}
        config = parse_config({
            "listen": {"http": "127.0.0.1:0", "grpc": "127.0.0.1:0", "metrics": None},
            "backends": {"pool": pool}, "routes": [{"model": "add_sub", "backend": "pool"}],
            "health": {"interval_s": 5.0, "timeout_s": 2.0},
        })
        gateway = Gateway(config)
        ports = await gateway.start()
        assert ports.grpc is not None and ports.http is not None
        gw_grpc, gw_http = ports.grpc, ports.http
    if protocol == "grpc":
        port = backend_port if gateway is None else gw_grpc
        message = _grpc_small()[5:]

        async def run(n: int) -> None:
            await inproc_grpc._run(port, message, n, concurrency)
    else:
        if gateway is None:
            loop = asyncio.get_running_loop()
            answer = inproc._answer("small")
            http_server = await loop.create_server(lambda: inproc.Backend(answer), "127.0.0.1", 0)
            port = http_server.sockets[0].getsockname()[1]
        else:
            port = gw_http
        body, headers = inproc._request_body("small")
        request = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%sContent-Length: %d\r\n\r\n"
                   % (port, headers, len(body))) + body

        async def run(n: int) -> None:
            await inproc._run(port, request, n, concurrency)

    await run(50)
    gc.collect()
    gc.freeze()
    await run(requests)
    if gateway is not None:
        await gateway.stop()
    if http_server is not None:
        http_server.close()
    await backend.stop(None)


def _callgrind(side: str, protocol: str, concurrency: int, requests: int) -> int:
    from gateway.grpcengine import unchosen

    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
           "benchmarks.placement", "--count-child", f"{side},{protocol},{concurrency},{requests}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=unchosen(dict(os.environ)), capture_output=True, text=True, timeout=1800)
    found = re.findall(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{proc.stdout[-1000:]}")
    return int(found[-1])


def part_count(args: argparse.Namespace, work: Path, doc: dict[str, Any], save) -> None:
    """Instructions per request (callgrind: not timed, so not moved by the machine's noise) through a
    gateway with placement off and on, and direct; each side at two request counts, the difference
    over the difference of requests (benchmarks/instructions.py's method)."""
    if shutil.which("valgrind") is None:
        doc["notes"].append("count: valgrind not installed (Debian valgrind): skipped")
        log("count: valgrind not installed: skipped")
        return
    low, high = args.count_request_pair
    for protocol in args.count_protocol_list:
        for c in args.count_concurrency_list:
            row: dict[str, Any] = {"part": "count", "protocol": protocol, "concurrency": c, "requests": [low, high]}
            for side in ("off", "on", "direct"):
                with ThreadPoolExecutor(2) as pool:
                    a, b = pool.map(_callgrind, (side, side), (protocol, protocol), (c, c), (low, high))
                row[side] = (b - a) / (high - low)
            doc["counts"].append(row)
            log(f"  count {protocol} c={c}: instructions per request off {row['off']:,.0f}, on {row['on']:,.0f}, "
                f"direct {row['direct']:,.0f}; placement {row['on'] - row['off']:+,.0f} "
                f"({(row['on'] - row['direct']) / (row['off'] - row['direct']):.4f} of the gateway's)")
            save()


# ------------------------------------------------------------------------------------- summary


def _pct(values: list[float], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vals:
        return None
    pos = (len(vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict[str, Any]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"n": 0}
    return {"n": len(vals), "median": median(vals), "min": min(vals), "max": max(vals),
            "p25": _pct(vals, 0.25), "p75": _pct(vals, 0.75)}


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"first": [], "steady": []}
    cells: dict[tuple, list[dict]] = {}
    for p in doc["pairs"]:
        cells.setdefault((p["part"], p["pool"], p["client"], p["delay_s"]), []).append(p)
    for (part, pool, client, delay), rows in sorted(cells.items(), key=lambda kv: (kv[0][0] != "first", *kv[0][1:])):
        good = [p for p in rows if p["gateway"]["ok"] and p["direct"]["infer_ok"]]
        load = [p["direct"]["load_s"] for p in good]
        direct = [p["direct"]["load_s"] + p["direct"]["first_infer_s"] for p in good]
        first = [p["gateway"]["first_s"] for p in good]
        g_load = [(p["gateway"]["first_s"], p["gateway"]["gw_load_s"]) for p in good
                  if p["gateway"]["gw_load_s"] is not None]
        out["first"].append({
            "part": part, "pool": pool, "client": client, "delay_s": delay, "pairs": len(rows),
            "failed": len(rows) - len(good),
            "triton_load_s": _stats(load),
            "triton_first_infer_s": _stats([p["direct"]["first_infer_s"] for p in good]),
            "first_s": _stats(first),
            # what the gateway adds: its first request against Triton's load + first inference, per pair
            "overhead_s": _stats([f - d for f, d in zip(first, direct)]),
            "ratio": _stats([f / d for f, d in zip(first, direct) if d > 0]),
            "overhead_vs_load_s": _stats([f - ld for f, ld in zip(first, load)]),
            "ratio_vs_load": _stats([f / ld for f, ld in zip(first, load) if ld > 0]),
            "warm_s": _stats([p["gateway"]["warm_s"] for p in good]),
            "gw_load_s": _stats([gl for _, gl in g_load]),
            "outside_load_s": _stats([f - gl for f, gl in g_load]),
            "gw_load_minus_triton_s": _stats([p["gateway"]["gw_load_s"] - p["direct"]["load_s"] for p in good
                                              if p["gateway"]["gw_load_s"] is not None]),
            "hold_s": _stats([p["gateway"]["gw_hold_s"] for p in good]),
            # the request's hold beyond Triton's own loading of the model (its log): deciding, sending the
            # load, learning it is done, waking the request (and, evicting, the unload before it)
            "hold_beyond_load_s": _stats([p["gateway"]["gw_hold_s"] - p["gateway"]["triton_log_load_s"] for p in good
                                          if p["gateway"]["triton_log_load_s"] is not None]),
            # after the hold: the inference through the gateway, Triton's first inference of the model included
            "after_hold_s": _stats([p["gateway"]["first_s"] - p["gateway"]["gw_hold_s"] for p in good]),
            "triton_infer_gateway_s": _stats([p["gateway"]["triton_infer_s"] for p in good
                                              if p["gateway"]["triton_infer_s"] is not None]),
            "triton_infer_direct_s": _stats([p["direct"]["triton_infer_s"] for p in good
                                             if p["direct"]["triton_infer_s"] is not None]),
            "triton_log_direct_s": _stats([p["direct"]["triton_log_load_s"] for p in good]),
            "triton_log_gateway_s": _stats([p["gateway"]["triton_log_load_s"] for p in good]),
            "loads": sum(p["gateway"]["gw_loads"] for p in rows),
            "evictions": sum(p["gateway"]["gw_unloads"] for p in rows),
            "misplaced": sum(1 for p in rows
                             if p["part"] == "first" and p["gateway"]["loaded_on"] != [p["expected_on"]]),
        })
    runs = [r for r in doc["runs"] if r.get("part") == "steady"]
    keys = sorted({(r["workload"], r["concurrency"]) for r in runs}, key=lambda k: (k[0], k[1]))
    for wl, c in keys:
        by = {(r["round"], r["placement"]): r for r in runs if r["workload"] == wl and r["concurrency"] == c}
        rounds = sorted({r for r, _ in by})
        pairs = [(by[(r, "off")], by[(r, "on")]) for r in rounds if (r, "off") in by and (r, "on") in by]
        ok = [(a, b) for a, b in pairs
              if not a["error"] and not b["error"] and a["cpu_us_per_req"] and b["cpu_us_per_req"]]
        cpu_ratio = _stats([b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in ok])
        # rounds in which neither run shared the machine with more than QUIET of other work
        quiet = [(a, b) for a, b in ok if max(a["foreign_cpu_frac"], b["foreign_cpu_frac"]) < QUIET]

        def pooled(rows: list[dict[str, Any]]) -> float | None:
            """All the rounds' gateway CPU over all their requests (steady windows)."""
            n = sum(max(r["requests"] - 1, 1) for r in rows)
            return sum(r["proxy_cpu_s"] for r in rows) / n * 1e6 if n else None

        p_off, p_on = pooled([a for a, _ in ok]), pooled([b for _, b in ok])
        out["steady"].append({
            "workload": wl, "concurrency": c, "rounds": len(ok),
            "cpu_off_us": _stats([a["cpu_us_per_req"] for a, _ in ok]),
            "cpu_on_us": _stats([b["cpu_us_per_req"] for _, b in ok]),
            "cpu_ratio": cpu_ratio,
            "cpu_pooled_off_us": p_off, "cpu_pooled_on_us": p_on,
            "cpu_pooled_ratio": p_on / p_off if p_on and p_off else None,
            "cpu_ratio_quiet": _stats([b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in quiet]),
            "rps_off": _stats([a["rps"] for a, _ in ok]), "rps_on": _stats([b["rps"] for _, b in ok]),
            "rps_ratio": _stats([b["rps"] / a["rps"] for a, b in ok if a["rps"]]),
            "p50_off_us": _stats([a["p50_us"] for a, _ in ok]), "p50_on_us": _stats([b["p50_us"] for _, b in ok]),
            "foreign": _stats([x["foreign_cpu_frac"] for pair in ok for x in pair]),
            "failed": sum(a["failed"] + b["failed"] for a, b in pairs),
            "meets_target": None if not cpu_ratio.get("n") else cpu_ratio["median"] <= TARGET_RATIO,
        })
    return out


# ------------------------------------------------------------------------------------- report


def _ms(s: dict[str, Any], key: str = "median") -> str:
    v = s.get(key) if s.get("n") else None
    return "–" if v is None else f"{v * 1000:.0f}" if abs(v) >= 0.1 else f"{v * 1000:.1f}"


def _spread_ms(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "–"
    return f"{_ms(s)} ({_ms(s, 'min')}–{_ms(s, 'max')})"


def _x(s: dict[str, Any], digits: int = 3) -> str:
    if not s.get("n"):
        return "–"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def report(doc: dict[str, Any]) -> str:
    meta, summ = doc["meta"], doc["summary"]
    m = meta.get("machine", {})
    lines = [f"# Placement benchmark ({meta['date']})", "",
             f"Run {meta['started']} on {m.get('cpus')} × {m.get('cpu')}, {m.get('memory_gb')} GB RAM, "
             f"Linux {m.get('kernel')}, Python {m.get('python')}, grpcio {m.get('packages', {}).get('grpcio')}, "
             f"Triton {meta.get('triton_version', '?')} "
             f"(nvidia-pytriton {m.get('packages', {}).get('nvidia-pytriton')}), "
             f"{m.get('h2load', '')}; commit {meta['commit']}{' (uncommitted changes)' if meta.get('dirty') else ''}; "
             f"`{meta['command']}` ({meta.get('total_s', 0) / 60:.1f} min).", ""]
    for m in meta.get("merged", []):
        lines += [f"Part(s) {', '.join(m['parts'])} from a later run: {m['started']}, commit {m['commit']}"
                  f"{' (uncommitted changes)' if m.get('dirty') else ''}, `{m['command']}`.", ""]
    if meta.get("note"):
        lines += [f"Note: {meta['note']}", ""]
    first = [r for r in summ["first"] if r["part"] == "first"]
    evict = [r for r in summ["first"] if r["part"] == "evict"]
    head = ("| pool | client | load delay | pairs | Triton: load + first inference ms | gateway: first request ms | "
            "overhead ms | first ÷ Triton | hold − Triton's load ms | after the hold ms (Triton's part) | "
            "warm request ms |")
    rule = "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"

    def row(r: dict[str, Any]) -> str:
        fail = f" ({r['failed']} failed)" if r["failed"] else ""
        return (f"| {r['pool']} | {r['client']} | {r['delay_s']:g} s | {r['pairs']}{fail} | "
                f"{_ms(r['triton_load_s'])} + {_ms(r['triton_first_infer_s'])} | {_spread_ms(r['first_s'])} | "
                f"{_spread_ms(r['overhead_s'])} | {_x(r['ratio'], 3)} | {_spread_ms(r['hold_beyond_load_s'])} | "
                f"{_ms(r['after_hold_s'])} ({_ms(r['triton_infer_gateway_s'])}) | {_ms(r['warm_s'])} |")

    if first:
        tritons = sorted({p["tritons"] for p in doc["pairs"] if p["part"] == "first"})
        lines += ["## First request for an unloaded model", "",
                  f"Placement pool of {', '.join(map(str, tritons))} Triton(s) (capacity {BIG_CAPACITY}: no eviction); "
                  "each pair: Triton's own load of the model (the repository load sent straight to the Triton its "
                  "hash order picks, over the pool's protocol) and the first inference through the gateway, in "
                  "alternating order. Medians (min–max) over the pairs.", "", head, rule]
        lines += [row(r) for r in first]
        lines.append("")
    if evict:
        lines += ["## First request that must evict first", "",
                  "Pool of 1 Triton, capacity_models 1, min_residency_s 0: every first request unloads the model "
                  "before it, then loads its own. Triton's load: straight to the Triton while the previous model "
                  "is resident.", "", head, rule]
        lines += [row(r) for r in evict]
        lines.append("")
    if first or evict:
        lines += ["Triton: its own load time (the repository load sent straight to it, answered when the model is "
                  "READY) + its first inference right after, from the same client protocol (what a client of Triton "
                  "itself waits). overhead = the gateway's first request − that, pair by pair (it carries the "
                  "difference between two loads of the model by Triton: read the median); first ÷ Triton likewise. "
                  "hold − Triton's load: how long the request was held (`oip_gateway_hold_seconds`) beyond the load "
                  "as Triton's log times it (\"loading\" → \"successfully loaded\"): the gateway's own part of the "
                  "wait — deciding, sending the load, learning it is done, waking the request, and when evicting the "
                  "statistics read and the unload first. after the hold: the rest of the first request — the "
                  "inference through the gateway — with, in brackets, Triton's own time for it (its statistics: "
                  "the first inference of a freshly loaded Python model costs Triton tens of ms). warm request: the "
                  "second inference, right after.", ""]
        tl = [r for r in summ["first"] if r["triton_log_direct_s"].get("n")]
        if tl:
            lines += ["Triton's own log (\"loading\" → \"successfully loaded\"), median ms, direct / through the "
                      "gateway: " + "; ".join(
                          f"{r['part']} {r['pool']}/{r['client']} {r['delay_s']:g} s: "
                          f"{_ms(r['triton_log_direct_s'])} / {_ms(r['triton_log_gateway_s'])}" for r in tl) + ".", ""]
    if summ["steady"]:
        lines += ["## Steady state: placement on against off", "",
                  f"One Triton, add_sub loaded; a 1-process gateway with add_sub routed to a plain "
                  f"`{meta['args'].get('steady_pool', 'grpc')}` pool (off) or to the same endpoint as a placement pool "
                  f"(on); h2load closed loop, {meta['args'].get('duration')} s per run, {meta['args'].get('rounds')} "
                  "rounds alternating off/on. Gateway CPU per request from /proc; ratios within a round, median "
                  "(min–max) over rounds.", "",
                  "| workload | c | rounds | CPU off µs/req | CPU on µs/req | CPU on ÷ off | ≤ 1.05 | quiet rounds: "
                  "on ÷ off | all rounds pooled: on ÷ off | req/s off | req/s on | p50 off / on ms | foreign CPU |",
                  "|---|--:|--:|--:|--:|--:|:-:|--:|--:|--:|--:|--:|--:|"]
        for s in summ["steady"]:
            ok = "–" if s["meets_target"] is None else ("yes" if s["meets_target"] else "**no**")
            fail = f" ({s['failed']} failed)" if s["failed"] else ""
            q = s.get("cpu_ratio_quiet", {"n": 0})
            quiet = f"{_x(q)}, {q['n']} rounds" if q.get("n") else "none"
            pooled = s.get("cpu_pooled_ratio")
            lines.append(
                f"| {s['workload']} | {s['concurrency']} | {s['rounds']}{fail} | {s['cpu_off_us']['median']:.1f} | "
                f"{s['cpu_on_us']['median']:.1f} | {_x(s['cpu_ratio'])} | {ok} | {quiet} | "
                f"{'–' if pooled is None else f'{pooled:.3f}'} | {s['rps_off']['median']:.0f} | "
                f"{s['rps_on']['median']:.0f} | "
                f"{s['p50_off_us']['median'] / 1000:.2f} / {s['p50_on_us']['median'] / 1000:.2f} | "
                f"{s['foreign']['median'] * 100:.1f} % |")
        lines += ["", "CPU on ÷ off: per round, then the median (min–max) over rounds; ≤ 1.05 judges that median. "
                  f"quiet rounds: only the rounds in which other processes used less than {QUIET:.0%} of the machine "
                  "during both runs. pooled: all rounds' gateway CPU over all their requests, on against off. "
                  "foreign CPU: the machine's CPU used by anything but the gateway, Triton, h2load and this harness "
                  "during the runs (median, as a fraction of all cores): another user of the machine. At c = 16 a "
                  "gateway that gets less CPU batches more requests per wake-up and spends less per request, so "
                  "the rounds move with the machine's other load; read the quiet rounds.", ""]
        for old in doc.get("superseded", []):
            if old["part"] == "steady" and old["summary"]:
                lines += [f"An earlier run of this part ({old['started']}, commit {old['commit']}): "
                          "CPU on ÷ off " + "; ".join(
                    f"{x['workload']} c={x['concurrency']} {_x(x['cpu_ratio'])}, pooled "
                    f"{x['cpu_pooled_ratio']:.3f}" for x in old["summary"] if x.get("cpu_pooled_ratio")) + ".", ""]
        if doc.get("steady_first"):
            sf = doc["steady_first"]
            lines += [f"add_sub was placed by a first request that took {sf['first_s'] * 1000:.0f} ms"
                      f"{'' if sf['ok'] else ' and failed: ' + sf['error']}.", ""]
    if doc.get("counts"):
        lines += ["## Instructions per request: placement on against off", "",
                  "The same comparison counted, not timed: a gateway (1 process, in-process with its client and a "
                  "canned gRPC backend that also answers RepositoryIndex) with add_sub routed to a plain grpc pool "
                  "(off) or to a placement pool (on), under `valgrind --tool=callgrind` at "
                  f"{doc['counts'][0]['requests'][0]} and {doc['counts'][0]['requests'][1]} requests; the difference "
                  "over the difference of requests (benchmarks/instructions.py's method). Two counts of one HTTP side "
                  "agree to ~0.2 %; gRPC sides move more (grpc's core threads run serialised under callgrind: "
                  "±0.5 % a side, a few thousand instructions here), so read the gRPC row's on − off to ±5,000.",
                  "", "| client | c | off | on | on − off | direct | gateway's own, off | gateway's own, on ÷ off |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for r in doc["counts"]:
            own_off, own_on = r["off"] - r["direct"], r["on"] - r["direct"]
            lines.append(f"| {r['protocol']} | {r['concurrency']} | {r['off']:,.0f} | {r['on']:,.0f} | "
                         f"{r['on'] - r['off']:+,.0f} | {r['direct']:,.0f} | {own_off:,.0f} | "
                         f"{own_on / own_off:.4f} |")
        lines += ["", "direct: the client against a canned backend of its own protocol (gRPC: the same canned "
                  "backend; HTTP: benchmarks/inproc.py's canned HTTP backend, so the HTTP rows' \"gateway's own\" "
                  "also holds the canned gRPC backend's instructions: their ratio understates a difference a little). "
                  "Instructions in user space only: no system calls' time, no cache misses.", ""]
    odd = []
    for p in doc["pairs"]:
        g = p["gateway"]
        if not g["ok"]:
            odd.append(f"{p['part']} {p['model']} ({p['client']}): {g['error']}")
        if p["part"] == "first" and g["loaded_on"] != [p["expected_on"]]:
            odd.append(f"{p['model']} loaded on {g['loaded_on']}, its hash order says {p['expected_on']}")
        if g["gw_loads"] != 1:
            odd.append(f"{p['part']} {p['model']}: {g['gw_loads']:g} loads counted for one first request")
        if p["part"] == "evict" and g["gw_unloads"] != 1:
            odd.append(f"evict {p['model']}: {g['gw_unloads']:g} evictions counted")
    for name, info in doc.get("gateway_logs", {}).items():
        if info["warnings_total"]:
            odd.append(f"{name}: {info['warnings_total']} warning/error lines, e.g. {info['warnings'][0][:200]}")
    odd += doc.get("notes", [])
    if odd:
        lines += ["## Seen", ""] + [f"- {o}" for o in odd[:40]] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- meta / main


def triton_version(server: TritonServer) -> str:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(server.http_url.rsplit(":", 1)[1]), timeout=5)
        conn.request("GET", "/v2")
        return str(json.loads(conn.getresponse().read()).get("version", "?"))
    except (OSError, ValueError, http.client.HTTPException):
        return "?"


def _sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def make_meta(args: argparse.Namespace) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    return {"date": now.strftime("%Y-%m-%d"), "started": now.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_info(), "commit": _sh("git", "rev-parse", "--short", "HEAD"),
            "dirty": bool(_sh("git", "status", "--porcelain", "--untracked-files=no")),
            "command": "python -m benchmarks.placement " + " ".join(sys.argv[1:]),
            "note": args.note,
            "args": {k: v for k, v in vars(args).items() if not k.endswith("_list") and k != "report_from"}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", default="first,evict,steady",
                   help="comma list of first, evict, steady, count (count: under valgrind, ~5 min; not by default)")
    p.add_argument("--tritons", type=int, default=3, help="Tritons in the first-request pool (1-3 sensible here)")
    p.add_argument("--models", type=int, default=5, help="first: models per load delay")
    p.add_argument("--delays", default="0.5,2.0", help="first/evict: the models' load delays, seconds")
    p.add_argument("--pool-protocols", default="grpc", help="first: pool protocols (grpc, http); evict: the first")
    p.add_argument("--clients", default="http,grpc", help="first/evict: client protocols to the gateway")
    p.add_argument("--evict-models", type=int, default=3, help="evict: models per load delay in the chain")
    p.add_argument("--workloads", default="grpc_small,http_json_small", help="steady: benchmarks/workloads.py names")
    p.add_argument("--concurrency", default="1,16", help="steady: h2load connections")
    p.add_argument("--rounds", type=int, default=8, help="steady: off/on rounds per workload and concurrency")
    p.add_argument("--duration", type=float, default=2.5, help="steady: seconds per run")
    p.add_argument("--quiet-budget", type=float, default=60.0,
                   help="steady: seconds in all to wait for the rest of the machine to go quiet (< 10 %% busy) "
                        "before rounds (0: never wait)")
    p.add_argument("--warmup", type=float, default=1.0, help="steady: warm-up seconds per target (0: none)")
    p.add_argument("--steady-pool", default="grpc", choices=("grpc", "http"), help="steady: the pool's protocol")
    p.add_argument("--part-timeout", type=float, default=300.0, help="first/evict: no new pair after this long")
    p.add_argument("--count-protocols", default="grpc,http", help="count: client protocols (the pool is gRPC)")
    p.add_argument("--count-concurrency", default="1", help="count: concurrent requests in the counted runs")
    p.add_argument("--count-requests", default="300,1300", help="count: the two request counts")
    p.add_argument("--count-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true",
                   help="smoke: a pool of 2 Tritons, 2 models per delay (0.3 s, 1 s), a chain of 2 per delay, "
                        "2 rounds of 1 s")
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/<date>-placement)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    p.add_argument("--merge", action="store_true",
                   help="keep OUT/results.json's other parts: replace only the parts run now (e.g. --parts count)")
    p.add_argument("--note", default="", help="a line for the top of results.md")
    p.add_argument("--report-from", default=None, metavar="DIR", help="rewrite DIR/results.md from DIR/results.json")
    args = p.parse_args(argv)
    if args.quick:
        args.tritons, args.models, args.delays, args.evict_models = 2, 2, "0.3,1.0", 2
        args.rounds, args.duration, args.warmup = 2, 1.0, 0.5
        args.count_protocols, args.count_requests = "grpc", "100,300"
    args.part_list = [x.strip() for x in args.parts.split(",") if x.strip()]
    args.count_protocol_list = [x.strip() for x in args.count_protocols.split(",") if x.strip()]
    args.count_concurrency_list = [int(x) for x in args.count_concurrency.split(",") if x.strip()]
    args.count_request_pair = tuple(int(x) for x in args.count_requests.split(","))
    if len(args.count_request_pair) != 2 or not 0 < args.count_request_pair[0] < args.count_request_pair[1]:
        p.error("--count-requests: two counts, the first smaller")
    for part in args.part_list:
        if part not in ("first", "evict", "steady", "count"):
            p.error(f"--parts: unknown {part!r}")
    args.delay_list = [float(x) for x in args.delays.split(",") if x.strip()]
    args.pool_protocol_list = [x.strip() for x in args.pool_protocols.split(",") if x.strip()]
    args.client_list = [x.strip() for x in args.clients.split(",") if x.strip()]
    args.workload_list = [x.strip() for x in args.workloads.split(",") if x.strip()]
    args.concurrency_list = [int(x) for x in args.concurrency.split(",") if x.strip()]
    for x in args.pool_protocol_list + args.client_list:
        if x not in ("grpc", "http"):
            p.error(f"protocol must be grpc or http, not {x!r}")
    for w in args.workload_list:
        if w not in ("grpc_small", "http_json_small"):
            p.error(f"--workloads: only grpc_small and http_json_small are add_sub workloads, not {w!r}")
    if not 1 <= args.tritons <= 8 or args.models < 1 or args.rounds < 1 or args.evict_models < 2:
        p.error("--tritons 1..8, --models >= 1, --rounds >= 1, --evict-models >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.count_child is not None:
        import uvloop

        from gateway.config.schema import DEFAULT_MAX_MESSAGE_BYTES
        from gateway.malloc import tune_malloc

        side, protocol, c, n = args.count_child.split(",")
        tune_malloc(DEFAULT_MAX_MESSAGE_BYTES)  # the allocator as `oip-gateway serve` sets it up
        uvloop.run(_count_child(side, protocol, int(c), int(n)))
        return 0
    if args.report_from is not None:
        d = Path(args.report_from)
        old = json.loads((d / "results.json").read_text())
        if args.note:
            old["meta"]["note"] = args.note
        old["summary"] = summarise(old)
        (d / "results.json").write_text(json.dumps(old, indent=1))
        text = report(old)
        (d / "results.md").write_text(text + "\n")
        print(text)
        return 0
    reason = triton_available()
    if reason is not None:
        raise SystemExit(f"Triton cannot run here: {reason}")
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{date}-placement"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-placement-"))
    doc: dict[str, Any] = {"meta": make_meta(args), "pairs": [], "runs": [], "counts": [], "notes": [],
                           "gateway_logs": {}}
    merged: dict[str, Any] | None = None
    if args.merge and (out / "results.json").exists():
        # Another run's results, this run's parts replaced by what it measures now (``--merge``).
        merged, doc = doc, json.loads((out / "results.json").read_text())
        doc.setdefault("counts", [])
        if "first" in args.part_list or "evict" in args.part_list:
            doc["pairs"] = [p for p in doc["pairs"] if p["part"] not in args.part_list]
        if "steady" in args.part_list:
            if doc["runs"]:  # the replaced run's summary stays, with the commit it measured
                steady_runs = [m for m in doc["meta"].get("merged", []) if "steady" in m["parts"]]
                last = steady_runs[-1] if steady_runs else doc["meta"]
                doc.setdefault("superseded", []).append(
                    {"part": "steady", "commit": last["commit"], "started": last["started"],
                     "summary": (doc.get("summary") or {}).get("steady", [])})
            doc["runs"], doc["steady_first"] = [], None
        if "count" in args.part_list:
            doc["counts"] = []
        doc["meta"].setdefault("merged", []).append(
            {k: merged["meta"][k] for k in ("started", "commit", "dirty", "command")} | {"parts": args.part_list})
    started = time.monotonic()
    total0 = doc["meta"].get("total_s", 0.0) if merged is not None else 0.0

    def save() -> None:
        doc["meta"]["total_s"] = total0 + time.monotonic() - started
        (out / "results.json").write_text(json.dumps(doc, indent=1))

    try:
        for part, run in (("first", part_first), ("evict", part_evict), ("steady", part_steady),
                          ("count", part_count)):
            if part in args.part_list:
                t = time.monotonic()
                run(args, work, doc, save)
                doc["meta"][f"{part}_s"] = time.monotonic() - t
                save()
    finally:
        doc["summary"] = summarise(doc)
        save()
        text = report(doc)
        (out / "results.md").write_text(text + "\n")
        print(text)
        if args.keep:
            log(f"scratch kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out}/results.md, results.json ({doc['meta']['total_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
