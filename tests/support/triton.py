"""Run the real Triton Inference Server (the binary shipped in the ``nvidia-pytriton`` wheel) for tests.

We run ``tritonserver`` directly on our own model repository of Python-backend models
(``tests/models/triton``); pytriton's Python model wrapper is not used.

What it takes to make the wheel's binary work outside pytriton:

* The Python backend (``backends/python/libtriton_python.so``) launches ``triton_python_backend_stub``
  from its own backend directory, but the wheel keeps one stub per Python version under
  ``python_backend_stubs/<major.minor>/``. pytriton copies the whole server tree and the matching stub
  into a workspace; we build a small backend directory of symlinks instead
  (``<tmp>/backends/python/{libtriton_python.so, triton_python_backend_utils.py, triton_python_backend_stub}``)
  and pass ``--backend-directory``.
* The stub links ``libpython3.X.so``: ``LD_LIBRARY_PATH`` must start with the running interpreter's
  ``LIBDIR``, or the loader may pick another libpython (e.g. the distribution's) and the stub fails.
* The stub embeds Python and finds its ``sys.prefix`` from ``python3`` on ``PATH``; putting this
  interpreter's ``bin`` directory first (as pytriton does) makes the stub see this virtualenv's numpy.

Ports: Triton accepts ``--http-port 0 --grpc-port 0 --metrics-port 0`` and binds ephemeral ports, but
its command-line check refuses two services on the same *address string* and port ("The server cannot
listen to HTTP requests and GRPC requests at the same address and port 127.0.0.1:0"). So we spell the
loopback address three ways: HTTP on ``127.0.0.1``, gRPC on ``127.1`` and metrics on ``127.0.1``; all
three bind 127.0.0.1 (gRPC as a dual-stack ``[::ffff:127.0.0.1]`` socket). Triton logs the configured
port (``:0``), not the bound one, so we read the listening ports back from /proc (tests/support/procs.py)
and tell them apart by asking: the one answering ``GET /metrics`` with Prometheus text is metrics, the
one answering ``GET /v2/health/live`` is HTTP, and the remaining one must complete an HTTP/2 (gRPC)
channel handshake. No port is ever guessed, so there is no race with other processes.
"""

from __future__ import annotations

import ctypes
import http.client
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from functools import cache
from pathlib import Path
from typing import Self

from .procs import listening_ports, terminate, wait_for, wait_for_ports

__all__ = [
    "MODEL_REPOSITORY",
    "TritonServer",
    "TritonStartupError",
    "triton_available",
    "tritonserver_env",
]

MODEL_REPOSITORY = Path(__file__).resolve().parent.parent / "models" / "triton"

HOST = "127.0.0.1"
# Three spellings of 127.0.0.1, so Triton's "same address and port" check accepts port 0 for all three.
_HTTP_ADDRESS = "127.0.0.1"
_GRPC_ADDRESS = "127.1"
_METRICS_ADDRESS = "127.0.1"

_ERROR_LINE = re.compile(r"^E\d{4} ")
_PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
_PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


class TritonStartupError(RuntimeError):
    """Triton did not come up; the message ends with the tail of its log."""


# --------------------------------------------------------------------------------------------- locating


def _pytriton_dir() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _dist_dir() -> Path | None:
    pkg = _pytriton_dir()
    return None if pkg is None else pkg / "tritonserver"


def tritonserver_binary() -> Path | None:
    dist = _dist_dir()
    return None if dist is None else dist / "bin" / "tritonserver"


def _stub_path() -> Path | None:
    dist = _dist_dir()
    return (
        None if dist is None else dist / "python_backend_stubs" / _PY_VERSION / "triton_python_backend_stub"
    )


def _python_libdir() -> str:
    return str(sysconfig.get_config_var("LIBDIR") or "")


def _libs_dir() -> Path | None:
    """The wheel's bundled shared libraries (the binary has an RPATH to them; pytriton adds them too)."""
    pkg = _pytriton_dir()
    return None if pkg is None else pkg.parent / "nvidia_pytriton.libs"


