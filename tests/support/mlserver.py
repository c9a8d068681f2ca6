"""Run a real MLServer (Seldon) for tests.

MLServer lives in its own virtual environment, ``.mlserver-venv`` at the repository root
(git-ignored), because its dependency pins may clash with the project's venv. The venv is
created here on first use (tests/support/venvbuild.py: uv or pip) from
``tests/support/mlserver-requirements.txt``, bounded in time and logged to
``.mlserver-venv/install.log``. A stamp file records the requirements it was built from;
when they change, the venv is rebuilt.

:class:`MLServerProcess` copies a models directory (default ``tests/models/mlserver``) into
a work directory, writes a ``settings.json`` next to the models with ``http_port`` and
``grpc_port`` 0 on 127.0.0.1, the metrics server off and ``parallel_workers`` 0 (models run
in the server process, so it owns exactly two listening sockets), starts ``mlserver start``
and reads the ports it bound back from /proc (see tests/support/procs.py): MLServer logs
``:0`` for both. The port that answers ``GET /v2/health/live`` over HTTP/1.1 is the REST
port; the other one is gRPC. It then waits until the server and every model in the
directory report ready.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from .procs import terminate, wait_for, wait_for_ports
from .venvbuild import venv_commands

__all__ = [
    "MODELS_DIR",
    "VENV_DIR",
    "MLServerProcess",
    "MLServerUnavailable",
    "ensure_mlserver_venv",
    "mlserver_available",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = Path(os.environ.get("OIP_MLSERVER_VENV", REPO_ROOT / ".mlserver-venv"))
REQUIREMENTS = Path(__file__).with_name("mlserver-requirements.txt")
MODELS_DIR = REPO_ROOT / "tests" / "models" / "mlserver"

INSTALL_TIMEOUT = float(os.environ.get("OIP_MLSERVER_INSTALL_TIMEOUT", "900"))
_STAMP_NAME = ".oip-requirements.sha256"
_SKIP_ENV = "OIP_SKIP_MLSERVER"


class MLServerUnavailable(RuntimeError):
    """MLServer cannot run here; the message says why."""


def _venv_bin(name: str) -> Path:
    return VENV_DIR / "bin" / name


def _stamp() -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


def _venv_is_current(stamp: str) -> bool:
    try:
        return (VENV_DIR / _STAMP_NAME).read_text().strip() == stamp and _venv_bin("mlserver").exists()
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_logged(cmd: list[str], log: Path, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise MLServerUnavailable(f"installing MLServer took longer than {INSTALL_TIMEOUT:.0f}s; see {log}")
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            rc = subprocess.run(
                cmd, check=False, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=remaining,
                env=_clean_env(),
            ).returncode
        except subprocess.TimeoutExpired:
            raise MLServerUnavailable(
                f"installing MLServer took longer than {INSTALL_TIMEOUT:.0f}s; see {log}"
            ) from None
    if rc != 0:
        raise MLServerUnavailable(f"{cmd[0]} ... failed with exit code {rc}; see {log}:\n{_log_tail(log, 15)}")


def ensure_mlserver_venv() -> Path:
    """Create or refresh .mlserver-venv if needed; return the path of its ``mlserver`` script.

    Safe against concurrent test processes (an flock serialises the install).
    Raises :class:`MLServerUnavailable` if the venv cannot be built.
    """
    stamp = _stamp()
    if _venv_is_current(stamp):
        return _venv_bin("mlserver")
    lock_name = "oip-mlserver-venv-" + hashlib.sha256(str(VENV_DIR).encode()).hexdigest()[:16] + ".lock"
    with open(Path(tempfile.gettempdir()) / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _venv_is_current(stamp):  # another process built it while we waited
            return _venv_bin("mlserver")
        started = time.monotonic()
        deadline = started + INSTALL_TIMEOUT
        if VENV_DIR.exists():
            shutil.rmtree(VENV_DIR)
        VENV_DIR.mkdir(parents=True)
        log = VENV_DIR / "install.log"  # both ways of building take an existing directory
        for cmd in venv_commands(VENV_DIR, REQUIREMENTS):
            _run_logged(cmd, log, deadline)
        _run_logged([str(_venv_bin("python")), "-c", "import mlserver; print('mlserver', mlserver.__version__)"],
                    log, deadline)
        with log.open("a") as fh:
            fh.write(f"installed in {time.monotonic() - started:.1f}s\n")
        (VENV_DIR / _STAMP_NAME).write_text(stamp + "\n")
        return _venv_bin("mlserver")


_availability: list[str | None] = []


def mlserver_available() -> str | None:
    """``None`` if MLServer can run here, else the reason it cannot (for ``pytest.skip``).

    Builds the venv on first call (about half a minute); the answer is cached per process.
    """
    if not _availability:
        _availability.append(_check_available())
    return _availability[0]


def _check_available() -> str | None:
    if os.environ.get(_SKIP_ENV):
        return f"{_SKIP_ENV} is set"
    if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"):
        return "the MLServer harness reads listening ports from /proc (Linux only)"
    try:
        ensure_mlserver_venv()
    except MLServerUnavailable as exc:
        return f"MLServer venv unavailable: {exc}"
    except OSError as exc:
        return f"MLServer venv unavailable: {exc!r}"
    return None


def _clean_env() -> dict[str, str]:
    """Our environment without what would leak into MLServer's venv or settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MLSERVER_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _die_with_parent(parent_pid: int):
    """preexec_fn: SIGTERM MLServer if the test process dies, even by SIGKILL (Linux)."""

    def preexec() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _http_get(port: int, path: str, timeout: float = 2.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _is_http(port: int) -> bool:
    try:
        return _http_get(port, "/v2/health/live") == 200
    except (OSError, http.client.HTTPException):
        return False


def _model_names(models_dir: Path) -> list[str]:
    names = []
    for path in sorted(models_dir.rglob("model-settings.json")):
        names.append(json.loads(path.read_text())["name"])
    return names


class MLServerProcess:
    """A real MLServer on 127.0.0.1 with OS-chosen ports; use as a context manager.

    Attributes once started: ``http_port``, ``grpc_port``, ``http_url`` and ``grpc_url``
    (both ``127.0.0.1:PORT``, as tritonclient and TritonServer in tests/support/triton.py
    spell them), ``log_path`` (MLServer's stdout and stderr), ``models`` (names served),
    ``startup_seconds``, ``pid``.

    ``workdir``: where the models copy, settings.json and the log go; if not given, a
    temporary directory that is removed on a clean stop (kept if startup failed, so the log
    can be read).
    """

    def __init__(
        self,
        models_dir: Path | str = MODELS_DIR,
        *,
        workdir: Path | str | None = None,
        startup_timeout: float = 90.0,
        settings: dict | None = None,
    ) -> None:
        self.models_dir = Path(models_dir)
        self._given_workdir = Path(workdir) if workdir is not None else None
        self.startup_timeout = startup_timeout
        self.extra_settings = dict(settings or {})
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.models: list[str] = []
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen | None = None
        self._log_fh = None
        self._failed = False
        self.returncode: int | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep_workdir=exc_type is not None)

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("MLServerProcess already started")
        mlserver_bin = ensure_mlserver_venv()
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = self._given_workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="oip-mlserver-"))
        repo = self.workdir / "models"
        if repo.exists():
            shutil.rmtree(repo)
        shutil.copytree(self.models_dir, repo, ignore=shutil.ignore_patterns("__pycache__", "settings.json"))
        self.models = _model_names(repo)
        settings = {
            # As in production: with debug on, a 500 carries a text/plain traceback instead of
            # "Internal Server Error" (and uvicorn logs every request).
            "debug": False,
            "host": "127.0.0.1",
            "http_port": 0,
            "grpc_port": 0,
            "metrics_endpoint": None,  # no metrics server: exactly two listening ports
            "parallel_workers": 0,  # models in the server process: no worker pool to spawn
            "load_models_at_startup": True,
            "metrics_dir": str(self.workdir / ".metrics"),
            "environments_dir": str(self.workdir / ".envs"),
        }
        settings.update(self.extra_settings)
        (repo / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")

        self.log_path = self.workdir / "mlserver.log"
        self._log_fh = self.log_path.open("ab")
        started = time.monotonic()
        self._proc = subprocess.Popen(
            [str(mlserver_bin), "start", str(repo)],
            cwd=self.workdir,  # MLServer reads ./.env and writes ./.metrics relative to cwd
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=_clean_env(),
            start_new_session=True,  # a Ctrl-C in pytest's terminal goes to pytest, which stops us cleanly
            preexec_fn=_die_with_parent(os.getpid()),
        )
        try:
            self._discover_ports(started)
            self._wait_ready(started)
        except BaseException as exc:
            self._failed = True
            self.stop(keep_workdir=True)
            if not isinstance(exc, Exception):  # KeyboardInterrupt and the like
                raise
            raise RuntimeError(
                f"MLServer failed to start: {exc}\n--- {self.log_path} ---\n{_log_tail(self.log_path)}"
            ) from exc
        self.startup_seconds = time.monotonic() - started

    def _remaining(self, started: float) -> float:
        return max(0.1, self.startup_timeout - (time.monotonic() - started))

    def _discover_ports(self, started: float) -> None:
        assert self._proc is not None
        ports = wait_for_ports(self._proc, 2, timeout=self._remaining(started))
        if len(ports) != 2:
            raise RuntimeError(f"expected MLServer to listen on 2 ports, found {sorted(ports)}")

        def classify() -> tuple[int, int] | str:
            if self._proc.poll() is not None:
                return "exited"
            http = [p for p in ports if _is_http(p)]
            if len(http) == 1:
                return http[0], next(p for p in ports if p != http[0])
            return ()  # REST app may still be starting: poll again

        found = wait_for(classify, timeout=self._remaining(started), interval=0.1, what="MLServer REST port")
        if found == "exited":
            raise RuntimeError(f"MLServer exited with code {self._proc.returncode}")
        self.http_port, self.grpc_port = found

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None

        def ready() -> str | bool:
            if self._proc.poll() is not None:
                return "exited"
            if _http_get(self.http_port, "/v2/health/ready") != 200:
                return False
            # /v2/health/ready is true while the registry is still empty, so ask each model too.
            return all(_http_get(self.http_port, f"/v2/models/{name}/ready") == 200 for name in self.models)

        if wait_for(ready, timeout=self._remaining(started), interval=0.1, what="MLServer models ready") == "exited":
            raise RuntimeError(f"MLServer exited with code {self._proc.returncode} (a model may have failed to load)")

    def stop(self, *, keep_workdir: bool = False) -> None:
        """SIGTERM (MLServer shuts down gracefully), SIGKILL after 15 s."""
        if self._proc is not None:
            terminate(self._proc, timeout=15.0)
            self.returncode = self._proc.returncode
            self._proc = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        if (
            self.workdir is not None
            and self._given_workdir is None
            and not keep_workdir
            and not self._failed
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)
