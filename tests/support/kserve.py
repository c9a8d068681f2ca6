"""Run KServe's ModelServer (PyPI ``kserve``) and KServe's Python clients for tests.

KServe lives in its own virtual environment, ``.kserve-venv`` at the repository root
(git-ignored), built here on first use (tests/support/venvbuild.py: uv or pip) from
``tests/support/kserve-requirements.txt``, bounded in time and logged to
``.kserve-venv/install.log``; a stamp file records the requirements (and Python version) it was
built from, and a change rebuilds it. Its own venv, because kserve cannot share a process with
tritonclient: both register ``inference.*`` protobuf messages (kserve's grpc_predict_v2.proto,
tritonclient's grpc_service.proto) in protobuf's default descriptor pool, and the second import
fails with "duplicate symbol 'inference.ServerLiveRequest'". So KServe's clients
(``InferenceRESTClient``, ``InferenceGRPCClient``) also run there, behind
:class:`KServeClients`: one long-lived ``tests/support/kserve_client.py`` process that takes
JSON lines on stdin and answers JSON lines on stdout.

:class:`KServeProcess` starts ``tests/models/kserve/serve.py`` (KServe's ``ModelServer`` with the
models of ``tests/models/kserve/oip_kserve_models.py``) with ``--http_port 0 --grpc_port 0``.
KServe binds every interface and has no option for it; the launcher narrows both listeners to
127.0.0.1 (see its docstring) and :meth:`KServeProcess.start` checks from /proc that every
listening socket of the process is on loopback. The two ports it bound are read back from /proc
(tests/support/procs.py); the one that answers ``GET /v2/health/live`` is REST, the other gRPC.
It then waits until the server and every model report ready.
"""
from __future__ import annotations

import base64
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from .procs import terminate, terminate_with_parent, wait_for, wait_for_ports
from .venvbuild import venv_commands

__all__ = [
    "DATATYPES",
    "MODELS",
    "VENV_DIR",
    "KServeClients",
    "KServeProcess",
    "KServeUnavailable",
    "decode_array",
    "encode_array",
    "ensure_kserve_venv",
    "kserve_available",
    "listening_addresses",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = Path(os.environ.get("OIP_KSERVE_VENV", REPO_ROOT / ".kserve-venv"))
REQUIREMENTS = Path(__file__).with_name("kserve-requirements.txt")
MODELS_DIR = REPO_ROOT / "tests" / "models" / "kserve"
LAUNCHER = MODELS_DIR / "serve.py"
CLIENT_DRIVER = Path(__file__).with_name("kserve_client.py")

INSTALL_TIMEOUT = float(os.environ.get("OIP_KSERVE_INSTALL_TIMEOUT", "900"))
_STAMP_NAME = ".oip-requirements.sha256"
_SKIP_ENV = "OIP_SKIP_KSERVE"

# What tests/models/kserve/oip_kserve_models.py serves (kept in step with it by a test).
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]
MODELS = [f"identity_{dt}" for dt in DATATYPES] + ["add_sub", "echo_params", "fail", "crash"]


class KServeUnavailable(RuntimeError):
    """KServe cannot run here; the message says why."""


def _venv_python() -> Path:
    return VENV_DIR / "bin" / "python"


def _stamp() -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


def _venv_is_current(stamp: str) -> bool:
    try:
        return (VENV_DIR / _STAMP_NAME).read_text().strip() == stamp and _venv_python().exists()
    except OSError:
        return False


