"""On-demand placement (issue 40) in the Helm chart: the `peers` block and the examples.

- deploy/examples/placement.yaml lints (``helm lint --strict``), renders, and every object it
  renders validates against Kubernetes' schemas (kubernetes-validate, strict), as
  tests/deploy/test_chart.py checks the other examples;
- with ``peers.enabled`` the rendered config carries ``listen.peers`` and top-level ``peers``
  naming the gateway's own headless Service ``<fullname>-peers`` (clusterIP None, the gateway
  pods, the peers port), and the container opens that port; off by default;
- the rendered config is accepted by ``python -m gateway check``;
- placement values the schema or the templates refuse, each with a message naming the value;
- deploy/examples/manifests/keda-scaledobject.yaml scales Triton on the demand gauge.

The rendering, linting and validation helpers are tests/support/helm.py's; the fixtures and
object accessors tests/deploy/test_chart.py's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_chart import (  # noqa: F401 - _helm_installed: the module's autouse fixture (helm present)
    _files,
    _helm_installed,
    container,
    gateway_config,
    one,
)
from tests.support import helm as h

EXAMPLE = h.EXAMPLES / "placement.yaml"
KEDA = h.EXAMPLES / "manifests" / "keda-scaledobject.yaml"
RELEASE, NAMESPACE = "gw", "models"
FULLNAME = f"{RELEASE}-oip-gateway"
PEERS = f"{FULLNAME}-peers"

# A placement backend, the smallest the schema takes.
PLACEMENT_BACKENDS = {"t": {"protocol": "grpc", "endpoints": [{"dns": "triton-headless.models.svc:8001"}],
                            "placement": {"capacity_models": 3}}}
PLACEMENT_ROUTES = [{"model": "*", "backend": "t", "hold_s": 10}]


@pytest.fixture(scope="module")
def values_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("placement-values")


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return h.render(EXAMPLE, release=RELEASE, namespace=NAMESPACE)


def services(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in h.by_kind(objs).get("Service", [])}


def render(values_dir: Path, *sources: Any) -> list[dict[str, Any]]:
    return h.render(*_files(list(sources), values_dir), release=RELEASE, namespace=NAMESPACE)


def peers_values(**peers: Any) -> dict[str, Any]:
    return {"peers": {"enabled": True, **peers},
            "config": {"backends": PLACEMENT_BACKENDS, "routes": PLACEMENT_ROUTES}}


# --------------------------------------------------------------------------- the example


def test_example_lints() -> None:
    proc = h.lint(EXAMPLE)
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_example_manifests_validate(objs: list[dict[str, Any]]) -> None:
    problems: list[str] = []
    client = services(objs)[FULLNAME]
    for obj in objs:
        assert obj["metadata"]["namespace"] == NAMESPACE
        if (obj["apiVersion"], obj["kind"]) in h.OPERATOR_KINDS:
            # Not in Kubernetes' schemas: the ServiceMonitor scrapes the client Service's metrics port.
            assert obj["kind"] == "ServiceMonitor"
            assert obj["spec"]["selector"]["matchLabels"].items() <= client["metadata"]["labels"].items()
            assert [e["port"] for e in obj["spec"]["endpoints"]] == ["metrics"]
            assert "metrics" in {p["name"] for p in client["spec"]["ports"]}
        else:
            problems += h.schema_problems(obj)
    assert not problems, "\n".join(problems)
    assert {"ConfigMap", "Deployment", "Service", "ServiceAccount"} <= set(h.by_kind(objs))
    assert set(services(objs)) == {FULLNAME, PEERS}


def test_rendered_config_has_peers(objs: list[dict[str, Any]]) -> None:
    config = gateway_config(objs)
    example = yaml.safe_load(EXAMPLE.read_text())
    assert config["listen"] == {"http": "0.0.0.0:8000", "grpc": "0.0.0.0:8001", "metrics": "0.0.0.0:8002",
                                "peers": "0.0.0.0:9400"}
    assert config["peers"] == [{"dns": f"{PEERS}.{NAMESPACE}.svc.cluster.local:9400"}]
    # The values' placement and route reach the config unchanged.
    assert config["backends"]["triton"]["placement"] == example["config"]["backends"]["triton"]["placement"]
    assert config["backends"]["triton"]["protocol"] == "grpc"
    assert config["routes"] == [{"model": "*", "backend": "triton", "hold_s": 30}]


def test_peers_service(objs: list[dict[str, Any]]) -> None:
    deployment = one(objs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    svc = services(objs)[PEERS]
    spec = svc["spec"]
    assert spec["clusterIP"] == "None", "the peers Service must be headless: one DNS record per pod"
    assert spec.get("publishNotReadyAddresses", False) is False, "a draining pod must leave the peers"
    assert spec["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["selector"].items() <= pod_labels.items()
    assert spec["ports"] == [{"name": "peers", "port": 9400, "targetPort": "peers", "protocol": "TCP",
                              "appProtocol": "http"}]
    ports = {p["name"]: p for p in container(objs)["ports"]}
    assert ports["peers"] == {"name": "peers", "containerPort": 9400, "protocol": "TCP"}
    # The address the config names is this Service, in this namespace, on the port the pods open.
    [peer] = gateway_config(objs)["peers"]
    host, port = peer["dns"].rsplit(":", 1)
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert int(port) == spec["ports"][0]["port"] == ports["peers"]["containerPort"]
    assert gateway_config(objs)["listen"]["peers"].rsplit(":", 1)[1] == port
    # The clients' Service is left as it was: not headless, no peers port.
    client = services(objs)[FULLNAME]["spec"]
    assert client.get("clusterIP") != "None" and {p["name"] for p in client["ports"]} == {"http", "grpc", "metrics"}


def test_gateway_check_accepts_rendered_config(objs: list[dict[str, Any]], tmp_path: Path) -> None:
    text = one(objs, "ConfigMap")["data"]["config.yaml"]  # exactly what the pod reads
    path = tmp_path / "config.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "gateway", "check", str(path)], capture_output=True, text=True,
                          timeout=60, cwd=h.ROOT, env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 0, f"oip-gateway check refused the rendered config:\n{proc.stdout}{proc.stderr}"


# --------------------------------------------------------------------------- the values


def test_peers_off_by_default(values_dir: Path) -> None:
    for sources in ([], [h.EXAMPLES / "triton-fleet.yaml"]):
        objs = render(values_dir, *sources)
        config = gateway_config(objs)
        assert "peers" not in config and "peers" not in config["listen"]
        assert set(services(objs)) == {FULLNAME}
        assert "peers" not in {p["name"] for p in container(objs)["ports"]}


def test_peers_port_and_long_names(values_dir: Path) -> None:
    name = "x" * 63
    objs = render(values_dir, {**peers_values(port=9500), "fullnameOverride": name})
    svc = services(objs)[f"{'x' * 57}-peers"]
    assert len(svc["metadata"]["name"]) <= 63
    assert svc["spec"]["ports"][0]["port"] == 9500
    config = gateway_config(objs)
    assert config["listen"]["peers"] == "0.0.0.0:9500"
    assert config["peers"] == [{"dns": f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:9500"}]
    assert {p["name"]: p["containerPort"] for p in container(objs)["ports"]}["peers"] == 9500
    problems = [p for obj in objs if (obj["apiVersion"], obj["kind"]) not in h.OPERATOR_KINDS
                for p in h.schema_problems(obj)]
    assert not problems, "\n".join(problems)


def test_config_peers_replaces_the_charts_list(values_dir: Path) -> None:
    values = peers_values()
    values["config"]["peers"] = ["10.0.0.7:9400", {"dns": f"{PEERS}.{NAMESPACE}.svc.example.org:9400"}]
    config = gateway_config(render(values_dir, values))
    assert config["peers"] == values["config"]["peers"]
    assert config["listen"]["peers"] == "0.0.0.0:9400"


def test_one_pod_places_without_peers(values_dir: Path) -> None:
    """A single pod (no autoscaling, one replica) decides alone: no peers needed."""
    objs = render(values_dir, {"autoscaling": {"enabled": False}, "replicaCount": 1,
                               "config": {"backends": PLACEMENT_BACKENDS, "routes": PLACEMENT_ROUTES}})
    config = gateway_config(objs)
    assert config["backends"]["t"]["placement"] == {"capacity_models": 3}
    assert "peers" not in config and "peers" not in config["listen"]
    assert set(services(objs)) == {FULLNAME}


def test_peers_roll_the_pods(values_dir: Path) -> None:
    """listen.peers and peers are in the restart checksum: with reload=watch a change rolls the pods."""
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        return one(render(values_dir, values), "Deployment")["spec"]["template"]["metadata"]["annotations"]

    base = annotations(peers_values())
    assert base != annotations(peers_values(port=9500))
    other = peers_values()
    other["config"]["peers"] = ["10.0.0.7:9400"]
    assert base != annotations(other)
    # A placement setting itself reloads in place.
    more = peers_values()
    more["config"]["backends"] = {"t": {**PLACEMENT_BACKENDS["t"], "placement": {"capacity_models": 5}}}
    assert base == annotations(more)


def test_network_policy_admits_the_peers(values_dir: Path) -> None:
    objs = render(values_dir, {**peers_values(), "networkPolicy": {
        "enabled": True, "egressTo": [{"namespaceSelector": {"matchLabels": {"name": "models"}}}]}})
    policy = one(objs, "NetworkPolicy")
    selector = one(objs, "Deployment")["spec"]["selector"]["matchLabels"]
    peers_in = [r for r in policy["spec"]["ingress"] if {p["port"] for p in r["ports"]} == {"peers"}]
    assert peers_in == [{"ports": [{"port": "peers", "protocol": "TCP"}],
                         "from": [{"podSelector": {"matchLabels": selector}}]}]
    peers_out = [r for r in policy["spec"]["egress"] if r.get("to") == [{"podSelector": {"matchLabels": selector}}]]
    assert peers_out == [{"to": [{"podSelector": {"matchLabels": selector}}],
                          "ports": [{"port": 9400, "protocol": "TCP"}]}]
    assert not h.schema_problems(policy)


BAD_VALUES = {
    "placement-without-peers": ({"config": {"backends": PLACEMENT_BACKENDS, "routes": PLACEMENT_ROUTES}},
                                ["config.backends.t.placement: needs peers.enabled"]),
    "config-peers-without-peers": ({"config": {"backends": PLACEMENT_BACKENDS, "routes": PLACEMENT_ROUTES,
                                               "peers": ["10.0.0.7:9400"]},
                                    "autoscaling": {"enabled": False}, "replicaCount": 1},
                                   ["config.peers: needs peers.enabled"]),
    "placement-unknown-key": ({**peers_values(), "config": {
        "backends": {"t": {**PLACEMENT_BACKENDS["t"], "placement": {"capacity_models": 3, "capacty_bytes": 1}}},
        "routes": PLACEMENT_ROUTES}}, ["/config/backends/t/placement", "'capacty_bytes' not allowed"]),
    "placement-without-capacity": ({**peers_values(), "config": {
        "backends": {"t": {**PLACEMENT_BACKENDS["t"], "placement": {"copies": 2}}},
        "routes": PLACEMENT_ROUTES}}, ["/config/backends/t/placement", "capacity_models"]),
    "placement-zero-capacity": ({**peers_values(), "config": {
        "backends": {"t": {**PLACEMENT_BACKENDS["t"], "placement": {"capacity_models": 0}}},
        "routes": PLACEMENT_ROUTES}}, ["/config/backends/t/placement/capacity_models", "minimum"]),
    "negative-hold": ({**peers_values(), "config": {
        "backends": PLACEMENT_BACKENDS, "routes": [{"model": "*", "backend": "t", "hold_s": -1}]}},
        ["/config/routes/0/hold_s", "minimum"]),
    "peers-port-taken": (peers_values(port=8001), ["/peers/port"]),
    "peers-unknown-key": ({"peers": {"enabled": True, "prot": 9400}}, ["/peers", "'prot' not allowed"]),
}
TEMPLATE_CHECKS = {"placement-without-peers", "config-peers-without-peers"}  # `helm lint` only logs a fail


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bad_values_rejected(name: str, values_dir: Path) -> None:
    values, needles = BAD_VALUES[name]
    [path] = _files([values], values_dir)
    procs = [h.helm("template", RELEASE, str(h.CHART), "-f", str(path), check=False)]
    if name not in TEMPLATE_CHECKS:
        procs.append(h.lint(path, check=False))
    for proc in procs:
        assert proc.returncode != 0, f"accepted: {values}"
        out = proc.stdout + proc.stderr
        for needle in needles:
            assert needle in out, f"{needle!r} not in:\n{out}"


# --------------------------------------------------------------------------- KEDA


def test_keda_scaled_object() -> None:
    """Structure only: ScaledObject is a CRD, not in Kubernetes' schemas."""
    docs = [d for d in yaml.safe_load_all(KEDA.read_text()) if d]
    [obj] = docs
    assert (obj["apiVersion"], obj["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert spec["scaleTargetRef"] == {"name": "triton"}  # the Triton Deployment, not the gateway
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["query"] == 'sum(oip_gateway_route_demand{route="*"})'
    assert all(isinstance(v, str) for v in meta.values()), "KEDA trigger metadata values are strings"
    assert float(meta["threshold"]) > 0 and float(meta["activationThreshold"]) >= 0
    assert meta["serverAddress"].startswith("http")
    # The route it watches is the example's, the metric is documented, and the manifest is not
    # taken for a values file (tests/deploy/test_chart.py renders every deploy/examples/*.yaml).
    routes = yaml.safe_load(EXAMPLE.read_text())["config"]["routes"]
    assert {"model": "*", "backend": "triton", "hold_s": 30} in routes
    assert "`oip_gateway_route_demand`" in (h.ROOT / "docs" / "metrics.md").read_text()
    assert KEDA not in set(h.EXAMPLES.glob("*.yaml"))
