"""The Helm chart (deploy/helm/oip-gateway) checked with the real tools.

- the pinned ``helm`` (scripts/install-helm.sh): ``helm lint --strict`` and ``helm template``
  for the default values, every deploy/examples/*.yaml and a values set with every option on;
- every rendered object against Kubernetes' OpenAPI schemas in strict mode
  (kubernetes-validate), for the oldest Kubernetes the chart supports and the newest schemas;
  the Prometheus Operator's kinds, which those schemas lack, structurally;
- the parsed objects: ports, probes, security context, the drain timing, mounts, and the
  rendered config accepted by ``python -m gateway check`` (with every file it reads shown
  to come from a mounted Secret and every variable from the pod's environment);
- bad values refused by values.schema.json or the templates with a message naming the value.

helm missing (no npm or registry) is a skip on a developer machine and a failure in CI.
"""
from __future__ import annotations

import copy
import json
import math
import os
import posixpath
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import helm as h

EXAMPLE_FILES = sorted(h.EXAMPLES.glob("*.yaml"))
DEFAULTS = yaml.safe_load((h.CHART / "values.yaml").read_text())
CONFIG_PATH = "/etc/oip-gateway/config.yaml"
RULES_COPY = h.CHART / "files" / "rules.yaml"
RULES_CANONICAL = h.ROOT / "deploy" / "prometheus" / "rules.yaml"