def _log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return "(no log)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _clean_env() -> dict[str, str]:
    """Our environment without what would leak into KServe's venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_logged(cmd: list[str], log: Path, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise KServeUnavailable(f"installing KServe took longer than {INSTALL_TIMEOUT:.0f}s; see {log}")
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            rc = subprocess.run(
                cmd, check=False, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=remaining, env=_clean_env(),
            ).returncode
        except subprocess.TimeoutExpired:
            raise KServeUnavailable(f"installing KServe took longer than {INSTALL_TIMEOUT:.0f}s; see {log}") from None
    if rc != 0:
        raise KServeUnavailable(f"{cmd[0]} ... failed with exit code {rc}; see {log}:\n{_log_tail(log, 15)}")


def ensure_kserve_venv() -> Path:
    """Create or refresh .kserve-venv if needed; return the path of its ``python``.

    Safe against concurrent test processes (an flock serialises the install).
    Raises :class:`KServeUnavailable` if the venv cannot be built.
    """
    stamp = _stamp()
    if _venv_is_current(stamp):
        return _venv_python()
    lock_name = "oip-kserve-venv-" + hashlib.sha256(str(VENV_DIR).encode()).hexdigest()[:16] + ".lock"
    with open(Path(tempfile.gettempdir()) / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _venv_is_current(stamp):  # another process built it while we waited
            return _venv_python()
        started = time.monotonic()
        deadline = started + INSTALL_TIMEOUT
        if VENV_DIR.exists():
            shutil.rmtree(VENV_DIR)
        VENV_DIR.mkdir(parents=True)
        log = VENV_DIR / "install.log"
        for cmd in venv_commands(VENV_DIR, REQUIREMENTS):
            _run_logged(cmd, log, deadline)
        _run_logged(
            [str(_venv_python()), "-c",
             "import importlib.metadata as m, kserve, kserve.inference_client; print('kserve', m.version('kserve'))"],
            log, deadline,
        )
        with log.open("a") as fh:
            fh.write(f"installed in {time.monotonic() - started:.1f}s\n")
        (VENV_DIR / _STAMP_NAME).write_text(stamp + "\n")
        return _venv_python()


_availability: list[str | None] = []


def kserve_available() -> str | None:
    """``None`` if KServe can run here, else the reason it cannot (for ``pytest.skip``).

    Builds the venv on first call (seconds with uv, about a minute with pip); the answer is cached per process.
    """
    if not _availability:
        _availability.append(_check_available())
    return _availability[0]


def _check_available() -> str | None:
    if os.environ.get(_SKIP_ENV):
        return f"{_SKIP_ENV} is set"
    if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"):
        return "the KServe harness reads listening ports from /proc (Linux only)"
    try:
        ensure_kserve_venv()
    except KServeUnavailable as exc:
        return f"KServe venv unavailable: {exc}"
    except OSError as exc:
        return f"KServe venv unavailable: {exc!r}"
    return None


def _preexec(parent_pid: int):
    def preexec() -> None:
        terminate_with_parent(parent_pid)

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


_LOOPBACK = {
    "0100007F",  # 127.0.0.1 (/proc/net/tcp)
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1 (/proc/net/tcp6)
    "00000000000000000000000001000000",  # ::1
}


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(hex local address as /proc/net/tcp{,6} writes it, port) of ``pid``'s listening sockets."""
    inodes = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    addr, port = parts[1].rsplit(":", 1)
                    found.append((addr, int(port, 16)))
    return found


class KServeProcess:
    """A real KServe ModelServer on 127.0.0.1 with OS-chosen ports; use as a context manager.

    Attributes once started: ``http_port``, ``grpc_port``, ``http_url`` and ``grpc_url``
    (``127.0.0.1:PORT``), ``log_path``, ``models``, ``startup_seconds``, ``pid``.
    ``extra_args``: more ModelServer arguments (its CLI's names, e.g.
    ``["--grpc_max_receive_message_length", "16777216"]``).
    """

    def __init__(self, *, workdir: Path | str | None = None, startup_timeout: float = 90.0,
                 extra_args: list[str] | None = None) -> None:
        self._given_workdir = Path(workdir) if workdir is not None else None
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.models: list[str] = list(MODELS)
        self.startup_seconds: float | None = None
        self.returncode: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log_fh = None
        self._failed = False

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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(keep_workdir=exc_type is not None)

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("KServeProcess already started")
        python = ensure_kserve_venv()
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = self._given_workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="oip-kserve-"))
        self.log_path = self.workdir / "kserve.log"
        self._log_fh = self.log_path.open("ab")
        started = time.monotonic()
        self._proc = subprocess.Popen(
            [str(python), str(LAUNCHER), "--http_port", "0", "--grpc_port", "0", *self.extra_args],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=_clean_env(),
            start_new_session=True,  # a Ctrl-C in pytest's terminal goes to pytest, which stops us cleanly
            preexec_fn=_preexec(os.getpid()),
        )
        try:
            self._discover_ports(started)
            self._check_loopback()
            self._wait_ready(started)
        except BaseException as exc:
            self._failed = True
            self.stop(keep_workdir=True)
            if not isinstance(exc, Exception):
                raise
            raise RuntimeError(
                f"KServe failed to start: {exc}\n--- {self.log_path} ---\n{_log_tail(self.log_path)}"
            ) from exc
        self.startup_seconds = time.monotonic() - started

    def _remaining(self, started: float) -> float:
        return max(0.1, self.startup_timeout - (time.monotonic() - started))

    def _discover_ports(self, started: float) -> None:
        assert self._proc is not None
        ports = wait_for_ports(self._proc, 2, timeout=self._remaining(started))
        if len(ports) != 2:
            raise RuntimeError(f"expected KServe to listen on 2 ports, found {sorted(ports)}")

        def classify() -> tuple[int, int] | str | tuple[()]:
            if self._proc.poll() is not None:
                return "exited"
            http = [p for p in ports if _is_http(p)]
            if len(http) == 1:
                return http[0], next(p for p in ports if p != http[0])
            return ()

        found = wait_for(classify, timeout=self._remaining(started), interval=0.1, what="KServe REST port")
        if found == "exited":
            raise RuntimeError(f"KServe exited with code {self._proc.returncode}")
        self.http_port, self.grpc_port = found

    def _check_loopback(self) -> None:
        assert self._proc is not None
        wide = [(a, p) for a, p in listening_addresses(self._proc.pid) if a not in _LOOPBACK]
        if wide:
            raise RuntimeError(f"KServe listens beyond loopback: {wide} (tests/models/kserve/serve.py)")

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None

        def ready() -> str | bool:
            if self._proc.poll() is not None:
                return "exited"
            if _http_get(self.http_port, "/v2/health/ready") != 200:
                return False
            return all(_http_get(self.http_port, f"/v2/models/{name}/ready") == 200 for name in self.models)

        if wait_for(ready, timeout=self._remaining(started), interval=0.1, what="KServe models ready") == "exited":
            raise RuntimeError(f"KServe exited with code {self._proc.returncode}")

    def stop(self, *, keep_workdir: bool = False) -> None:
        """SIGTERM (KServe shuts down gracefully), SIGKILL after 15 s."""
        if self._proc is not None:
            terminate(self._proc, timeout=15.0)
            self.returncode = self._proc.returncode
            self._proc = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        if self.workdir is not None and self._given_workdir is None and not keep_workdir and not self._failed:
            shutil.rmtree(self.workdir, ignore_errors=True)


