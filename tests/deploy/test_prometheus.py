"""deploy/prometheus and deploy/grafana, checked by the real tools against a real gateway.

- ``promtool check rules`` (all lints fatal) and ``promtool test rules`` on the shipped files.
- A real Prometheus (Debian's package; tests/support/prometheus.py) scrapes a gateway every
  second. The gateway fronts the reference server with two backends — ``http`` (its HTTP port)
  and ``grpc`` (its gRPC port) — so both protocols meet both pass-through and conversion:

      route           backend   model on the backend    sent over HTTP / gRPC
      add_sub         http   yes                     1 + Load / 1 + Load   → 200 / OK
      identity_FP32   grpc   yes                     5 / 4                 → 200 / OK
      not_loaded_a    http   no (ready nowhere)      3 / -                 → 503
      not_loaded_b    grpc   no (ready nowhere)      - / 2                 → UNAVAILABLE
      (no route)      -      -                       2 / 3                 → 404 / NOT_FOUND

  Each missing model is sent over one protocol only, to the backend speaking it, so whether a
  conversion counts before or after the endpoint choice cannot change the expected counts.
  Requests go in two phases with a scrape between them (counters first seen by Prometheus
  already at their final value would have no increase: every rate would be 0). Then the
  config is reloaded once successfully (a string_reverse route is added) and once with an
  invalid file (refused).
- PromQL over the scraped series gives exactly the counts sent, per route, backend, protocol and
  code; the recording rules, loaded into that Prometheus, evaluate without errors and give
  the values the load implies; alerts that must be pending are, and none fires.
- Every expression of the dashboard (panel targets and variable queries) parses — a query
  that does not is an HTTP 400 from the API — and returns series, except those listed in
  MAY_BE_EMPTY with the reason.

Run: .venv/bin/python -m pytest tests/deploy/test_prometheus.py -q -p no:cacheprovider
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import GatewayProcess, ReferenceServer, gateway_config
from tests.support.load import Load
from tests.support.procs import wait_for
from tests.support.prometheus import PROMETHEUS, PROMTOOL, Prometheus, PromQLError, promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "oip-gateway.json"
JOB = "oip-gateway"

# Dashboard panels whose queries may rightly return nothing in this run, and why.
MAY_BE_EMPTY = {
    "Retries and ejections": "oip_gateway_backend_events_total has no series before a backend's first retry or "
                             "ejection, and every endpoint here stays healthy",
}
# Recording rules likewise.
RULES_MAY_BE_EMPTY = {
    "job_backend_event:oip_gateway_backend_events:rate5m": MAY_BE_EMPTY["Retries and ejections"],
}

# (transport, model, times, expected code). Phase 1 sends each row once, phase 2 the rest;
# add_sub also gets the Load of phase 2.
SENDS = [
    ("http", "add_sub", 1, "200"),
    ("grpc", "add_sub", 1, "OK"),
    ("http", "identity_FP32", 5, "200"),
    ("grpc", "identity_FP32", 4, "OK"),
    ("http", "not_loaded_a", 3, "503"),
    ("grpc", "not_loaded_b", 2, "UNAVAILABLE"),
    ("http", "no_such_model", 2, "404"),
    ("grpc", "no_such_model", 3, "NOT_FOUND"),
]
ROUTES = {"add_sub": "http", "identity_FP32": "grpc", "not_loaded_a": "http", "not_loaded_b": "grpc"}
ADDED_ROUTE = ("string_reverse", "grpc")  # by the successful reload
LOAD_REQUESTS = 200


def _unavailable(what: str, reason: str) -> None:
    """A skip on a developer machine, a failure in CI (scripts/test.sh sets CI)."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} must run in CI: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture(scope="module")
def tools() -> None:
    for path in (PROMETHEUS, PROMTOOL):
        if not os.access(path, os.X_OK):
            _unavailable("Prometheus", f"{path} missing: apt-get install --no-install-recommends prometheus")


# ------------------------------------------------------------------------------ the scenario