# Every option on at once (and the timing values off their defaults).
EVERYTHING = {
    "drainSeconds": 7.5,
    "preStopSleepSeconds": 3,
    "shutdownGraceSeconds": 25,
    "replicaCount": 3,
    "autoscaling": {"enabled": False},
    "podDisruptionBudget": {"minAvailable": 2, "maxUnavailable": None},
    "tls": {"enabled": True, "secretName": "gw-tls", "clientCA": True},
    "imagePullSecrets": [{"name": "registry"}],
    "podAnnotations": {"example.com/team": "inference"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "node-role", "operator": "In", "values": ["gateway"]}]}}]}},
    "priorityClassName": "high",
    "service": {"type": "LoadBalancer", "annotations": {"example.com/lb": "internal"}},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "networkPolicy": {"enabled": True, "ingressFrom": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                      "egressTo": [{"namespaceSelector": {"matchLabels": {"name": "models"}}}]},
    "extraEnvFrom": [{"secretRef": {"name": "more-env"}}],
    "config": {
        "reload": "rollout",
        "backends": {
            "triton": {"protocol": "grpc", "endpoints": ["triton-0.triton:8001", {"dns": "triton.models:8001"}],
                       "check_headers": {"admin-key": {"env": "ADMIN_KEY"}},
                       "tls": {"ca": "/var/run/secrets/ca/ca.crt", "cert": "/var/run/secrets/ca/tls.crt",
                               "key": "/var/run/secrets/ca/tls.key"}},
            "mlserver": {"protocol": "http", "endpoints": ["mlserver:8080"], "binary_extension": False},
        },
        "routes": [{"model": "bert", "version": 2, "backend": "mlserver"}, {"model": "*", "backend": "triton"}],
        "health": {"interval_s": 2, "timeout_s": 1},
        "max_inflight_bytes": 536870912,
        "access_log": True,
    },
    "extraEnv": [{"name": "ADMIN_KEY", "valueFrom": {"secretKeyRef": {"name": "triton-admin", "key": "admin-key"}}}],
    "extraVolumes": [{"name": "ca", "secret": {"secretName": "triton-client"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/var/run/secrets/ca", "readOnly": True}],
}

CASES = {"defaults": [], **{f.stem: [f] for f in EXAMPLE_FILES}, "everything": [EVERYTHING]}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def _helm_installed() -> None:
    try:
        h.helm_binary()
    except h.HelmUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"helm must run in CI: {exc}")
        pytest.skip(f"helm unavailable: {exc}")


@pytest.fixture(scope="module")
def values_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("values")


def _files(sources: list[Any], where: Path) -> list[Path]:
    """Values sources (paths, or dicts written to files) as files for helm -f."""
    out = []
    for i, src in enumerate(sources):
        if isinstance(src, dict):
            path = where / f"v{abs(hash(repr(src)))}-{i}.yaml"
            path.write_text(yaml.safe_dump(src))
            src = path
        out.append(Path(src))
    return out


_rendered: dict[str, list[dict[str, Any]]] = {}


@pytest.fixture(params=sorted(CASES), scope="module")
def case(request: pytest.FixtureRequest, values_dir: Path) -> tuple[str, list[Path]]:
    return request.param, _files(CASES[request.param], values_dir)


def rendered(case: tuple[str, list[Path]]) -> list[dict[str, Any]]:
    name, files = case
    if name not in _rendered:
        _rendered[name] = h.render(*files)
    return _rendered[name]


def merged_values(files: list[Path]) -> dict[str, Any]:
    """The chart's values as helm merges them (maps deep, everything else replaced)."""
    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for k, v in over.items():
                out[k] = merge(base.get(k), v) if v is not None else None
            return {k: v for k, v in out.items() if v is not None or k in over}
        return copy.deepcopy(over)

    values = copy.deepcopy(DEFAULTS)
    for f in files:
        values = merge(values, yaml.safe_load(f.read_text()))
    return values


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = h.by_kind(objs).get(kind, [])
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def client_service(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The clients' Service (with peers.enabled there is also the headless <fullname>-peers:
    tests/deploy/test_helm_placement.py)."""
    found = [s for s in h.by_kind(objs).get("Service", []) if s["spec"].get("clusterIP") != "None"]
    assert len(found) == 1, f"expected one client Service, found {len(found)}"
    return found[0]


def pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment")["spec"]["template"]["spec"]


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(objs)["containers"]
    assert [c["name"] for c in containers] == ["gateway"]
    return containers[0]


def gateway_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])


# --------------------------------------------------------------------------- helm itself


def test_helm_is_the_pinned_binary() -> None:
    assert h.helm("version", "--template", "{{.Version}}").stdout.strip() == h.HELM_VERSION
    # Installed once, the script answers at once (no npm, no hashing).
    proc = subprocess.run(["bash", str(h.INSTALLER)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OIP_TOOLS_DIR": str(h.ROOT / ".tools" / "bin")})
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == h.helm_binary().parent


def test_chart_versions() -> None:
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    project = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"], "Chart.yaml appVersion must follow pyproject's version"


def test_lint_strict(case: tuple[str, list[Path]]) -> None:
    proc = h.lint(*case[1])
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- Kubernetes schemas


def check_service_monitor(obj: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    spec = obj["spec"]
    service = client_service(objs)
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    [endpoint] = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}
    for key in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint[key]), f"{key}: {endpoint[key]!r} is no duration"


def check_rule_groups(groups: Any) -> None:
    """A Prometheus rules file's ``groups`` (also a PrometheusRule's spec.groups)."""
    assert isinstance(groups, list) and groups
    names = [g["name"] for g in groups]
    assert len(set(names)) == len(names), "group names must be unique"
    for group in groups:
        assert set(group) <= {"name", "interval", "rules", "labels", "limit", "query_offset"}
        assert group["rules"], f"group {group['name']} has no rules"
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            allowed = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"} if "alert" in rule \
                else {"record", "expr", "labels"}
            assert set(rule) <= allowed, rule
            for k in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(k, {}).values()), rule


def check_prometheus_rule(obj: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    assert set(obj["spec"]) == {"groups"}
    check_rule_groups(obj["spec"]["groups"])
    # The chart embeds its copy of deploy/prometheus/rules.yaml unchanged.
    assert obj["spec"]["groups"] == yaml.safe_load(RULES_COPY.read_text())["groups"]


def test_manifests_validate(case: tuple[str, list[Path]]) -> None:
    objs = rendered(case)
    problems: list[str] = []
    for obj in objs:
        assert obj["metadata"]["namespace"] == "models"
        if (obj["apiVersion"], obj["kind"]) in h.OPERATOR_KINDS:
            {"ServiceMonitor": check_service_monitor, "PrometheusRule": check_prometheus_rule}[obj["kind"]](obj, objs)
        else:
            problems += h.schema_problems(obj)
    assert not problems, "\n".join(problems)
    kinds = sorted(h.by_kind(objs))
    assert {"ConfigMap", "Deployment", "Service", "ServiceAccount"} <= set(kinds), kinds


# --------------------------------------------------------------------------- the gateway's config


@pytest.fixture(scope="module")
def pem_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real self-signed certificate and its key, standing in for the mounted Secrets."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oip-gateway.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    where = tmp_path_factory.mktemp("pem")
    out = {"cert": where / "cert.pem", "key": where / "key.pem"}
    out["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    return out


def secret_file(path: str, objs: list[dict[str, Any]]) -> str:
    """Which Secret (and key) the container sees at ``path``; fails when none does."""
    spec = pod_spec(objs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container(objs)["volumeMounts"]:
        root = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(root):
            continue
        assert "subPath" not in mount
        rel = path[len(root):]
        volume = volumes[mount["name"]]
        sources = volume["projected"]["sources"] if "projected" in volume else [volume]
        for src in sources:
            # A Secret, or a ConfigMap for public material (a JWKS file of public keys).
            secret = src.get("secret") or src.get("configMap")
            if secret is None:
                continue
            name = secret.get("secretName") or secret.get("name")
            items = secret.get("items")
            if items is None and "/" not in rel:
                return f"{name}/{rel}"
            for item in items or ():
                if item["path"] == rel:
                    return f"{name}/{item['key']}"
    raise AssertionError(f"{path}: no mounted Secret provides this file")


def config_file_refs(config: dict[str, Any]) -> Iterator[tuple[list[Any], str, str]]:
    """(location in the config, key name, path) of every file the config makes the gateway read."""
    for k, path in (config["listen"].get("tls") or {}).items():
        yield ["listen", "tls", k], k, path
    for name, backend in config["backends"].items():
        tls = backend.get("tls")
        if isinstance(tls, dict):
            for k in ("ca", "cert", "key"):
                if k in tls:
                    yield ["backends", name, "tls", k], k, tls[k]
        for header, spec in (backend.get("check_headers") or {}).items():
            if "file" in spec:
                yield ["backends", name, "check_headers", header, "file"], "secret", spec["file"]
    auth = config.get("auth") or {}
    for i, key in enumerate(auth.get("keys") or ()):
        if "file" in key["key"]:
            yield ["auth", "keys", i, "key", "file"], "apikey", key["key"]["file"]
    if auth.get("jwt"):
        yield ["auth", "jwt", "jwks_file"], "jwks", auth["jwt"]["jwks_file"]


def test_gateway_accepts_config(case: tuple[str, list[Path]], tmp_path: Path,
                                pem_files: dict[str, Path]) -> None:
    objs = rendered(case)
    config = gateway_config(objs)
    assert config["listen"] == {**config["listen"], "http": "0.0.0.0:8000", "grpc": "0.0.0.0:8001",
                                "metrics": "0.0.0.0:8002"}
    # Files: each must come from a mounted Secret; the check reads stand-ins with the same role.
    for where, role, path in config_file_refs(config):
        secret_file(path, objs)
        node = config
        for k in where[:-1]:
            node = node[k]
        if role == "secret":
            stand_in = tmp_path / "header-secret"
            stand_in.write_text("s3cret\n")
        elif role == "apikey":
            stand_in = tmp_path / "api-key"
            stand_in.write_text("k3y-0123456789abcdef\n")
        elif role == "jwks":
            from cryptography.hazmat.primitives.asymmetric import ec
            from jwt.algorithms import ECAlgorithm

            stand_in = tmp_path / "jwks.json"
            jwk = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()).public_key(), as_dict=True)
            stand_in.write_text(json.dumps({"keys": [jwk]}))
        else:
            stand_in = pem_files["key" if role == "key" else "cert"]
        node[where[-1]] = str(stand_in)
    # Variables: each must be set in the container (from a Secret), or the gateway refuses to start.
    env = {e["name"]: e for e in container(objs).get("env", [])}
    check_env = {"PATH": os.environ.get("PATH", "")}
    for name, backend in config["backends"].items():
        for header, spec in (backend.get("check_headers") or {}).items():
            if "env" in spec:
                var = spec["env"]
                assert var in env, f"backends.{name}.check_headers.{header}: {var} is not in the container's env"
                assert "secretKeyRef" in env[var].get("valueFrom", {}), f"{var} should come from a Secret"
                check_env[var] = "s3cret"
    for i, key in enumerate((config.get("auth") or {}).get("keys") or ()):
        if "env" in key["key"]:
            var = key["key"]["env"]
            assert var in env, f"auth.keys[{i}].key: {var} is not in the container's env"
            assert "secretKeyRef" in env[var].get("valueFrom", {}), f"{var} should come from a Secret"
            check_env[var] = "k3y-0123456789abcdef"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "gateway", "check", str(path)], capture_output=True, text=True,
                          timeout=60, cwd=h.ROOT, env=check_env)
    assert proc.returncode == 0, f"oip-gateway check refused the rendered config:\n{proc.stdout}{proc.stderr}"


# --------------------------------------------------------------------------- the objects


def test_deployment(case: tuple[str, list[Path]]) -> None:
    objs = rendered(case)
    values = merged_values(case[1])
    config = gateway_config(objs)
    deployment = one(objs, "Deployment")
    spec = pod_spec(objs)
    c = container(objs)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()

    # The image's default command, with --watch only when the pods reload in place.
    watch = values["config"]["reload"] == "watch"
    assert c["command"] == ["oip-gateway"]
    assert c["args"] == ["serve", "--config", CONFIG_PATH] + (["--watch"] if watch else [])
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert ("checksum/config" in annotations) == (not watch) == ("checksum/restart-config" not in annotations)
    assert c["image"] == f"{values['image']['repository']}:{values['image']['tag'] or '0.1.0'}"

    # Ports: the config's listeners, by name.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {k: int(v.rsplit(":", 1)[1]) for k, v in config["listen"].items() if k != "tls"}
    assert {"http", "grpc", "metrics"} <= set(ports)
    assert all(p["protocol"] == "TCP" for p in c["ports"])

    # Probes: HTTP(S) on the V2 health endpoints, TCP under mutual TLS.
    tls = config["listen"].get("tls")
    for probe, path in (("startupProbe", "/v2/health/live"), ("livenessProbe", "/v2/health/live"),
                        ("readinessProbe", "/v2/health/ready")):
        if tls and "client_ca" in tls:
            assert c[probe]["tcpSocket"] == {"port": "http"} and "httpGet" not in c[probe]
        else:
            assert c[probe]["httpGet"] == {"path": path, "port": "http", "scheme": "HTTPS" if tls else "HTTP"}

    # Security: non-root with a numeric uid, read-only root, no privilege, no capabilities.
    sc, psc = c["securityContext"], spec["securityContext"]
    assert sc["runAsNonRoot"] is True and psc["runAsNonRoot"] is True
    assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} == psc["seccompProfile"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False

    # Mounts: /tmp an emptyDir (the only place written); the config a directory mount of the
    # ConfigMap (a subPath mount would never see an update).
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    config_mount = mounts[posixpath.dirname(CONFIG_PATH)]
    assert "subPath" not in config_mount and config_mount["readOnly"] is True
    sources = volumes[config_mount["name"]]["projected"]["sources"]
    cm_source = next(s["configMap"] for s in sources if "configMap" in s)
    assert cm_source["name"] == one(objs, "ConfigMap")["metadata"]["name"]
    assert cm_source["items"] == [{"key": "config.yaml", "path": posixpath.basename(CONFIG_PATH)}]
    assert not any(m["mountPath"].startswith("/etc/oip-gateway/") for m in c["volumeMounts"]), \
        "nothing may be mounted inside the config volume"

    # Drain: SIGTERM → not ready for drain_s while serving → listeners close (gRPC 5 s, then
    # HTTP 10 s; a supervisor kills workers at drain_s + 15 s). The grace period covers
    # preStop + drain_s + that, with shutdownGraceSeconds ≥ 15.
    drain, pre_stop = config["drain_s"], values["preStopSleepSeconds"]
    assert drain == values["drainSeconds"]
    grace = spec["terminationGracePeriodSeconds"]
    assert grace == math.ceil(pre_stop) + math.ceil(drain) + values["shutdownGraceSeconds"]
    assert grace >= pre_stop + drain + 15
    if pre_stop:
        assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": math.ceil(pre_stop)}}}
    else:
        assert "lifecycle" not in c
    if drain:
        assert c["readinessProbe"]["periodSeconds"] <= drain, "a readiness probe must see the drain"
    assert config["workers"] == values["workers"]

    # Spread over zones and nodes, counting this Deployment's pods.
    for tsc in spec.get("topologySpreadConstraints", []):
        assert tsc["labelSelector"]["matchLabels"].items() <= labels.items()
    assert {t["topologyKey"] for t in spec.get("topologySpreadConstraints", [])} == \
        {t["topologyKey"] for t in values["topologySpreadConstraints"]}


def test_service_and_scaling(case: tuple[str, list[Path]]) -> None:
    objs = rendered(case)
    values = merged_values(case[1])
    deployment = one(objs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    tls = gateway_config(objs)["listen"].get("tls")

    service = client_service(objs)
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "grpc", "metrics"}
    assert {n: p["targetPort"] for n, p in ports.items()} == {n: n for n in ports}
    assert {n: p["port"] for n, p in ports.items()} == values["service"]["ports"]
    if tls:
        assert "appProtocol" not in ports["grpc"] and ports["http"]["appProtocol"] == "https"
    else:
        assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c" and ports["http"]["appProtocol"] == "http"
    assert ports["metrics"]["appProtocol"] == "http"

    hpas = h.by_kind(objs).get("HorizontalPodAutoscaler", [])
    if values["autoscaling"]["enabled"]:
        [hpa] = hpas
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                 "name": deployment["metadata"]["name"]}
        assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
        assert pod_spec(objs)["containers"][0]["resources"]["requests"]["cpu"], "CPU utilization needs a request"
    else:
        assert not hpas and deployment["spec"]["replicas"] == values["replicaCount"]

    pdbs = h.by_kind(objs).get("PodDisruptionBudget", [])
    assert len(pdbs) == int(values["podDisruptionBudget"]["enabled"])
    for pdb in pdbs:
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert len({"minAvailable", "maxUnavailable"} & set(pdb["spec"])) == 1

    policies = h.by_kind(objs).get("NetworkPolicy", [])
    assert len(policies) == int(values["networkPolicy"]["enabled"])
    for policy in policies:
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert allowed == {"http", "grpc", "metrics"} | ({"peers"} if values["peers"]["enabled"] else set())
        if values["networkPolicy"]["egressTo"]:
            assert "Egress" in policy["spec"]["policyTypes"]
            dns = [r for r in policy["spec"]["egress"] if "to" not in r]
            assert {(p["port"], p["protocol"]) for r in dns for p in r["ports"]} == {(53, "UDP"), (53, "TCP")}


def test_reload_modes_roll_pods_only_when_needed(values_dir: Path) -> None:
    """rollout: the pod template changes exactly when the config does. watch: only when a key
    a reload cannot apply changes (listen, workers, max_message_bytes); the rest reloads."""
    def base(mode: str) -> dict[str, Any]:
        return {"config": {"reload": mode, "backends": {"a": {"protocol": "http", "endpoints": ["a:80"]}},
                           "routes": [{"model": "m", "backend": "a"}]}}

    def more_routes(mode: str) -> dict[str, Any]:
        values = base(mode)
        values["config"]["routes"].append({"model": "other", "backend": "a"})
        return values

    def template(*sources: dict[str, Any]) -> dict[str, Any]:
        objs = h.render(*_files(list(sources), values_dir))
        return one(objs, "Deployment")["spec"]["template"]

    rollout = template(base("rollout"))
    assert rollout == template(base("rollout"), {"replicaCount": 5})
    assert rollout != template(more_routes("rollout"))
    assert rollout != template(base("rollout"), {"drainSeconds": 20})

    watch = template(base("watch"))
    assert watch == template(more_routes("watch")), "a route change must reload in place, not roll the pods"
    assert watch == template(base("watch"), {"config": {"health": {"interval_s": 5}}})
    for restart in ({"workers": 2}, {"config": {"max_message_bytes": 1024}},
                    {"tls": {"enabled": True, "secretName": "s"}}):
        assert watch["metadata"]["annotations"] != template(base("watch"), restart)["metadata"]["annotations"], \
            restart


@pytest.mark.parametrize(("drain", "pre_stop", "shutdown", "grace"), [
    (10, 0, 20, 30), (7.5, 3, 20, 31), (0, 0, 20, 20), (0, 5, 15, 20), (60, 0, 20, 80),
])
def test_termination_grace_follows_drain(values_dir: Path, drain: float, pre_stop: float, shutdown: int,
                                         grace: int) -> None:
    objs = h.render(*_files([{"drainSeconds": drain, "preStopSleepSeconds": pre_stop,
                              "shutdownGraceSeconds": shutdown}], values_dir))
    assert pod_spec(objs)["terminationGracePeriodSeconds"] == grace
    assert gateway_config(objs)["drain_s"] == drain


def test_tls_from_secret(values_dir: Path) -> None:
    objs = h.render(*_files([{"tls": {"enabled": True, "secretName": "gw-tls", "clientCA": True}}], values_dir))
    tls = gateway_config(objs)["listen"]["tls"]
    assert tls == {"cert": "/etc/oip-gateway/tls/tls.crt", "key": "/etc/oip-gateway/tls/tls.key",
                   "client_ca": "/etc/oip-gateway/tls/ca.crt"}
    assert [secret_file(tls[k], objs) for k in ("cert", "key", "client_ca")] == \
        ["gw-tls/tls.crt", "gw-tls/tls.key", "gw-tls/ca.crt"]


def test_notes(values_dir: Path) -> None:
    def notes(*sources: Any) -> str:
        out = h.helm("install", "gw", str(h.CHART), "--namespace", "models", "--dry-run=client",
                     *[a for f in _files(list(sources), values_dir) for a in ("-f", str(f))]).stdout
        return out[out.index("NOTES:"):]

    text = notes()
    for needle in ("gw-oip-gateway.models.svc.cluster.local:8000", "gw-oip-gateway.models.svc.cluster.local:8001",
                   "port-forward svc/gw-oip-gateway 8000:8000 8001:8001 8002:8002", "localhost:8002/metrics",
                   "tritonclient.grpc", "placeholder"):
        assert needle in text, needle
    text = notes(h.EXAMPLES / "tls.yaml")
    assert "https://gw-oip-gateway.models.svc.cluster.local:8000/v2" in text and "ssl=True" in text
    assert "placeholder" not in text


# --------------------------------------------------------------------------- Prometheus rules


def test_rules_file() -> None:
    """The chart's copy is a rules file the PrometheusRule can carry (the rules themselves are
    checked with promtool against deploy/prometheus/rules.yaml by their own tests)."""
    rules = yaml.safe_load(RULES_COPY.read_text())
    assert set(rules) == {"groups"}
    check_rule_groups(rules["groups"])


def test_rules_copy_matches_canonical() -> None:
    if not RULES_CANONICAL.exists():
        pytest.skip("deploy/prometheus/rules.yaml does not exist yet")
    assert RULES_COPY.read_bytes() == RULES_CANONICAL.read_bytes(), (
        "the chart's copy differs from the canonical rules: "
        "cp deploy/prometheus/rules.yaml deploy/helm/oip-gateway/files/rules.yaml")


# --------------------------------------------------------------------------- bad values


BAD_VALUES = {
    "protocol": ({"config": {"backends": {"t": {"protocol": "udp", "endpoints": ["t:1"]}},
                             "routes": [{"model": "m", "backend": "t"}]}},
                 ["/config/backends/t/protocol", "'http', 'grpc'"]),
    "route-without-model": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                        "routes": [{"backend": "t"}]}},
                            ["/config/routes/0", "missing property 'model'"]),
    "route-to-nowhere": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                     "routes": [{"model": "m", "backend": "x"}]}},
                         ['config.routes[0].backend: no backend named "x"']),
    "split-to-nowhere": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                     "routes": [{"model": "m", "split": [{"backend": "t", "weight": 9},
                                                                         {"backend": "yy", "weight": 1}]}]}},
                         ['config.routes[0].split[1].backend: no backend named "yy"']),
    "mirror-to-nowhere": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                      "routes": [{"model": "m", "backend": "t",
                                                  "mirror": {"backend": "z", "percent": 5}}]}},
                          ['config.routes[0].mirror.backend: no backend named "z"']),
    "route-with-backend-and-split": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                                 "routes": [{"model": "m", "backend": "t",
                                                             "split": [{"backend": "t", "weight": 1},
                                                                       {"backend": "t", "weight": 1}]}]}},
                                     ["/config/routes/0"]),
    "endpoint": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["no-port"]}},
                             "routes": [{"model": "m", "backend": "t"}]}},
                 ["/config/backends/t/endpoints/0"]),
    "unknown-config-key": ({"config": {"backendz": {}}}, ["/config", "'backendz' not allowed"]),
    "listen-is-the-charts": ({"config": {"listen": {"http": "0.0.0.0:9000"}}}, ["/config", "'listen' not allowed"]),
    "negative-drain": ({"drainSeconds": -1}, ["/drainSeconds", "minimum"]),
    "drain-shorter-than-probe": ({"drainSeconds": 2}, ["drainSeconds: 2 is shorter than readinessProbe.periodSeconds"]),
    "string-replicas": ({"replicaCount": "3"}, ["/replicaCount", "want integer"]),
    "reload-mode": ({"config": {"reload": "sometimes"}}, ["/config/reload", "'watch', 'rollout'"]),
    "tls-without-secret": ({"tls": {"enabled": True}}, ["/tls", "secretName"]),
    "client-ca-without-tls": ({"tls": {"clientCA": True}}, ["/tls/enabled", "value must be true"]),
    "env-not-provided": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"],
                                                        "check_headers": {"admin-key": {"env": "KEY"}}}},
                                     "routes": [{"model": "m", "backend": "t"}]}},
                         ["config.backends.t.check_headers.admin-key: environment variable KEY is not set"]),
    "auth-env-not-provided": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}},
                                          "routes": [{"model": "m", "backend": "t"}],
                                          "auth": {"keys": [{"name": "a", "key": {"env": "TEAM_KEY"}}]}}},
                              ["config.auth.keys[0].key: environment variable TEAM_KEY is not set"]),
    "routes-without-backends": ({"config": {"routes": [{"model": "m", "backend": "t"}]}},
                                ["/config/backends", "minProperties"]),
    "backends-without-routes": ({"config": {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}}}},
                                ["/config/routes", "minItems"]),
    "unknown-top-key": ({"replicas": 3}, ["'replicas' not allowed"]),
}


# Cross-field checks JSON Schema cannot express fail in the templates instead. `helm lint`
# renders in "lint mode", where a template's `fail` is only logged (helm/helm#8973, #11957):
# those are proven with `helm template` (what install and upgrade run) alone.
TEMPLATE_CHECKS = {"route-to-nowhere", "split-to-nowhere", "mirror-to-nowhere", "drain-shorter-than-probe",
                   "env-not-provided", "auth-env-not-provided"}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bad_values_rejected(name: str, values_dir: Path) -> None:
    values, needles = BAD_VALUES[name]
    [path] = _files([values], values_dir)
    procs = [h.helm("template", "gw", str(h.CHART), "-f", str(path), check=False)]
    if name not in TEMPLATE_CHECKS:
        procs.append(h.lint(path, check=False))
    for proc in procs:
        assert proc.returncode != 0, f"accepted: {values}"
        out = proc.stdout + proc.stderr
        for needle in needles:
            assert needle in out, f"{needle!r} not in:\n{out}"


def test_schema_knows_every_gateway_config_key() -> None:
    """values.schema.json lists the gateway's config keys (unknown keys are refused there too):
    a key added to a parser in gateway/config/ must be added to the chart's schema."""
    import json

    from gateway.config import backends, loader, network, routes

    schema = json.loads((h.CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]["properties"]
    backend = schema["definitions"]["backend"]["properties"]
    assert set(config) - {"reload"} | {"listen", "drain_s", "workers"} == loader._TOP_KEYS
    assert set(backend) == backends._BACKEND_KEYS
    assert set(schema["definitions"]["route"]["properties"]) == routes._ROUTE_KEYS
    assert set(config["health"]["properties"]) == loader._HEALTH_KEYS
    assert set(config["dns"]["properties"]) == network._DNS_KEYS
    assert set(backend["outlier"]["properties"]) == backends._OUTLIER_KEYS
    assert set(backend["tls"]["oneOf"][1]["properties"]) == backends._BACKEND_TLS_KEYS
