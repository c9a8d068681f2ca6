"""Docker for the deployment tests: a private dockerd, a local Debian base image, builds, runs.

Nothing here talks to a registry. ``Dockerd`` starts Debian's ``docker.io`` daemon by hand on
a socket of its own, with no bridge and no iptables (the containers use the host network);
``build_base_image`` makes a Debian bookworm image with debootstrap (bookworm's python3 is
3.11) and imports it, standing in for ``python:3.11-slim``; ``build_wheelhouse`` fetches the
wheels of requirements/lock.txt (hash-checked, as the image installs them) and of the build
requirements on the host, where the package index is reachable with the host's certificates,
so the image build itself runs with ``--network=none``.

Everything slow is cached under ``cache_dir()`` (``.cache/deploy-image/`` in the repository,
or ``$OIP_IMAGE_CACHE``): the debootstrap tree as a tar, and dockerd's data root (the imported
base, the last image and its build cache) while no other test run holds it. The wheelhouse
lives in the repository's ``.cache/deploy-image/wheels/`` whatever the cache dir, because it
must be inside the build context.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .procs import terminate_with_parent, wait_for

__all__ = [
    "REPO",
    "Container",
    "DockerError",
    "Dockerd",
    "build_base_image",
    "build_image",
    "build_wheelhouse",
    "cache_dir",
    "data_root",
    "docker_unavailable",
    "run_container",
    "unmount_under",
]

REPO = Path(__file__).resolve().parents[2]
_WHEELS = REPO / ".cache" / "deploy-image" / "wheels"
# What the base needs to stand in for python:3.11-slim: an interpreter, venv and pip.
_DEBOOTSTRAP = ["--variant=minbase", "--include=python3,python3-venv,python3-pip", "bookworm"]
# The config an official Debian image carries; `docker import` starts from none.
_BASE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
]
# Left out of the base: what debootstrap downloaded, apt's lists, documentation (~150 MB).
_BASE_PRUNE = ["var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"]


class DockerError(RuntimeError):
    """A docker command, dockerd or debootstrap failed; the message carries its output."""


def unmount_under(path: Path) -> None:
    """Detach every mount at or below ``path``, deepest first. dockerd leaves its default
    network namespace bind-mounted in the exec root when it stops, and a killed one may
    leave overlay mounts in the data root: without this they could not be removed."""
    prefix = str(path.resolve())
    with open("/proc/self/mounts") as fh:
        # /proc/self/mounts escapes space, tab, newline and backslash as octal.
        points = [line.split()[1].encode().decode("unicode_escape") for line in fh]
    libc = ctypes.CDLL(None, use_errno=True)
    for point in sorted({p for p in points if p == prefix or p.startswith(prefix + "/")}, key=len, reverse=True):
        libc.umount2(point.encode(), 2)  # MNT_DETACH


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def _docker_cli() -> str | None:
    # The CLI of Debian's docker.io matches its daemon and builds with the BuildKit inside
    # dockerd. A newer CLI elsewhere on PATH may insist on the buildx plugin for BuildKit.
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def docker_unavailable() -> str | None:
    """Why the image tests cannot run on this machine, or None when they can."""
    missing = [name for name, path in (("dockerd", _sbin("dockerd")), ("docker", _docker_cli()),
                                        ("debootstrap", _sbin("debootstrap"))) if path is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install docker.io debootstrap)"
    if os.geteuid() != 0:
        return f"dockerd and debootstrap need root; this test process runs as uid {os.geteuid()}"
    return None


def cache_dir() -> Path:
    """Where the base tar and the persistent dockerd data root live (created, git-ignored)."""
    path = Path(os.environ.get("OIP_IMAGE_CACHE") or REPO / ".cache" / "deploy-image")
    path.mkdir(parents=True, exist_ok=True)
    _ignore_in_git(REPO / ".cache" / "deploy-image")
    return path


def _ignore_in_git(path: Path) -> None:
    # Like .pytest_cache: the directory ignores itself, so neither git nor tools that follow
    # .gitignore (ruff) walk the image layers and wheels inside it.
    path.mkdir(parents=True, exist_ok=True)
    marker = path / ".gitignore"
    if not marker.exists():
        marker.write_text("# created by tests/support/docker.py\n*\n")


@contextlib.contextmanager
def data_root(fallback_parent: Path) -> Iterator[tuple[Path, bool]]:
    """dockerd's data root: the cached one when no other test run holds it (yields
    ``(path, True)``), else a fresh one under ``fallback_parent`` (``(path, False)``), removed
    afterwards. Two dockerds must never share a data root."""
    cache = cache_dir()
    with open(cache / "docker.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fresh = Path(tempfile.mkdtemp(prefix="docker-data-", dir=fallback_parent))
            try:
                yield fresh, False
            finally:
                unmount_under(fresh)
                shutil.rmtree(fresh, ignore_errors=True)
            return
        yield cache / "docker", True


class Dockerd:
    """``with Dockerd(data_root) as d:`` a dockerd of our own on a private socket; ``d.docker(...)``
    runs the CLI against it. It dies with the test process (PR_SET_PDEATHSIG), and on exit it
    is stopped with SIGTERM (it stops its containers and its containerd) and its runtime
    directory removed."""

    def __init__(self, data_root: Path, *, start_timeout: float = 60.0) -> None:
        self.data_root = data_root
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._cli = _docker_cli() or "docker"
        self._dir: Path | None = None
        self.host = ""
        self.env: dict[str, str] = {}

    @property
    def log_path(self) -> Path | None:
        return self._dir / "dockerd.log" if self._dir else None

    def __enter__(self) -> Dockerd:
        """Start dockerd and wait (bounded) until ``docker info`` answers; DockerError with
        dockerd's log if it does not."""
        # Unix socket paths are limited to 107 bytes, and containerd puts its own under the
        # exec root: a short directory of our own in /tmp, not pytest's deep tmp_path.
        self._dir = Path(tempfile.mkdtemp(prefix="oipd-", dir="/tmp"))
        self.host = f"unix://{self._dir / 'docker.sock'}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        self.env.update(DOCKER_HOST=self.host, DOCKER_BUILDKIT="1", DOCKER_CONFIG=str(self._dir / "cli"))
        argv = [
            _sbin("dockerd") or "dockerd", "--config-file", str(self._dir / "daemon.json"),
            "--host", self.host, "--data-root", str(self.data_root),
            "--exec-root", str(self._dir / "exec"), "--pidfile", str(self._dir / "dockerd.pid"),
            "--iptables=false", "--bridge=none",
        ]

        def up() -> str | None:
            if self.proc is not None and self.proc.poll() is not None:
                return "exited"
            info = subprocess.run([self._cli, "info", "--format", "{{.ServerVersion}}"], env=self.env,
                                  capture_output=True, timeout=10)
            return "up" if info.returncode == 0 else None

        try:
            self.data_root.mkdir(parents=True, exist_ok=True)
            (self._dir / "daemon.json").write_text("{}")  # not the machine's /etc/docker/daemon.json
            with open(self._dir / "dockerd.log", "wb") as log:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=functools.partial(terminate_with_parent, os.getpid()))
            state = wait_for(up, timeout=self.start_timeout, interval=0.1, what="dockerd to answer `docker info`")
            if state == "exited":
                raise DockerError(f"dockerd exited with {self.proc.returncode}")
        except (OSError, TimeoutError, DockerError) as exc:
            tail = self.log_tail()
            self.__exit__(None, None, None)
            raise DockerError(f"{exc}\n{tail}") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self._dir is not None:
            unmount_under(self._dir)
            shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, n: int = 40) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), n) if self.log_path else ""
        except OSError:
            return ""

    def docker(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS`` against this daemon; DockerError (with the output) when it fails
        and ``check`` is set."""
        done = subprocess.run([self._cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise DockerError(f"docker {' '.join(args)} exited with {done.returncode}:\n"
                              f"{_tail(done.stdout)}\n{_tail(done.stderr)}")
        return done

    def image_exists(self, tag: str) -> bool:
        return self.docker("image", "inspect", tag, check=False).returncode == 0

    def inspect(self, ref: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", ref).stdout)[0]


def build_base_image(d: Dockerd, *, timeout: float = 900.0) -> str:
    """``oip-base:bookworm-<key>``: Debian bookworm minbase with python3 (3.11), venv and pip;
    returns the tag. The key changes with the recipe below.

    Made once with debootstrap (~1 min, from debootstrap's default Debian mirror), kept as a tar
    in the cache, imported into dockerd when its data root lacks it."""
    key = hashlib.sha256(json.dumps([_DEBOOTSTRAP, _BASE_PRUNE, _BASE_CHANGES]).encode()).hexdigest()[:12]
    tag = f"oip-base:bookworm-{key}"
    if d.image_exists(tag):
        return tag
    tar = cache_dir() / f"bookworm-minbase-python3-{key}.tar"
    if not tar.exists():
        _debootstrap_tar(tar, timeout)
    d.docker("import", *(a for c in _BASE_CHANGES for a in ("--change", c)), str(tar), tag, timeout=300)
    return tag


def _debootstrap_tar(tar: Path, timeout: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=tar.parent))
    root = work / "root"
    try:
        done = subprocess.run([_sbin("debootstrap") or "debootstrap", *_DEBOOTSTRAP, str(root)],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise DockerError(f"debootstrap exited with {done.returncode}:\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
        for rel in _BASE_PRUNE:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        partial = work / "base.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True,
                       capture_output=True, timeout=timeout)
        os.replace(partial, tar)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_wheelhouse(python: str = sys.executable, *, timeout: float = 600.0) -> str:
    """Wheels of requirements/lock.txt (the image's dependencies, hash-checked) and of the
    project's build requirements, fetched or built by the host's pip for this Python (3.11, the
    image's), in ``.cache/deploy-image/wheels/<key>``; returns that path relative to the
    repository (the ``WHEELHOUSE`` build argument). Cached per lock and build requirements;
    others older than an hour are removed so the build context stays small."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    build = [*project["build-system"]["requires"], "wheel"]
    lock = REPO / "requirements" / "lock.txt"
    key = hashlib.sha256(json.dumps([build, lock.read_text(), sys.version_info[:2],
                                     sysconfig.get_platform()]).encode()).hexdigest()[:12]
    _ignore_in_git(_WHEELS.parent)
    _WHEELS.mkdir(parents=True, exist_ok=True)
    final = _WHEELS / key
    for old in _WHEELS.iterdir():
        if old != final and time.time() - old.stat().st_mtime > 3600:
            shutil.rmtree(old, ignore_errors=True)
    if not (final / ".complete").exists():
        partial = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=_WHEELS))
        try:
            # Two runs: --require-hashes holds for a whole pip command, and the build
            # requirements (like pip's own build isolation) are not hash-pinned.
            for reqs in (["--require-hashes", "-r", str(lock)], build):
                done = subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(partial), *reqs],
                                      capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
                if done.returncode != 0:
                    raise DockerError(f"pip wheel exited with {done.returncode}:\n{_tail(done.stderr)}")
            (partial / ".complete").touch()
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return str(final.relative_to(REPO))


def build_image(d: Dockerd, tag: str, *, dockerfile: Path, context: Path = REPO,
                build_args: dict[str, str] | None = None, timeout: float = 900.0) -> str:
    """``docker build --network=none``; returns the build output (BuildKit's plain progress)."""
    args = [a for k, v in (build_args or {}).items() for a in ("--build-arg", f"{k}={v}")]
    done = d.docker("build", "--network=none", "--progress=plain", "-f", str(dockerfile), "-t", tag, *args,
                    str(context), timeout=timeout)
    return done.stdout + done.stderr


@dataclass
class Container:
    """A container started with ``docker run -d``; ``remove()`` (or the context manager) removes it."""

    d: Dockerd
    id: str

    def state(self) -> dict[str, Any]:
        return self.d.inspect(self.id)["State"]

    def logs(self) -> str:
        done = self.d.docker("logs", self.id, check=False)
        return done.stdout + done.stderr

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.d.docker("exec", self.id, *argv, check=check)

    def wait_for(self, predicate: Any, *, timeout: float, what: str) -> Any:
        """``procs.wait_for`` that gives up at once, with the logs, if the container stops."""

        def check() -> Any:
            if not self.state()["Running"]:
                return _Stopped()
            return predicate()

        value = wait_for(check, timeout=timeout, interval=0.1, what=what)
        if isinstance(value, _Stopped):
            raise DockerError(f"container stopped ({self.state()['ExitCode']}) while waiting for {what}:\n"
                              f"{_tail(self.logs())}")
        return value

    def stop(self, timeout: int) -> tuple[int, float]:
        """``docker stop -t timeout``: SIGTERM, SIGKILL after ``timeout`` s. Returns the exit code
        and the seconds it took."""
        start = time.monotonic()
        self.d.docker("stop", "-t", str(timeout), self.id, timeout=timeout + 60)
        return self.state()["ExitCode"], time.monotonic() - start

    def remove(self) -> None:
        self.d.docker("rm", "-f", self.id, check=False)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _Stopped:
    def __bool__(self) -> bool:
        return True


def run_container(d: Dockerd, image: str, argv: Sequence[str] = (), *, options: Sequence[str] = ()) -> Container:
    """``docker run -d OPTIONS IMAGE ARGV`` (no ``--rm``: the exit code is read after a stop)."""
    return Container(d, d.docker("run", "-d", *options, image, *argv).stdout.strip())