@dataclass
class Stack:
    gw: GatewayProcess
    prom: Prometheus
    reference: ReferenceServer
    expected: dict[tuple[str, str, str, str], int]  # (protocol, route, backend, code) -> requests
    exported: set[str] = field(default_factory=set)  # metric names the gateway exports or declares

    def require(self, metric: str) -> None:
        """Fail with a clear message, not an empty query result, when the gateway lacks ``metric``."""
        if metric not in self.exported:
            pytest.fail(f"the gateway does not export {metric}")


def _route_of(model: str) -> tuple[str, str]:
    backend = ROUTES.get(model)
    return (model, backend) if backend is not None else ("_unrouted", "")


def _send(transport: str, url: str, model: str) -> str:
    """One inference request with tritonclient; the HTTP status or gRPC code name it got."""
    from tritonclient.utils import InferenceServerException

    if transport == "http":
        import tritonclient.http as client
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]
    a = np.arange(4, dtype=np.float32)
    if model == "identity_FP32":
        arrays = {"INPUT0": a.reshape(1, 4)}
    else:
        arrays = {"INPUT0": a, "INPUT1": a}
    inputs = []
    for name, array in arrays.items():
        x = client.InferInput(name, list(array.shape), "FP32")
        x.set_data_from_numpy(array)
        inputs.append(x)
    try:
        with client.InferenceServerClient(url) as c:
            result = c.infer(model, inputs)
    except InferenceServerException as exc:
        return (exc.status() or "?").rsplit(".", 1)[-1]  # gRPC: "StatusCode.UNAVAILABLE"
    out = result.as_numpy("OUTPUT0")
    want = a.reshape(1, 4) if model == "identity_FP32" else a + a
    assert np.array_equal(out, want), f"{transport} {model}: OUTPUT0 {out} != {want}"
    return "200" if transport == "http" else "OK"


def _exposition(gw: GatewayProcess) -> dict[str, float]:
    """The gateway's own /metrics as {sample name + JSON of its labels: value}, plus a key
    "__family__<name>" for each name a declared family may have (a labelled counter with no
    sample yet still declares itself)."""
    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        for suffix in suffixes:  # declared, even before its first sample (a labelled counter)
            out.setdefault(f"__family__{family.name}{suffix}", 0.0)
        for s in family.samples:
            out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def _gateway_value(expo: dict[str, float], name: str, **labels: str) -> float | None:
    return expo.get(name + json.dumps(labels, sort_keys=True))


def _gateway_infer_total(expo: dict[str, float]) -> float:
    return sum(v for k, v in expo.items()
               if k.startswith("oip_gateway_requests_total{") and '"api": "infer"' in k)


