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

Fleet tests kill a server and bring it back where clients expect it: ``kill()`` SIGKILLs Triton and
every Python-backend stub it started (they share its session), and ``restart()`` starts it again on
the ports it had, now passed explicitly. Those ports were ephemeral, so another process may hold one
for a moment; a restart whose bind fails is retried for a bounded time. Models can be loaded after
startup (``startup_models=()`` starts with none, then ``load_model`` / ``load_models_async``): Triton
only opens its ports after the models named at startup are loaded, so this is how a server is live
with its models still loading.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
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
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Self

from .procs import (
    dies_with_parent,
    listening_ports,
    tcp_sockets,
    terminate,
    terminate_with_parent,
    wait_for,
    wait_for_ports,
)

__all__ = [
    "MODEL_REPOSITORY",
    "ModelLoader",
    "TritonRepositoryError",
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

    bind_failed = False  # set when a fixed-port (re)start failed to bind: restart() retries those
    returncode: int | None = None  # tritonserver's exit status, when it exited


class TritonRepositoryError(RuntimeError):
    """A model repository request (load, unload, index) failed: ``status`` is the HTTP status (an int)
    or the gRPC code name (a str), ``body`` the HTTP body or the gRPC details."""

    def __init__(self, what: str, status: int | str, body: bytes) -> None:
        self.status = status
        self.body = body
        transport = "HTTP" if isinstance(status, int) else "gRPC"
        super().__init__(f"{what}: {transport} {status} {body.decode(errors='replace')[:500]}")


# A failed bind as tritonserver logs it, e.g. "failed to start HTTP service: Unavailable - Socket
# '127.0.0.1:35243' already in use" (likewise GRPC and Metrics); a restart retries those.
_BIND_FAILURE = re.compile(r"Socket '[^']*' already in use|Address already in use")


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


def _http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """One HTTP request to 127.0.0.1:port; connection errors propagate (OSError)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------ process tree


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _session_members(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not zombies (a zombie holds no files or sockets).

    Triton is started with ``start_new_session=True``, so its pid is the session id, shared by every
    Python-backend stub it launches, also after they are orphaned and re-parented. While any member
    lives, the kernel does not hand the id to a new process.
    """
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None and fields[3] == str(sid) and fields[0] not in ("Z", "X"):
            members.append(int(name))
    return members


def _shm_files(pids: Sequence[int]) -> set[str]:
    """Files under /dev/shm that ``pids`` have open or mapped (the Python backend's shared memory)."""
    found: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/shm/"):
                    found.add(target.removesuffix(" (deleted)"))
            with open(f"/proc/{pid}/maps") as fh:
                for line in fh:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                        found.add(fields[5].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


# Triton's gRPC server looks for the key of --grpc-restricted-protocol=<protocols>:<key>=<value> under
# this prefix: a request with plain ``<key>`` metadata is refused (UNAVAILABLE, "This protocol is
# restricted, expecting header 'triton-grpc-protocol-<key>'").
_GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"


def _grpc_repository_call(
    port: int, method: str, request: object, headers: Mapping[str, str] | None, timeout: float, what: str
) -> object:
    """One call of Triton's gRPC repository API; ``headers`` as for HTTP (the restricted-key prefix is added)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    metadata = tuple(
        (k if k.lower().startswith(_GRPC_RESTRICTED_PREFIX) else _GRPC_RESTRICTED_PREFIX + k, v)
        for k, v in (headers or {}).items()
    )
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            return getattr(stub, method)(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as exc:
            raise TritonRepositoryError(what, exc.code().name, (exc.details() or "").encode()) from exc


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

# /proc/net/tcp states of sockets that keep Triton from binding a port again: a listener, or a live
# connection whose local port it is (some client's, e.g. an outgoing connection that got the port as
# its ephemeral one). The dead Triton's own orphans (FIN_WAIT*, TIME_WAIT, LAST_ACK, CLOSING) do not:
# they inherited SO_REUSEADDR from Triton's listeners, which set it (a restart binds over them).
_BLOCKING_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def _ports_held(ports: Sequence[int]) -> dict[int, set[str]]:
    """Ports among ``ports`` that a blocking socket on this host holds as its local port, with its states."""
    wanted = set(ports)
    held: dict[int, set[str]] = {}
    for port, state, _ in tcp_sockets():
        if port in wanted and state in _BLOCKING_STATES:
            held.setdefault(port, set()).add(_BLOCKING_STATES[state])
    return held


def _end_session(proc: subprocess.Popen[bytes], timeout: float, *, graceful: bool) -> None:
    """End tritonserver and every process of its session (the Python-backend stubs); remove their /dev/shm files.

    ``graceful``: SIGTERM (SIGKILL after ``timeout``), then SIGKILL for any stub left behind; else
    SIGKILL for all at once. Waits (bounded) until none is left. A SIGKILLed Triton cannot unlink the
    Python backend's shared-memory regions, so the files its processes had open are unlinked here, once
    no process is left to use them. Only pids seen in the session before tritonserver was reaped are
    waited for or signalled: after that its pid (the session id) may belong to someone else.
    """
    sid = proc.pid
    members = set(_session_members(sid))
    shm = _shm_files(sorted(members))
    if graceful:
        terminate(proc, timeout=timeout)
    else:
        try:
            os.killpg(sid, signal.SIGKILL)  # the stubs inherit Triton's process group
        except ProcessLookupError:
            pass
        members.update(_session_members(sid))  # tritonserver is not reaped yet: the id is still its own
        proc.wait(timeout=timeout)
    members.discard(sid)
    for pid in members.intersection(_session_members(sid)):  # any that moved to a group of their own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(
        lambda: not members.intersection(_session_members(sid)),
        timeout=timeout,
        what=f"Triton's stubs {sorted(members)} gone",
    )
    for path in shm:
        try:
            os.unlink(path)
        except OSError:
            pass


class ModelLoader(threading.Thread):
    """Loads models through Triton's repository API in the background (``TritonServer.load_models_async``).

    ``seconds[name]`` is how long each load request took, ``errors[name]`` why one failed;
    ``result(timeout)`` joins (bounded) and raises if any load failed.
    """

    def __init__(
        self,
        server: TritonServer,
        names: Sequence[str],
        *,
        headers: Mapping[str, str] | None,
        timeout: float,
        parallel: bool,
        transport: str,
    ) -> None:
        super().__init__(name=f"triton-load-{','.join(names)}", daemon=True)
        self.names = list(names)
        self.seconds: dict[str, float] = {}
        self.errors: dict[str, BaseException] = {}
        self._server = server
        # The port now: a load still running when the server is killed fails instead of following a restart.
        self._port = server._port(server.grpc_port if transport == "grpc" else server.http_port)
        self._transport = transport
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._parallel = parallel

    def run(self) -> None:
        if not self._parallel:
            for name in self.names:
                self._load(name)
            return
        threads = [threading.Thread(target=self._load, args=(n,), daemon=True) for n in self.names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self._timeout + 5.0)

    def _load(self, name: str) -> None:
        try:
            self.seconds[name] = self._server.load_model(
                name, headers=self._headers, timeout=self._timeout, transport=self._transport, port=self._port
            )
        except BaseException as exc:
            self.errors[name] = exc

    def result(self, timeout: float) -> dict[str, float]:
        """Wait (at most ``timeout`` s) for every load; return seconds per model or raise the first error."""
        self.join(timeout)
        unanswered = [n for n in self.names if n not in self.seconds and n not in self.errors]
        if self.is_alive() or unanswered:
            raise TimeoutError(f"loading {unanswered or self.names} still running after {timeout}s")
        if self.errors:
            name, exc = next(iter(self.errors.items()))
            raise RuntimeError(f"loading {sorted(self.errors)} failed; {name}: {exc}") from exc
        return dict(self.seconds)


class TritonServer:
    """A ``tritonserver`` process on 127.0.0.1 with ephemeral HTTP, gRPC and metrics ports.

    >>> with TritonServer() as triton:  # doctest: +SKIP
    ...     triton.http_url, triton.grpc_url   # "127.0.0.1:<port>"

    ``model_control_mode`` defaults to ``explicit`` with every model loaded at startup
    (``--load-model=*``), so tests can also exercise the repository load/unload API.
    ``startup_models`` names the models to load at startup instead (``()``: none; ``None``: all).
    ``kill()`` then ``restart()`` brings the server back on the same ports; ``restart`` uses
    ``startup_models`` as it is then, so a test can set it to ``()`` first and load models afterwards.
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
        startup_models: Sequence[str] | None = None,
    ) -> None:
        self.model_repository = Path(model_repository)
        self.model_control_mode = model_control_mode
        self.strict_readiness = strict_readiness
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.startup_models = None if startup_models is None else list(startup_models)

        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.startup_seconds: float | None = None
        self.launches = 0  # tritonserver processes started (restart attempts included); names the logs
        self._own_workdir = False
        self._backends: Path | None = None

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

    def command(self, backend_directory: Path, ports: tuple[int, int, int] | None = None) -> list[str]:
        """The command line; ``ports`` (http, grpc, metrics) fixes the ports, else all three are 0."""
        binary = tritonserver_binary()
        assert binary is not None
        http_port, grpc_port, metrics_port = ports or (0, 0, 0)
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
            f"--http-port={http_port}",
            f"--grpc-address={_GRPC_ADDRESS}",
            f"--grpc-port={grpc_port}",
            f"--metrics-address={_METRICS_ADDRESS}",
            f"--metrics-port={metrics_port}",
            f"--log-verbose={self.log_verbose}",
            "--exit-timeout-secs=10",
        ]
        if self.model_control_mode == "explicit":
            if self.startup_models is None:
                cmd.append("--load-model=*")
            else:
                cmd.extend(f"--load-model={name}" for name in self.startup_models)
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
        self._backends = _make_backend_dir(self.workdir)
        try:
            self._launch(None, time.monotonic() + self.startup_timeout)
        except BaseException:
            self._cleanup_workdir()
            raise
        return self

    def restart(self, *, bind_timeout: float = 30.0) -> TritonServer:
        """Start Triton again, after ``kill()``, on the HTTP, gRPC and metrics ports it had.

        The ports were ephemeral ones: right after a kill another socket may briefly hold one
        (the dead server's TIME_WAIT and FIN_WAIT connections do not count: Triton binds over them).
        Each attempt first waits (bounded by ``bind_timeout``) until no listener or live connection
        holds them; an attempt that still fails to bind ("failed to start HTTP/GRPC/Metrics service:
        Unavailable - Socket '...' already in use") is retried until ``bind_timeout`` has passed.
        Waits for ready like ``start``.
        """
        if self.proc is not None:
            raise RuntimeError("Triton is running; kill() or stop() it before restart()")
        if self.workdir is None or self._backends is None or None in (
            self.http_port, self.grpc_port, self.metrics_port
        ):
            raise RuntimeError("restart() needs a server that was started and then killed")
        ports = (self._port(self.http_port), self._port(self.grpc_port), self._port(self.metrics_port))
        bind_deadline = time.monotonic() + bind_timeout
        crashes = 0
        while True:
            try:
                wait_for(lambda: not _ports_held(ports), timeout=max(0.1, bind_deadline - time.monotonic()))
            except TimeoutError:
                raise TritonStartupError(
                    f"ports {ports} still held after {bind_timeout}s: {_ports_held(ports)}"
                ) from None
            try:
                self._launch(ports, time.monotonic() + self.startup_timeout)
                return self
            except TritonStartupError as exc:
                # Triton 2.51 restarted right after a SIGKILL of its predecessor now and then
                # dies at once with SIGSEGV, before writing a line of log (seen in CI runs).
                # That is Triton's, not what the caller tests: try again, twice at most.
                crashed = exc.returncode == -signal.SIGSEGV
                if crashed and crashes < 2:
                    crashes += 1
                    continue
                if not exc.bind_failed or time.monotonic() > bind_deadline:
                    raise

    def _launch(self, ports: tuple[int, int, int] | None, deadline: float) -> None:
        assert self.workdir is not None and self._backends is not None
        self.launches += 1
        suffix = "" if self.launches == 1 else f".{self.launches}"
        self.log_path = self.workdir / f"tritonserver{suffix}.log"
        cmd = self.command(self._backends, ports)

        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only use it from the main thread.
        preexec = None
        if threading.current_thread() is threading.main_thread():
            guarded = dies_with_parent(cmd)
            if guarded is not None:
                cmd = guarded
            else:
                parent = os.getpid()
                preexec = lambda: terminate_with_parent(parent)
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
                start_new_session=True,  # Ctrl-C reaches only the test runner; kill() finds the stubs by session
                preexec_fn=preexec,
            )
        try:
            remaining = lambda: max(1.0, deadline - time.monotonic())
            found = wait_for_ports(self.proc, 3, timeout=remaining())
            if len(found) != 3:
                raise TritonStartupError(f"expected 3 listening ports, found {sorted(found)}")
            if ports is None:
                self.http_port, self.grpc_port, self.metrics_port = _identify_ports(found)
            elif found != set(ports):
                raise TritonStartupError(f"asked for ports {sorted(ports)}, listening on {sorted(found)}")
            wait_for(self._ready_or_exited, timeout=remaining(), what="Triton /v2/health/ready == 200")
            if self.proc.poll() is not None:
                raise TritonStartupError(f"tritonserver exited with {self.proc.returncode}")
            self.startup_seconds = time.monotonic() - began
        except (KeyboardInterrupt, SystemExit):
            self._stop_process()
            raise
        except Exception as exc:
            returncode = self.proc.poll() if self.proc is not None else None
            self._stop_process()
            errors = self.log_errors()
            message = (
                f"tritonserver failed to start: {exc}\n--- errors in {self.log_path} ---\n{errors}"
                f"\n--- tail of {self.log_path} ---\n{self.log_tail()}"
            )
            error = TritonStartupError(message)
            error.bind_failed = ports is not None and bool(_BIND_FAILURE.search(errors))
            error.returncode = returncode
            raise error from exc

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

    def processes(self) -> list[int]:
        """Live pids of tritonserver and its Python-backend stubs (its session)."""
        return [] if self.proc is None else _session_members(self.proc.pid)

    def shared_memory(self) -> set[str]:
        """/dev/shm files that tritonserver and its stubs have open or mapped (the Python backend's)."""
        return _shm_files(self.processes())

    def kill(self, timeout: float = 30.0) -> int | None:
        """SIGKILL tritonserver and every stub it launched; wait until all are gone.

        Keeps the ports and the work dir for ``restart()``. A SIGKILLed Triton cannot unlink the
        Python backend's shared-memory regions, so the /dev/shm files they had open are removed
        here once every holder is dead. Returns tritonserver's exit code (-9); None if not running.
        """
        proc = self.proc
        if proc is None:
            return None
        _end_session(proc, timeout, graceful=False)
        self.proc = None
        return proc.returncode

    # ------------------------------------------------------------------------ health and repository API

    def live(self) -> bool:
        answer = _http_get(self._port(self.http_port), "/v2/health/live")
        return answer is not None and answer[0] == 200

    def model_ready(self, name: str, headers: Mapping[str, str] | None = None) -> bool:
        try:
            status, _ = _http_request(self._port(self.http_port), "GET", f"/v2/models/{name}/ready", headers=headers)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def load_model(
        self,
        name: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        transport: str = "http",
        port: int | None = None,
    ) -> float:
        """Load ``name`` through the repository API; Triton answers once the load finished.

        ``transport="http"``: ``POST /v2/repository/models/{name}/load``. Beware: while it runs, Triton's
        HTTP server also holds back the requests on the keep-alive connections it had accepted before
        (any model, health too; they are answered when the load ends), while new connections and gRPC
        are answered at once. ``transport="grpc"`` (``RepositoryModelLoad``) holds back nothing, so a
        fleet test that must see "not ready" rather than a stall loads that way. ``headers`` carry the
        key of a restricted repository API (for gRPC sent as ``triton-grpc-protocol-<key>``).
        Returns the seconds the call took; raises TritonRepositoryError if Triton refused it.
        """
        began = time.monotonic()
        if transport == "grpc":
            from tritonclient.grpc import service_pb2

            request = service_pb2.RepositoryModelLoadRequest(model_name=name)
            port = port or self._port(self.grpc_port)
            _grpc_repository_call(port, "RepositoryModelLoad", request, headers, timeout, f"load {name}")
        elif transport == "http":
            path = f"/v2/repository/models/{name}/load"
            status, body = _http_request(port or self._port(self.http_port), "POST", path, b"{}", headers, timeout)
            if status != 200:
                raise TritonRepositoryError(f"load {name}", status, body)
        else:
            raise ValueError(f"transport must be 'http' or 'grpc', not {transport!r}")
        return time.monotonic() - began

    def unload_model(self, name: str, *, headers: Mapping[str, str] | None = None, timeout: float = 60.0) -> None:
        status, body = _http_request(
            self._port(self.http_port), "POST", f"/v2/repository/models/{name}/unload", b"{}", headers, timeout
        )
        if status != 200:
            raise TritonRepositoryError(f"unload {name}", status, body)

    def load_models_async(
        self,
        names: Sequence[str],
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        parallel: bool = True,
        transport: str = "http",
    ) -> ModelLoader:
        """Start loading ``names`` in a background thread (all at once, or one after another);
        ``transport`` as for ``load_model``."""
        if transport not in ("http", "grpc"):
            raise ValueError(f"transport must be 'http' or 'grpc', not {transport!r}")
        loader = ModelLoader(self, names, headers=headers, timeout=timeout, parallel=parallel, transport=transport)
        loader.start()
        return loader

    def repository_index(
        self, *, ready: bool | None = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0
    ) -> list[dict[str, str]]:
        """``POST /v2/repository/index``: [{"name", "version", "state", "reason"}, ...]."""
        payload = {} if ready is None else {"ready": ready}
        status, body = _http_request(
            self._port(self.http_port), "POST", "/v2/repository/index", json.dumps(payload).encode(), headers, timeout
        )
        if status != 200:
            raise TritonRepositoryError("repository index", status, body)
        return list(json.loads(body))

    def ready_models(self, headers: Mapping[str, str] | None = None) -> set[str]:
        """Names of the models Triton reports READY (repository index with ``{"ready": true}``)."""
        return {
            entry["name"]
            for entry in self.repository_index(ready=True, headers=headers)
            if entry.get("state", "READY") == "READY"
        }

    # ---------------------------------------------------------------------------------------- logs

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
        _end_session(proc, 30.0, graceful=True)  # also stubs left behind by a Triton that hung
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