# --- KServe's clients, driven in .kserve-venv ------------------------------------------------


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """A numpy array as JSON for kserve_client.py: BYTES as base64 per element, others as
    little-endian raw bytes in base64."""
    if array.dtype == object:
        items = [x if isinstance(x, bytes) else str(x).encode() for x in array.ravel().tolist()]
        return {"shape": list(array.shape), "bytes": [base64.b64encode(x).decode() for x in items]}
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"shape": list(array.shape), "dtype": little.dtype.str,
            "raw": base64.b64encode(np.ascontiguousarray(little).tobytes()).decode()}


def decode_array(doc: dict[str, Any]) -> np.ndarray:
    if "bytes" in doc:
        out = np.empty(len(doc["bytes"]), dtype=object)
        out[:] = [base64.b64decode(x) for x in doc["bytes"]]
        return out.reshape(doc["shape"])
    return np.frombuffer(base64.b64decode(doc["raw"]), dtype=np.dtype(doc["dtype"])).reshape(doc["shape"])


class KServeClients:
    """KServe's ``InferenceRESTClient`` and ``InferenceGRPCClient``, in a child process.

    ``call(op, **args)`` sends one JSON line to tests/support/kserve_client.py (run by
    .kserve-venv's Python) and returns its JSON answer: ``{"ok": true, ...}`` or ``{"ok": false,
    "error": <exception class>, "status": <HTTP status or gRPC code name>, "message": ...}``.
    Calls are serialised; each waits at most ``timeout`` seconds. Use as a context manager.
    """

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stderr_path: Path | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        python = ensure_kserve_venv()
        fd, name = tempfile.mkstemp(prefix="oip-kserve-client-", suffix=".log")
        os.close(fd)
        self._stderr_path = Path(name)
        with open(self._stderr_path, "wb") as err:
            self._proc = subprocess.Popen(
                [str(python), str(CLIENT_DRIVER)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=_clean_env(),
                preexec_fn=_preexec(os.getpid()),
            )
        hello = self.call("ping")
        if not hello.get("ok"):
            raise RuntimeError(f"kserve_client.py did not start: {hello}")
        self.kserve_version = hello["kserve"]

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        line = json.dumps({"op": op, **args}).encode() + b"\n"
        with self._lock:
            self._proc.stdin.write(line)
            self._proc.stdin.flush()
            answer: list[bytes] = []
            reader = threading.Thread(target=lambda: answer.append(self._proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(self.timeout)
            if reader.is_alive() or not answer or not answer[0]:
                tail = _log_tail(self._stderr_path)
                self.stop()
                raise RuntimeError(f"kserve_client.py gave no answer to {op}:\n{tail}")
        return json.loads(answer[0])

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
            terminate(self._proc, timeout=5.0)
            self._proc = None
        if self._stderr_path is not None:
            self._stderr_path.unlink(missing_ok=True)
            self._stderr_path = None