@pytest.fixture(scope="module")
def stack(tools: None, reference: ReferenceServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("prometheus")
    backends = {
        "http": {"protocol": "http", "endpoints": [reference.http_url]},
        "grpc": {"protocol": "grpc", "endpoints": [reference.grpc_url]},
    }
    routes = [{"model": m, "backend": b} for m, b in ROUTES.items()]
    gw = GatewayProcess(gateway_config(backends, routes), workdir, name="gateway-prom")
    gw.start()
    prom = Prometheus(workdir, {JOB: [gw.metrics_url]}, rule_files=[RULES])
    try:
        prom.start()
        urls = {"http": gw.http_url, "grpc": gw.grpc_url}
        expected: Counter[tuple[str, str, str, str]] = Counter()

        def send(transport: str, model: str, times: int, code: str) -> None:
            for _ in range(times):
                got = _send(transport, urls[transport], model)
                assert got == code, f"{transport} {model}: got {got}, expected {code}"
                expected[(transport, *_route_of(model), code)] += 1

        def sync() -> float:
            """Wait until the gateway counted every request sent, then for a scrape after that."""
            total = sum(expected.values())
            wait_for(lambda: _gateway_infer_total(_exposition(gw)) == total, timeout=10,
                     what=f"the gateway to count {total} inference requests")
            return prom.wait_scraped_after(JOB, time.time())

        prom.wait_scraped_after(JOB, 0)
        for transport, model, _, code in SENDS:  # phase 1: every series appears
            send(transport, model, 1, code)
        sync()
        for transport, model, times, code in SENDS:  # phase 2: the rest, and a Load of add_sub
            send(transport, model, times - 1, code)
        load = Load(http_url=gw.http_url, grpc_url=gw.grpc_url, models=["add_sub"], http_concurrency=2,
                    grpc_concurrency=2, max_requests=LOAD_REQUESTS, max_seconds=30)
        summary = load.start().wait_done(timeout=40)
        assert summary.completed == LOAD_REQUESTS and summary.failed == 0, summary.report()
        for transport, code in (("http", "200"), ("grpc", "OK")):
            expected[(transport, "add_sub", "http", code)] += summary.per_transport[transport]["ok"]

        # One reload applied (a route added), then one refused (an unknown key).
        cfg = gateway_config(backends, [*routes, {"model": ADDED_ROUTE[0], "backend": ADDED_ROUTE[1]}])
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _gateway_value(_exposition(gw), "oip_gateway_config_reloads_total", result="success") == 1,
                 timeout=10, what="the reload to be applied")
        gw.config_path.write_text(yaml.safe_dump({**cfg, "no_such_key": 1}))
        gw.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _gateway_value(_exposition(gw), "oip_gateway_config_reloads_total", result="failure") == 1,
                 timeout=10, what="the invalid config to be refused")

        # A second scrape: every series, the reload counters born last included, then has two
        # samples, which rate() and increase() need.
        scraped = prom.wait_scraped_after(JOB, sync())
        prom.wait_rules_evaluated_after(scraped)
        yield Stack(gw, prom, reference, dict(expected), {k.removeprefix("__family__").split("{")[0]
                                                           for k in _exposition(gw)})
    except BaseException:
        print(f"--- gateway log\n{gw.log_tail()}\n--- prometheus log\n{prom.log_tail()}")
        raise
    finally:
        prom.stop()
        gw.stop()


def _sum_by(expected: dict[tuple[str, str, str, str], int], *fields: int) -> dict[tuple[str, ...], int]:
    out: Counter[tuple[str, ...]] = Counter()
    for key, n in expected.items():
        out[tuple(key[i] for i in fields)] += n
    return dict(out)