def tritonserver_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ``tritonserver`` so that its Python backend stub starts with this interpreter."""
    env = dict(os.environ if base is None else base)
    lib_path = [_python_libdir()]
    libs = _libs_dir()
    if libs is not None and libs.is_dir():
        lib_path.append(str(libs))
    if env.get("LD_LIBRARY_PATH"):
        lib_path.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in lib_path if p)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH", "")) if p)
    # The stub must import this environment's numpy, not whatever a user site directory holds.
    env["PYTHONNOUSERSITE"] = "1"
    return env


@cache
def triton_available() -> str | None:
    """``None`` when the bundled ``tritonserver`` can run here, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return f"tritonserver from nvidia-pytriton runs on Linux only (this is {sys.platform})"
    binary = tritonserver_binary()
    if binary is None:
        return "nvidia-pytriton is not installed"
    if not os.access(binary, os.X_OK):
        return f"tritonserver binary missing or not executable: {binary}"
    stub = _stub_path()
    if stub is None or not stub.is_file():
        return f"nvidia-pytriton has no Python backend stub for Python {_PY_VERSION} ({stub})"
    libdir = _python_libdir()
    ldlibrary = sysconfig.get_config_var("LDLIBRARY") or f"libpython{_PY_VERSION}.so"
    if not libdir or not any(Path(libdir).glob(f"libpython{_PY_VERSION}*.so*")):
        return f"no shared {ldlibrary} in {libdir!r}; the Python backend stub needs a shared libpython"
    if importlib.util.find_spec("numpy") is None:
        return "numpy is not installed; the Python backend stub needs it"
    try:
        proc = subprocess.run(
            [str(binary), "--help"],
            env=tritonserver_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot execute {binary}: {exc!r}"
    if "--model-repository" not in proc.stdout + proc.stderr:
        tail = (proc.stdout + proc.stderr)[-2000:]
        return f"{binary} --help failed with exit code {proc.returncode}: {tail}"
    return None


def _make_backend_dir(root: Path) -> Path:
    """``root/backends/python`` holding the Python backend and the stub for this interpreter (symlinks)."""
    dist = _dist_dir()
    stub = _stub_path()
    assert dist is not None and stub is not None
    backends = root / "backends"
    python_dir = backends / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in _PYTHON_BACKEND_FILES:
        _symlink(dist / "backends" / "python" / name, python_dir / name)
    _symlink(stub, python_dir / "triton_python_backend_stub")
    return backends


def _symlink(src: Path, dst: Path) -> None:
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    dst.symlink_to(src)


def _terminate_with_parent(parent_pid: int) -> None:
    """preexec_fn: SIGTERM Triton when the process that started it dies, even by SIGKILL (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


# ------------------------------------------------------------------------------------------- probing


def _http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _grpc_handshake(port: int, timeout: float = 5.0) -> bool:
    import grpc  # type: ignore[import-untyped]

    channel = grpc.insecure_channel(f"{HOST}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def _identify_ports(ports: set[int]) -> tuple[int, int, int]:
    """Return (http, grpc, metrics) among the three ports Triton listens on."""
    http_port = metrics_port = None
    rest = []
    for port in sorted(ports):
        metrics = _http_get(port, "/metrics")
        if metrics is not None and metrics[0] == 200 and b"# HELP" in metrics[1]:
            metrics_port = port
            continue
        live = _http_get(port, "/v2/health/live")
        if live is not None and live[0] == 200:
            http_port = port
            continue
        rest.append(port)
    if http_port is None or metrics_port is None or len(rest) != 1:
        raise TritonStartupError(
            f"cannot tell Triton's ports apart among {sorted(ports)}: http={http_port} metrics={metrics_port} "
            f"unidentified={rest}"
        )
    grpc_port = rest[0]
    if not _grpc_handshake(grpc_port):
        raise TritonStartupError(
            f"port {grpc_port} (the one left for gRPC) does not complete an HTTP/2 handshake"
        )
    return http_port, grpc_port, metrics_port


# -------------------------------------------------------------------------------------------- server


class TritonServer:
    """A ``tritonserver`` process on 127.0.0.1 with ephemeral HTTP, gRPC and metrics ports.

    >>> with TritonServer() as triton:  # doctest: +SKIP
    ...     triton.http_url, triton.grpc_url   # "127.0.0.1:<port>"

    ``model_control_mode`` defaults to ``explicit`` with every model loaded at startup
    (``--load-model=*``), so tests can also exercise the repository load/unload API.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] = MODEL_REPOSITORY,
        *,
        model_control_mode: str = "explicit",
        strict_readiness: bool = True,
        log_verbose: int = 0,
        extra_args: list[str] | tuple[str, ...] = (),
        startup_timeout: float = 120.0,
    ) -> None:
        self.model_repository = Path(model_repository)
        self.model_control_mode = model_control_mode
        self.strict_readiness = strict_readiness
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout

        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.startup_seconds: float | None = None
        self._own_workdir = False

    # ---------------------------------------------------------------------------------- addresses

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self._port(self.http_port)}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self._port(self.grpc_port)}"

    @property
    def metrics_url(self) -> str:
        return f"{HOST}:{self._port(self.metrics_port)}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("Triton is not running")
        return self.proc.pid

    @staticmethod
    def _port(port: int | None) -> int:
        if port is None:
            raise RuntimeError("Triton is not running")
        return port

    # ---------------------------------------------------------------------------------- lifecycle

    def command(self, backend_directory: Path) -> list[str]:
        binary = tritonserver_binary()
        assert binary is not None
        cmd = [
            str(binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_directory}",
            f"--model-control-mode={self.model_control_mode}",
            "--disable-auto-complete-config",  # configs are complete; skips one stub launch per model
            f"--strict-readiness={'true' if self.strict_readiness else 'false'}",
            "--exit-on-error=true",
            "--allow-http=true",
            "--allow-grpc=true",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            f"--http-address={_HTTP_ADDRESS}",
            "--http-port=0",
            f"--grpc-address={_GRPC_ADDRESS}",
            "--grpc-port=0",
            f"--metrics-address={_METRICS_ADDRESS}",
            "--metrics-port=0",
            f"--log-verbose={self.log_verbose}",
            "--exit-timeout-secs=10",
        ]
        if self.model_control_mode == "explicit":
            cmd.append("--load-model=*")
        return cmd + self.extra_args

    def start(self, tmp_path: str | os.PathLike[str] | None = None) -> TritonServer:
        """Launch Triton and wait until it is ready; ``tmp_path`` holds the backend dir and the log."""
        if self.proc is not None:
            raise RuntimeError("Triton is already running")
        reason = triton_available()
        if reason is not None:
            raise TritonStartupError(reason)
        if tmp_path is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="tritonserver-"))
            self._own_workdir = True
        else:
            self.workdir = Path(tmp_path)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._own_workdir = False
        self.log_path = self.workdir / "tritonserver.log"
        cmd = self.command(_make_backend_dir(self.workdir))

        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only use it from the main thread.
        preexec = None
        if threading.current_thread() is threading.main_thread():
            parent = os.getpid()
            preexec = lambda: _terminate_with_parent(parent)
        began = time.monotonic()
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=tritonserver_env(),
                cwd=self.workdir,
                start_new_session=True,  # Ctrl-C reaches only the test runner, whose teardown stops Triton
                preexec_fn=preexec,
            )
        try:
            remaining = lambda: max(1.0, self.startup_timeout - (time.monotonic() - began))
            ports = wait_for_ports(self.proc, 3, timeout=remaining())
            if len(ports) != 3:
                raise TritonStartupError(f"expected 3 listening ports, found {sorted(ports)}")
            self.http_port, self.grpc_port, self.metrics_port = _identify_ports(ports)
            wait_for(self._ready_or_exited, timeout=remaining(), what="Triton /v2/health/ready == 200")
            if self.proc.poll() is not None:
                raise TritonStartupError(f"tritonserver exited with {self.proc.returncode}")
            self.startup_seconds = time.monotonic() - began
        except (KeyboardInterrupt, SystemExit):
            self._stop_process()
            self._cleanup_workdir()
            raise
        except Exception as exc:
            self._stop_process()
            message = (
                f"tritonserver failed to start: {exc}\n--- errors in {self.log_path} ---\n{self.log_errors()}"
                f"\n--- tail of {self.log_path} ---\n{self.log_tail()}"
            )
            self._cleanup_workdir()
            raise TritonStartupError(message) from exc
        return self

    def _ready_or_exited(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return True  # wait_for would swallow an exception and keep polling
        answer = _http_get(self._port(self.http_port), "/v2/health/ready")
        return answer is not None and answer[0] == 200

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def listening_ports(self) -> set[int]:
        return listening_ports(self.pid)

    def log_tail(self, max_bytes: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "<no log>"
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode(errors="replace")

    def log_errors(self, max_lines: int = 40) -> str:
        """Triton's error lines (``E<date>``) and Python stub failures, which the status tables bury."""
        if self.log_path is None or not self.log_path.exists():
            return "<no log>"
        lines = self.log_path.read_text(errors="replace").splitlines()
        picked = [
            line
            for line in lines
            if (
                _ERROR_LINE.match(line) or "Failed to" in line or "Error" in line or line.startswith("error:")
            )
            and "CudaDriverHelper" not in line  # logged on every CPU-only start
        ]
        return "\n".join(picked[-max_lines:]) or "<none>"

    def stop(self) -> int | None:
        """Stop Triton (SIGTERM, SIGKILL if it hangs); return its exit code."""
        code = self._stop_process()
        self.http_port = self.grpc_port = self.metrics_port = None
        self._cleanup_workdir()
        return code

    def _stop_process(self) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        terminate(proc, timeout=30.0)
        return proc.returncode

    def _cleanup_workdir(self) -> None:
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            self.log_path = None

    def __enter__(self) -> Self:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        if self.proc is None:
            return "<TritonServer stopped>"
        return (
            f"<TritonServer pid={self.proc.pid} http={self.http_port} grpc={self.grpc_port} "
            f"metrics={self.metrics_port} log={self.log_path}>"
        )