def _ints(values: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    return {k: int(v) if float(v).is_integer() else v for k, v in values.items()}


# ---------------------------------------------------------------------------------- promtool


def test_promtool_check_rules(tools: None) -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests(tools: None) -> None:
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_is_unit_tested() -> None:
    """Each recording rule is evaluated and each alert is expected to fire in rules_test.yaml."""
    rules = yaml.safe_load(RULES.read_text())
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    records = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tested_records = {t["expr"] for case in tests for t in case.get("promql_expr_test", [])}
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert records - tested_records == set()
    assert alerts - fired == set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
                assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
            else:  # level:metric:operations
                assert re.fullmatch(r"[a-z_]+:oip_gateway_[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]


# ------------------------------------------------------------------ scraped counts = load sent


def test_request_counts_per_route_backend_protocol_and_code(stack: Stack) -> None:
    prom, expected = stack.prom, stack.expected
    sel = f'{{job="{JOB}", api="infer"}}'
    got = prom.values(f"sum by (protocol, route, backend, code) (oip_gateway_requests_total{sel})",
                      ["protocol", "route", "backend", "code"])
    assert _ints(got) == expected
    assert _ints(prom.values(f"sum by (route, backend) (oip_gateway_requests_total{sel})",
                             ["route", "backend"])) == _sum_by(expected, 1, 2)
    assert _ints(prom.values(f"sum by (backend) (oip_gateway_requests_total{sel})",
                             ["backend"])) == _sum_by(expected, 2)
    # The latency histogram counts the same requests, per protocol, route and backend.
    assert _ints(prom.values(f"sum by (protocol, route, backend) (oip_gateway_request_duration_seconds_count{sel})",
                             ["protocol", "route", "backend"])) == _sum_by(expected, 0, 1, 2)
    inf = f'{{job="{JOB}", api="infer", le="+Inf"}}'
    assert _ints(prom.values(f"sum by (route, backend) (oip_gateway_request_duration_seconds_bucket{inf})",
                             ["route", "backend"])) == _sum_by(expected, 1, 2)
    # Every inference request's body is measured, routed or not.
    assert _ints(prom.values(f'sum by (protocol) (oip_gateway_request_body_bytes_count{{job="{JOB}"}})',
                             ["protocol"])) == _sum_by(expected, 0)


def test_backend_calls_and_their_failures(stack: Stack) -> None:
    """Each request that reached a backend made one timed backend call (no retries here); the
    models ready nowhere failed as ModelNotReady, counted under their backend."""
    prom, expected = stack.prom, stack.expected
    reached = {b: n for (b,), n in _sum_by(expected, 2).items() if b}
    assert _ints(prom.values(f'sum by (backend) (oip_gateway_upstream_duration_seconds_count{{job="{JOB}"}})',
                             ["backend"])) == {(b,): n for b, n in reached.items()}
    assert _ints(prom.values(f'sum by (backend, kind) (oip_gateway_upstream_errors_total{{job="{JOB}"}})',
                             ["backend", "kind"])) == {("http", "ModelNotReady"): 3, ("grpc", "ModelNotReady"): 2}


def test_conversions_by_direction_and_backend(stack: Stack) -> None:
    """HTTP clients to the gRPC backend convert http_to_grpc, gRPC clients to the HTTP backend
    grpc_to_http; same-protocol requests pass through. Only successful requests cross."""
    stack.require("oip_gateway_conversions_total")
    e = stack.expected
    want = {("grpc", "http_to_grpc"): e[("http", "identity_FP32", "grpc", "200")],
            ("http", "grpc_to_http"): e[("grpc", "add_sub", "http", "OK")]}
    got = stack.prom.values(f'sum by (backend, direction) (oip_gateway_conversions_total{{job="{JOB}"}})',
                            ["backend", "direction"])
    assert _ints(got) == want


def test_endpoint_gauges_and_readiness(stack: Stack) -> None:
    prom, ref = stack.prom, stack.reference
    endpoints = {("http", ref.http_url), ("grpc", ref.grpc_url)}
    healthy = prom.values(f'oip_gateway_endpoint_healthy{{job="{JOB}"}}', ["backend", "endpoint"])
    ejected = prom.values(f'oip_gateway_endpoint_ejected{{job="{JOB}"}}', ["backend", "endpoint"])
    assert healthy == {e: 1.0 for e in endpoints}
    assert ejected == {e: 0.0 for e in endpoints}
    # not_loaded_a/b have no ready endpoint: the gateway is not ready.
    assert prom.values(f'oip_gateway_ready{{job="{JOB}"}}', []) == {(): 0.0}
    assert prom.values(f'oip_gateway_inflight_request_bytes{{job="{JOB}"}}', []) == {(): 0.0}


def test_route_readiness(stack: Stack) -> None:
    stack.require("oip_gateway_route_ready")
    got = stack.prom.values(f'oip_gateway_route_ready{{job="{JOB}"}}', ["route", "backend"])
    want = {("add_sub", "http"): 1.0, ("identity_FP32", "grpc"): 1.0, ADDED_ROUTE: 1.0,
            ("not_loaded_a", "http"): 0.0, ("not_loaded_b", "grpc"): 0.0}
    assert got == want


def test_config_reload_metrics(stack: Stack) -> None:
    prom = stack.prom
    assert _ints(prom.values(f'oip_gateway_config_reloads_total{{job="{JOB}"}}', ["result"])) == {
        ("success",): 1, ("failure",): 1}
    assert prom.values(f'oip_gateway_config_last_reload_successful{{job="{JOB}"}}', []) == {(): 0.0}


def test_config_generation(stack: Stack) -> None:
    """1 at start, +1 for the applied reload, nothing for the refused one."""
    stack.require("oip_gateway_config_generation")
    assert stack.prom.values(f'oip_gateway_config_generation{{job="{JOB}"}}', []) == {(): 2.0}


# ------------------------------------------------------------------ rules in a real Prometheus


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _metrics_in(expr: str) -> set[str]:
    """The gateway's metric names in ``expr`` (not the middle part of a recording rule's name)."""
    return set(re.findall(r"(?<![\w:])oip_gateway_\w+(?![\w:])", expr))


def test_rules_load_and_evaluate(stack: Stack) -> None:
    groups = stack.prom.rule_groups()
    loaded = [r for g in groups for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(r.get("record") or r["alert"] for r in _rules())
    bad = [(r["name"], r.get("health"), r.get("lastError")) for r in loaded if r.get("health") != "ok"]
    assert bad == []
    empty = []
    for name in sorted({r["record"] for r in _rules() if "record" in r}):
        if stack.prom.query(name):
            continue
        if name not in RULES_MAY_BE_EMPTY:
            empty.append(name)
    assert empty == [], "recording rules with no series"


def test_recorded_values_follow_the_load(stack: Stack) -> None:
    prom = stack.prom
    ratio = prom.values(f'job_route_backend:oip_gateway_infer_errors:ratio_rate5m{{job="{JOB}"}}',
                        ["route", "backend"])
    # Every request to a model ready nowhere failed (503 / UNAVAILABLE: server side); none of
    # the others did (404 / NOT_FOUND is the client's).
    assert ratio == {("add_sub", "http"): 0.0, ("identity_FP32", "grpc"): 0.0, ("not_loaded_a", "http"): 1.0,
                     ("not_loaded_b", "grpc"): 1.0, ("_unrouted", ""): 0.0}
    rates = prom.values(f'job_route_backend:oip_gateway_infer_requests:rate5m{{job="{JOB}"}}', ["route", "backend"])
    assert set(rates) == set(ratio) and all(v > 0 for v in rates.values()), rates
    for metric, level in (("job_route_backend_quantile:oip_gateway_infer_duration_seconds", {"route": "add_sub"}),
                          ("job_backend_quantile:oip_gateway_infer_duration_seconds", {"backend": "http"}),
                          ("job_backend_quantile:oip_gateway_upstream_duration_seconds", {"backend": "http"})):
        sel = ", ".join(f'{k}="{v}"' for k, v in level.items())
        q = prom.values(f'{metric}:histogram_quantile_rate5m{{job="{JOB}", {sel}}}', ["quantile"])
        assert set(q) == {("0.5",), ("0.9",), ("0.99",)}, (metric, q)
        assert 0 < q[("0.5",)] <= q[("0.9",)] <= q[("0.99",)] <= 60, (metric, q)
    assert prom.values(f'job_backend:oip_gateway_endpoint_healthy:sum_max{{job="{JOB}"}}', ["backend"]) == {
        ("http",): 1.0, ("grpc",): 1.0}
    assert prom.values(f'job_backend:oip_gateway_endpoint_ejected:sum_max{{job="{JOB}"}}', ["backend"]) == {
        ("http",): 0.0, ("grpc",): 0.0}


def test_alerts_pending_none_firing(stack: Stack) -> None:
    """Every alert waits (`for`) minutes, so in this short run the conditions that hold show as
    pending: the refused reload, the gateway not ready, the two routes whose model is ready nowhere."""
    want = {("OipGatewayConfigReloadFailed", ""), ("OipGatewayNotReady", ""),
            ("OipGatewayRouteNotReady", "not_loaded_a"), ("OipGatewayRouteNotReady", "not_loaded_b")}

    def pending() -> dict[tuple[str, str], float] | None:
        got = stack.prom.values('ALERTS{alertstate="pending"}', ["alertname", "route"])
        return got if set(got) >= want else None  # alerts on recording rules lag one evaluation

    got = wait_for(pending, timeout=10, interval=0.2, what=f"pending alerts {sorted(want)}")
    assert set(got) == want
    assert stack.prom.query('ALERTS{alertstate="firing"}') == []


# ------------------------------------------------------------------------------- the dashboard

_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
_SUBSTITUTE = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "__interval_ms": "15000",
               "__range_s": "300"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$", re.S)
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def _variables(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in d["templating"]["list"]}


def _variable_query(v: dict[str, Any]) -> str:
    q = v.get("query")
    return q["query"] if isinstance(q, dict) else q


def _expand(expr: str, variables: dict[str, dict[str, Any]]) -> str:
    """Grafana's substitution as a user with every variable at "All" would get."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in _SUBSTITUTE:
            return _SUBSTITUTE[name]
        v = variables.get(name)
        if v is None:
            raise AssertionError(f"undefined variable ${name} in {expr!r}")
        return v.get("allValue") or ".*"

    return _VAR.sub(sub, expr)


def test_dashboard_is_a_grafana_dashboard() -> None:
    d = _dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    variables = _variables(d)
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    want_ds = {"type": "prometheus", "uid": "${datasource}"}
    for name in ("job", "backend", "route"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == want_ds and _LABEL_VALUES.match(_variable_query(v)), v
    panels = _panels(d)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == want_ds, p["title"]
        assert p.get("targets"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == want_ds and t["expr"].strip(), (p["title"], t)
            _expand(t["expr"], variables)  # every variable is defined
    # Everything the gateway exports is on the dashboard.
    used = set().union(*(_metrics_in(t["expr"]) for p in panels for t in p.get("targets", [])))
    for metric in ("oip_gateway_requests_total", "oip_gateway_request_duration_seconds_bucket",
                   "oip_gateway_upstream_duration_seconds_bucket", "oip_gateway_upstream_errors_total",
                   "oip_gateway_request_body_bytes_bucket", "oip_gateway_endpoint_healthy",
                   "oip_gateway_endpoint_ejected", "oip_gateway_route_ready", "oip_gateway_ready",
                   "oip_gateway_inflight_request_bytes", "oip_gateway_backend_events_total",
                   "oip_gateway_conversions_total", "oip_gateway_config_reloads_total",
                   "oip_gateway_config_last_reload_successful", "oip_gateway_config_generation"):
        assert metric in used, f"{metric} is on no panel"


def test_rules_and_dashboard_name_only_exported_metrics(stack: Stack) -> None:
    """A misspelt metric would just give an empty panel or rule: every oip_gateway_* name used
    must be one the running gateway exports (or declares, before its first sample)."""
    d = _dashboard()
    exprs = [t["expr"] for p in _panels(d) for t in p.get("targets", [])]
    exprs += [_variable_query(v) for v in _variables(d).values() if v["type"] == "query"]
    exprs += [r["expr"] for r in _rules()]
    used = set().union(*(_metrics_in(e) for e in exprs))
    assert sorted(used - stack.exported) == []


def test_dashboard_queries_parse_and_return_series(stack: Stack) -> None:
    d = _dashboard()
    variables = _variables(d)
    problems: list[str] = []

    def run(title: str, expr: str) -> list[tuple[dict[str, str], float]]:
        try:
            return stack.prom.query(_expand(expr, variables))
        except PromQLError as exc:
            problems.append(f"{title}: {exc}")  # 400 bad_data: does not parse
            return []

    for p in _panels(d):
        for t in p.get("targets", []):
            result = run(p["title"], t["expr"])
            if result:
                labels = set().union(*(r[0] for r in result))
                missing = set(_LEGEND_LABEL.findall(t.get("legendFormat", ""))) - labels
                if missing:
                    problems.append(f"{p['title']}: legend labels {sorted(missing)} in no series")
            elif p["title"] not in MAY_BE_EMPTY:
                problems.append(f"{p['title']}: no series for {t['expr']}")

    # Variable queries are Grafana's label_values(selector, label): as PromQL, count by (label).
    want_values = {"job": {JOB}, "backend": {"http", "grpc"}, "route": {*ROUTES, "_unrouted"}}
    for name, v in variables.items():
        if v["type"] != "query":
            continue
        m = _LABEL_VALUES.match(_variable_query(v))
        assert m is not None, v
        result = run(f"variable {name}", f"count by ({m['label']}) ({m['selector']})")
        values = {r[0].get(m["label"], "") for r in result}
        if not want_values[name] <= values:
            problems.append(f"variable {name}: values {sorted(values)} lack {sorted(want_values[name] - values)}")

    assert problems == []


def test_query_errors_are_reported(stack: Stack) -> None:
    """What the dashboard test relies on: a query that does not parse is an HTTP 400 (bad_data)."""
    with pytest.raises(PromQLError) as err:
        stack.prom.query('sum by (route) (rate(oip_gateway_requests_total{job="oip-gateway"}[1m])')
    assert (err.value.status, err.value.error_type) == (400, "bad_data")
