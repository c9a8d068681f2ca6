"""Real-process harness for placement tests (issue 40): Triton servers in explicit model-control
mode sharing one model repository, and what is needed to see from outside what a gateway made
them do.

* ``shared_repository(root, n=12, load_delay_s=0.3)``: one repository of add_sub models ``m00`` ..
  ``m11`` (tests/support/fleet.py's ``slow_repository``), plus optional extra models: ``slow``
  (another load delay, e.g. 5 s, for queue and timeout tests), ``busy`` (add_sub whose every
  execution also sleeps, so requests pile up in Triton: demand for a copy) and ``memory`` (add_sub
  on a small C backend, tests/support/memusage_backend.c, that reports the given bytes to Triton
  as the model's memory: its statistics carry ``memory_usage``, the Python backend's do not).
* ``Fleet``: N ``TritonServer`` s on that one repository, started with no model loaded
  (``--model-control-mode=explicit``, no ``--load-model``), context-managed. ``reset()`` unloads
  every model everywhere and waits until nothing is LOADING/UNLOADING (restarting a killed server
  first); ``states()`` reads every server's own repository index; ``mark()`` / ``events()`` /
  ``loads()`` / ``reloads()`` read what each server logged ("successfully loaded 'm03'") since a mark.
* ``CapacityWatch``: a thread polling every server's own repository index every 0.2 s (a new HTTP
  connection each time, short timeout; a killed server is "down", not an error) and recording per
  server the most models it held (READY, LOADING or UNLOADING), every span of time it held more than
  the capacity, every time READY + LOADING alone exceeded it, how long each UNLOADING lasted (one
  unload time), and how long each model stayed READY before it was unloaded (thrash).
* Clients that show what tritonclient hides: ``http_infer`` (status, headers such as Retry-After,
  the error body) and ``grpc_infer`` (code, details, trailing metadata), both checking add_sub's
  answer; ``metric`` reads a Prometheus page; ``lru_loads`` / ``optimal_loads`` count the loads an
  LRU cache and Belady's optimum need for an access sequence.

What Triton 2.51 logs (``--log-verbose=0``), as read here (``model_lifecycle.cc``)::

    I1127 01:33:54.728522 30439 model_lifecycle.cc:472] "loading: m00:1"
    I1127 01:33:55.159726 30439 model_lifecycle.cc:839] "successfully loaded 'm00'"
    I1127 01:33:56.920620 30439 model_lifecycle.cc:624] "successfully unloaded 'm00' version 1"

A ``load`` of a model that is READY is a full reload when anything in its directory changed (and a
Python model's first load writes ``__pycache__`` there): a second "successfully loaded" with no
"successfully unloaded" between, the old copy's "successfully unloaded" following ~1 s later, while
the index says READY throughout. A ``load`` sent while the model is still UNLOADING there logs the
same lines (a new copy starts beside the old one), but the index shows it UNLOADING or LOADING
meanwhile: ``reloads(mark, watch)`` tells the two apart with a ``CapacityWatch`` that ran meanwhile
(``loads_while_unloading`` lists the others); ``reloads(mark)`` alone reports both.
"""
from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sysconfig
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import numpy as np

from .fleet import slow_repository
from .procs import wait_for
from .triton import TritonServer

__all__ = [
    "COUNTED_STATES",
    "MODELS",
    "CapacityWatch",
    "Fleet",
    "GrpcAnswer",
    "HttpAnswer",
    "LogEvent",
    "LogMark",
    "OverSpan",
    "add_sub_inputs",
    "grpc_infer",
    "http_infer",
    "index_states",
    "lru_loads",
    "memory_held",
    "metric",
    "model_names",
    "optimal_loads",
    "shared_repository",
    "triton_stats",
]

COUNTED_STATES = frozenset({"READY", "LOADING", "UNLOADING"})  # what holds (or will hold) an endpoint's memory


def model_names(n: int) -> list[str]:
    return [f"m{i:02d}" for i in range(n)]


MODELS: tuple[str, ...] = tuple(model_names(12))


# ------------------------------------------------------------------------------------------ repository

_BUSY_MODEL = '''"""add_sub that also sleeps exec_delay_s per execute() (written by tests/support/placement.py)."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        time.sleep(float(params["load_delay_s"]["string_value"]))
        self.exec_delay_s = float(params["exec_delay_s"]["string_value"])

    def execute(self, requests):
        time.sleep(self.exec_delay_s)
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return responses
'''


def shared_repository(
    root: Path,
    n: int = 12,
    load_delay_s: float = 0.3,
    *,
    slow: Mapping[str, float] | None = None,
    busy: Mapping[str, float] | None = None,
    memory: Mapping[str, int] | None = None,
) -> Path:
    """One model repository (a new directory under ``root``) for every Triton of a fleet.

    ``m00`` .. ``m{n-1}``: add_sub, each taking ``load_delay_s`` to load. ``slow``: more add_sub models,
    name -> their own load delay. ``busy``: add_sub models (loading in ``load_delay_s``) whose every
    execution sleeps name -> seconds, so that concurrent requests queue in Triton. ``memory``: add_sub
    models on the memusage backend (loading in ``load_delay_s``), name -> the bytes each reports as
    its memory.
    """
    names = model_names(n)
    extra = [*(slow or {}), *(busy or {}), *(memory or {})]
    if len(set(names + extra)) != len(names) + len(extra):
        raise ValueError(f"duplicate model names: {names + extra}")
    repo = slow_repository(root, names, load_delay_s)
    for name, delay in (slow or {}).items():
        other = slow_repository(root, [name], delay)
        shutil.move(str(other / name), str(repo / name))  # model.py is an absolute symlink: still valid
        other.rmdir()
    for name, exec_delay in (busy or {}).items():
        other = slow_repository(root, [name], load_delay_s)  # add_sub's config with load_delay_s
        shutil.move(str(other / name), str(repo / name))
        other.rmdir()
        config = repo / name / "config.pbtxt"
        param = f'parameters: {{ key: "exec_delay_s" value: {{ string_value: "{float(exec_delay)!r}" }} }}'
        config.write_text(config.read_text() + param + "\n")
        model_py = repo / name / "1" / "model.py"
        model_py.unlink()
        model_py.write_text(_BUSY_MODEL)
    if memory:
        backend = build_memusage_backend(root)
        for name, size in memory.items():
            (repo / name / "1").mkdir(parents=True)
            # Triton looks for a model's backend library in the model's own directory first.
            shutil.copy2(backend, repo / name / backend.name)
            (repo / name / "config.pbtxt").write_text(_MEMUSAGE_CONFIG.format(name=name, size=int(size),
                                                                                     delay=float(load_delay_s)))
    return repo


_MEMUSAGE_SOURCE = Path(__file__).with_name("memusage_backend.c")
_MEMUSAGE_CONFIG = """name: "{name}"
backend: "memusage"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
parameters: {{ key: "memory_bytes" value: {{ string_value: "{size}" }} }}
parameters: {{ key: "load_delay_s" value: {{ string_value: "{delay!r}" }} }}
"""


def build_memusage_backend(root: Path) -> Path:
    """``root/libtriton_memusage.so``, compiled from memusage_backend.c with the C compiler Python
    was built with (the one that builds the gateway's own extensions)."""
    out = Path(root) / "libtriton_memusage.so"
    if not out.exists():
        cc = (sysconfig.get_config_var("CC") or "cc").split()
        subprocess.run([*cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(_MEMUSAGE_SOURCE)],
                       check=True, capture_output=True, timeout=120)
    return out


# ------------------------------------------------------------------------------------------- polling


def _request(port: int, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def index_states(server: TritonServer, timeout: float = 1.0) -> dict[str, str] | None:
    """``{model: state}`` of the models ``server``'s own repository index shows READY, LOADING or
    UNLOADING; ``None`` when it does not answer (killed, restarting)."""
    port = server.http_port
    if port is None or not server.is_running():
        return None
    try:
        status, body = _request(port, "POST", "/v2/repository/index", b"{}", timeout)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    return {e["name"]: e["state"] for e in json.loads(body) if e.get("state") in COUNTED_STATES}


def triton_stats(server: TritonServer, model: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """Triton's own statistics of ``model`` (its first version): ``inference_count``,
    ``last_inference`` (ms since the epoch), ...; ``None`` when not loaded there or not answering."""
    if server.http_port is None:
        return None
    try:
        status, body = _request(server.http_port, "GET", f"/v2/models/{model}/stats", None, timeout)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    stats = json.loads(body).get("model_stats") or []
    return stats[0] if stats else None


def memory_held(server: TritonServer, timeout: float = 2.0) -> dict[str, int] | None:
    """The memory each loaded model of ``server`` reports in Triton's own statistics (bytes, summed
    over versions and devices); ``None`` when not answering."""
    if server.http_port is None:
        return None
    try:
        status, body = _request(server.http_port, "GET", "/v2/models/stats", None, timeout)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    held: dict[str, int] = {}
    for m in json.loads(body).get("model_stats") or []:
        held[m["name"]] = held.get(m["name"], 0) + sum(int(u["byte_size"]) for u in m.get("memory_usage") or [])
    return held


# -------------------------------------------------------------------------------------------- logs

# "I1127 01:33:55.159726 30439 model_lifecycle.cc:839] "successfully loaded 'm00'""
_STAMP = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")
_EVENTS = (
    ("loaded", re.compile(r"successfully loaded '([^']+)'")),
    ("unloaded", re.compile(r"successfully unloaded '([^']+)'")),
    ("loading", re.compile(r'"loading: ([^:"]+):\d+"')),
    ("failed", re.compile(r"failed to load '([^']+)'")),
)
_LOG_NAME = re.compile(r"^tritonserver(?:\.(\d+))?\.log$")


@dataclass(frozen=True)
class LogEvent:
    """One model lifecycle line of one Triton process's log."""

    server: str  # the Fleet's name for the server ("t0", ...)
    launch: int  # which process of that server (1, then 2 after a restart, ...)
    kind: str  # "loading" | "loaded" | "unloaded" | "failed"
    model: str
    t: float  # seconds since the epoch, from Triton's (local time) stamp
    offset: int  # byte offset of the line in its log
    line: str


@dataclass(frozen=True)
class LogMark:
    """Where every server's logs ended at ``mark()``: events after it are those at or past these offsets."""

    offsets: Mapping[Path, int]


def _stamp(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    month, day, hour, minute, sec, micro = (int(g) for g in m.groups())
    year = datetime.now().year
    try:
        return datetime(year, month, day, hour, minute, sec, micro).timestamp()
    except ValueError:
        return None


def _log_files(server: TritonServer) -> list[tuple[int, Path]]:
    """(launch number, path) of every log the server's processes wrote, in launch order."""
    if server.workdir is None or not server.workdir.is_dir():
        return []
    found = []
    for path in server.workdir.iterdir():
        m = _LOG_NAME.match(path.name)
        if m:
            found.append((int(m.group(1) or 1), path))
    return sorted(found)


def _parse_log(name: str, launch: int, path: Path) -> list[LogEvent]:
    try:
        data = path.read_bytes()
    except OSError:
        return []
    events = []
    offset = 0
    for raw in data.splitlines(keepends=True):
        line = raw.decode(errors="replace").rstrip("\n")
        if "model_lifecycle" in line or "failed to load" in line:
            for kind, pattern in _EVENTS:
                m = pattern.search(line)
                if m:
                    t = _stamp(line)
                    events.append(LogEvent(name, launch, kind, m.group(1), t if t is not None else 0.0, offset, line))
                    break
        offset += len(raw)
    return events


# ------------------------------------------------------------------------------------------- fleet


class Fleet:
    """``n`` Triton servers (``t0`` .. ``t{n-1}``) on one shared repository, started empty in explicit mode.

    >>> with Fleet(repo, tmp / "fleet") as fleet:  # doctest: +SKIP
    ...     fleet.urls("grpc")          # the pool's endpoints
    ...     mark = fleet.mark(); ...; fleet.loads(mark)
    """

    def __init__(self, repository: Path, workdir: Path, n: int = 3, *, startup_timeout: float = 120.0) -> None:
        self.repository = Path(repository)
        self.workdir = Path(workdir)
        self.names = [f"t{i}" for i in range(n)]
        self.servers = [
            TritonServer(self.repository, startup_models=(), startup_timeout=startup_timeout) for _ in range(n)
        ]

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        try:
            for name, server in zip(self.names, self.servers):
                assert server.model_control_mode == "explicit" and server.startup_models == []
                server.start(self.workdir / name)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception:
                pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ensure_running(self) -> None:
        """Restart (same ports, empty) every server that was killed or died."""
        for server in self.servers:
            if not server.is_running():
                if server.proc is not None:
                    server.kill()
                server.restart()

    def reset(self, timeout: float = 60.0) -> None:
        """Every server running, nothing READY, LOADING or UNLOADING anywhere (unloads what is READY;
        waits for loads and unloads under way). Bounded by ``timeout``."""
        self.ensure_running()
        deadline = time.monotonic() + timeout
        while True:
            busy: dict[str, dict[str, str]] = {}
            for name, server in zip(self.names, self.servers):
                states = index_states(server, timeout=5.0)
                if states is None:
                    raise RuntimeError(f"{name} does not answer its repository index:\n{server.log_tail()}")
                for model, state in states.items():
                    if state == "READY":
                        try:
                            server.unload_model(model, timeout=10.0)
                        except Exception:
                            pass  # seen again on the next round
                if states:
                    busy[name] = states
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fleet not empty after {timeout}s: {busy}")
            time.sleep(0.1)

    # ---------------------------------------------------------------------------------- addresses

    def __iter__(self) -> Iterator[TritonServer]:
        return iter(self.servers)

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, key: int | str) -> TritonServer:
        return self.servers[self.names.index(key) if isinstance(key, str) else key]

    def urls(self, protocol: str) -> list[str]:
        """Every server's address for a pool of ``protocol`` ("grpc" or "http")."""
        if protocol not in ("grpc", "http"):
            raise ValueError(protocol)
        return [s.grpc_url if protocol == "grpc" else s.http_url for s in self.servers]

    def name_of(self, what: TritonServer | str) -> str:
        """The fleet name of a server, or of the server with that HTTP or gRPC address."""
        for name, server in zip(self.names, self.servers):
            if server is what:
                return name
            if isinstance(what, str) and server.http_port is not None and what in (server.http_url, server.grpc_url):
                return name
        raise KeyError(what)

    # ---------------------------------------------------------------------------------- state

    def states(self) -> dict[str, dict[str, str] | None]:
        """Each server's ``{model: state}`` (READY/LOADING/UNLOADING) from its own index; None if down."""
        return {name: index_states(server) for name, server in zip(self.names, self.servers)}

    def where(self, model: str, state: str = "READY") -> list[str]:
        """Names of the servers where ``model`` is in ``state`` now."""
        return [name for name, states in self.states().items() if states and states.get(model) == state]

    def held(self) -> dict[str, set[str]]:
        """Models each live server holds READY."""
        return {name: {m for m, st in states.items() if st == "READY"}
                for name, states in self.states().items() if states is not None}

    # ---------------------------------------------------------------------------------- logs

    def mark(self) -> LogMark:
        offsets: dict[Path, int] = {}
        for server in self.servers:
            for _, path in _log_files(server):
                try:
                    offsets[path] = path.stat().st_size
                except OSError:
                    pass
        return LogMark(offsets)

    def events(self, since: LogMark | None = None, *, kinds: Iterable[str] | None = None,
               model: str | None = None) -> list[LogEvent]:
        """Model lifecycle events every server logged (after ``since``), each server's in log order."""
        wanted = None if kinds is None else set(kinds)
        out = []
        for name, server in zip(self.names, self.servers):
            for launch, path in _log_files(server):
                start = 0 if since is None else since.offsets.get(path, 0)
                for event in _parse_log(name, launch, path):
                    if event.offset < start or (wanted is not None and event.kind not in wanted):
                        continue
                    if model is None or event.model == model:
                        out.append(event)
        return out

    def loads(self, since: LogMark | None = None) -> Counter[tuple[str, str]]:
        """(server, model) -> how many times Triton logged "successfully loaded" it (after ``since``)."""
        return Counter((e.server, e.model) for e in self.events(since, kinds=("loaded",)))

    def unloads(self, since: LogMark | None = None) -> Counter[tuple[str, str]]:
        """(server, model) -> "successfully unloaded" lines (a reload logs one more, for its old copy)."""
        return Counter((e.server, e.model) for e in self.events(since, kinds=("unloaded",)))

    def double_loads(self, since: LogMark | None = None) -> list[tuple[LogEvent, LogEvent]]:
        """(the load before, this load) for every "successfully loaded" (after ``since``) of a model the
        same Triton process still held: no "successfully unloaded" between. Either a load sent for a
        model READY there (a reload: two copies for ~1 s) or one sent while its previous copy was
        still UNLOADING (Triton starts a new copy beside it); the log alone cannot tell them apart."""
        found = []
        for name, server in zip(self.names, self.servers):
            for launch, path in _log_files(server):
                start = 0 if since is None else since.offsets.get(path, 0)
                held: Counter[str] = Counter()
                last: dict[str, LogEvent] = {}
                for event in _parse_log(name, launch, path):  # the whole log: state before the mark counts
                    if event.kind == "loaded":
                        if held[event.model] > 0 and event.offset >= start:
                            found.append((last[event.model], event))
                        held[event.model] += 1
                        last[event.model] = event
                    elif event.kind == "unloaded":
                        held[event.model] = max(0, held[event.model] - 1)
        return found

    def reloads(self, since: LogMark | None = None, watch: CapacityWatch | None = None) -> list[LogEvent]:
        """Loads of a model that was READY on that Triton (after ``since``): what must never happen.

        Without ``watch`` every double load (``double_loads``) counts. With the ``CapacityWatch`` that
        ran meanwhile, a double load is left out when the watch saw the model UNLOADING or LOADING on
        that server between the two loads: a load sent while the old copy was unloading. A reload of
        a READY model shows neither (Triton's index keeps saying READY throughout).
        """
        return [e for prev, e in self.double_loads(since)
                if watch is None or not watch.saw(e.server, e.model, ("UNLOADING", "LOADING"), prev.t, e.t)]

    def loads_while_unloading(self, since: LogMark | None, watch: CapacityWatch) -> list[LogEvent]:
        """Double loads the watch explains by an UNLOADING (or LOADING) copy: not reloads, but a model
        loaded again right after being evicted there."""
        return [e for prev, e in self.double_loads(since)
                if watch.saw(e.server, e.model, ("UNLOADING", "LOADING"), prev.t, e.t)]

    def log_report(self, since: LogMark | None = None) -> str:
        """The lifecycle lines since ``since``, for assertion messages."""
        return "\n".join(f"{e.server}#{e.launch} {e.kind} {e.model} {e.t:.3f}"
                         for e in self.events(since, kinds=("loaded", "unloaded", "failed")))


# ---------------------------------------------------------------------------------- capacity watch


@dataclass
class OverSpan:
    """A time a server held more than the capacity (READY + LOADING + UNLOADING), as polled.

    One span per eviction: a span that began with models UNLOADING ends when all of those are gone,
    even if the server is still over because another eviction began meanwhile (back-to-back
    evictions, each followed at once by a load, would otherwise look like one long span: the polls
    miss the moment between them). A span over capacity with nothing UNLOADING is never split.
    """

    server: str
    start: float  # time.monotonic() of the first poll over
    end: float | None = None  # of the first poll back within capacity (or down); None: still over
    unloading: frozenset[str] = frozenset()  # the UNLOADING models that explain it (those left of them)
    peak: int = 0
    models: frozenset[str] = frozenset()  # at the peak, with their states in ``states``
    states: dict[str, str] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.end if self.end is not None else time.monotonic()) - self.start


@dataclass(frozen=True)
class Transition:
    t: float  # time.monotonic() of the poll that saw it
    wall: float  # time.time() then (compares with Triton's log stamps)
    server: str
    model: str
    before: str | None  # None: not held (never loaded, UNAVAILABLE); "DOWN": server not answering
    after: str | None


class CapacityWatch:
    """Polls every server's own repository index every ``interval`` s in a thread (context manager).

    Recorded per server: ``max_count`` (models READY/LOADING/UNLOADING at once), ``over`` spans
    (more than ``capacity``), ``strict`` samples (READY + LOADING alone over ``capacity``: over
    capacity not explained by an unload already under way), ``unload_durations`` (UNLOADING first
    seen -> gone: one unload time as this machine takes it), ``residencies`` (READY first seen ->
    UNLOADING first seen), ``transitions``, ``sightings`` (every poll that saw a model LOADING or
    UNLOADING: ``saw``), ``polls`` and ``down`` counts.
    """

    def __init__(self, fleet: Fleet, capacity: int, *, interval: float = 0.2, timeout: float = 0.5) -> None:
        self.fleet = fleet
        self.capacity = capacity
        self.interval = interval
        self.timeout = timeout
        self.max_count: dict[str, int] = dict.fromkeys(fleet.names, 0)
        self.max_models: dict[str, dict[str, str]] = {n: {} for n in fleet.names}
        self.over: list[OverSpan] = []
        self.strict: list[tuple[float, str, dict[str, str]]] = []
        self.unload_durations: list[tuple[str, str, float]] = []
        self.residencies: list[tuple[str, str, float]] = []
        self.transitions: list[Transition] = []
        # (server, model) -> [(wall clock of the poll, state)] for every poll that saw the model
        # LOADING or UNLOADING (``saw``).
        self.sightings: dict[tuple[str, str], list[tuple[float, str]]] = {}
        self.polls: dict[str, int] = dict.fromkeys(fleet.names, 0)
        self.down: dict[str, int] = dict.fromkeys(fleet.names, 0)
        self.started = 0.0
        self.stopped: float | None = None
        self._state: dict[str, dict[str, str]] = {n: {} for n in fleet.names}
        self._open: dict[str, OverSpan] = {}
        self._unloading_since: dict[tuple[str, str], float] = {}
        self._ready_since: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capacity-watch", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> Self:
        self.started = time.monotonic()
        self._thread.start()
        # One full round before the caller goes on, so nothing it does next goes unseen.
        wait_for(lambda: all(self.polls[n] + self.down[n] > 0 for n in self.fleet.names), timeout=10,
                 what="a first poll of every server")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        now = time.monotonic()
        with self._lock:
            self.stopped = now
            for span in self._open.values():
                span.end = now
            self._open.clear()
        if self._error is not None:
            raise RuntimeError(f"the capacity watch failed: {self._error!r}") from self._error

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                for name, server in zip(self.fleet.names, self.fleet.servers):
                    states = index_states(server, timeout=self.timeout)
                    self._record(name, time.monotonic(), states)
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))
        except BaseException as exc:  # a bug here must fail the test, not pass it silently
            self._error = exc

    def _record(self, name: str, t: float, states: dict[str, str] | None) -> None:
        wall = time.time() - (time.monotonic() - t)
        with self._lock:
            for model, state in (states or {}).items():
                if state in ("LOADING", "UNLOADING"):
                    self.sightings.setdefault((name, model), []).append((wall, state))
            if states is None:
                self.down[name] += 1
                now: dict[str, str] = {}
                lost = {m: "DOWN" for m in self._state[name]}
            else:
                self.polls[name] += 1
                now = states
                lost = {}
            before = self._state[name]
            for model in set(before) | set(now):
                old, new = before.get(model), now.get(model, lost.get(model))
                if old == new:
                    continue
                self.transitions.append(Transition(t, wall, name, model, old, new))
                key = (name, model)
                if new == "READY":
                    self._ready_since[key] = t
                if new == "UNLOADING":
                    self._unloading_since[key] = t
                    if key in self._ready_since:
                        self.residencies.append((name, model, t - self._ready_since.pop(key)))
                if old == "UNLOADING" and new is None and key in self._unloading_since:  # gone (not replaced)
                    self.unload_durations.append((name, model, t - self._unloading_since.pop(key)))
                if new in (None, "DOWN"):
                    self._ready_since.pop(key, None)
                    self._unloading_since.pop(key, None)
            self._state[name] = dict(now)
            count = len(now)
            if count > self.max_count[name]:
                self.max_count[name] = count
                self.max_models[name] = dict(now)
            active = sum(1 for st in now.values() if st != "UNLOADING")
            if active > self.capacity:
                self.strict.append((t, name, dict(now)))
            span = self._open.get(name)
            unloading = frozenset(m for m, st in now.items() if st == "UNLOADING")
            if count > self.capacity:
                if span is not None and span.unloading:
                    span.unloading &= unloading
                    if not span.unloading:  # the evictions it began with are done: a new one explains this
                        span.end = t
                        span = None
                if span is None:
                    span = self._open[name] = OverSpan(name, t, unloading=unloading)
                    self.over.append(span)
                if count > span.peak:
                    span.peak, span.models, span.states = count, frozenset(now), dict(now)
            elif span is not None:
                span.end = t
                del self._open[name]

    # ------------------------------------------------------------------------------- results

    def one_unload_s(self, default: float = 1.5) -> float:
        """The longest UNLOADING seen (polled): one unload time on this machine now."""
        with self._lock:
            return max((d for _, _, d in self.unload_durations), default=default)

    def longest_over(self) -> float:
        with self._lock:
            return max((s.seconds for s in self.over), default=0.0)

    def violations(self, grace_s: float | None = None, max_excess: int | None = None) -> list[str]:
        """What breaks "never over capacity except while an eviction already decided completes
        (bounded by one unload)": a span over capacity longer than ``grace_s`` (default: the longest
        unload seen + two polls); any poll where READY + LOADING alone exceeded it (over capacity
        with no unload under way to explain it); with ``max_excess``, any span that went more
        than that many models over (e.g. 1: one eviction at a time)."""
        grace = grace_s if grace_s is not None else self.one_unload_s() + 2 * self.interval
        with self._lock:
            out = [f"{s.server} over capacity {self.capacity} for {s.seconds:.2f}s > {grace:.2f}s "
                   f"(peak {s.peak}: {s.states})" for s in self.over if s.seconds > grace]
            strict = [f"{name} at +{t - self.started:.2f}s: READY+LOADING over {self.capacity}: {states}"
                      for t, name, states in self.strict]
            out += strict[:10] + ([f"... {len(strict) - 10} more such polls"] if len(strict) > 10 else [])
            if max_excess is not None:
                out += [f"{s.server} held {s.peak} > {self.capacity} + {max_excess}: {s.states}"
                        for s in self.over if s.peak > self.capacity + max_excess]
        return out

    def assert_capacity(self, grace_s: float | None = None, max_excess: int | None = None) -> None:
        problems = self.violations(grace_s, max_excess)
        assert not problems, "\n".join(problems) + "\n" + self.report()

    def transitions_of(self, model: str) -> list[Transition]:
        with self._lock:
            return [t for t in self.transitions if t.model == model]

    def saw(self, server: str, model: str, states: Iterable[str], after_wall: float, before_wall: float,
            slack: float = 0.3) -> bool:
        """Whether a poll after ``after_wall`` and before ``before_wall`` + ``slack`` (wall clock, as
        Triton's log stamps) saw ``model`` in one of ``states`` (LOADING or UNLOADING) on ``server`` —
        entered then or held since before: an evicted copy unloading while the next one loads shows
        LOADING throughout, and the polls may miss the READY between."""
        wanted = set(states)
        with self._lock:
            return any(state in wanted and after_wall < wall <= before_wall + slack
                       for wall, state in self.sightings.get((server, model), ()))

    def ever(self, model: str, state: str) -> list[str]:
        """Servers where ``model`` was ever seen in ``state``."""
        with self._lock:
            return sorted({t.server for t in self.transitions if t.model == model and t.after == state})

    def report(self) -> str:
        with self._lock:
            spans = ", ".join(f"{s.server}+{s.start - self.started:.1f}s/{s.seconds:.2f}s/peak {s.peak}"
                              for s in self.over) or "none"
            unloads = [round(d, 2) for _, _, d in self.unload_durations]
            return (f"capacity watch (capacity {self.capacity}, every {self.interval}s): polls {self.polls}, "
                    f"down {self.down}, max held {self.max_count}, at max {self.max_models}; "
                    f"over-capacity spans: {spans}; unload times seen: {unloads}")


# ------------------------------------------------------------------------------------------ clients


def add_sub_inputs(seed: int, n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Distinct inputs per request, so a right answer is not a coincidence."""
    a = np.arange(n, dtype=np.float32) + np.float32(seed)
    b = np.full(n, np.float32(seed % 7 + 0.5), dtype=np.float32)
    return a, b


def _check(outputs: Mapping[str, np.ndarray], a: np.ndarray, b: np.ndarray) -> bool:
    try:
        return (np.array_equal(np.asarray(outputs["OUTPUT0"], dtype=np.float32).reshape(-1), a + b)
                and np.array_equal(np.asarray(outputs["OUTPUT1"], dtype=np.float32).reshape(-1), a - b))
    except (KeyError, ValueError):
        return False


@dataclass
class HttpAnswer:
    status: int  # 0: no HTTP answer (connection failed; ``error`` says why)
    headers: dict[str, str]  # lower-case names
    body: bytes
    right: bool  # 200 and add_sub's outputs for the inputs sent
    seconds: float
    error: str = ""  # the JSON "error" of a non-200 answer, or the connection error

    @property
    def retry_after(self) -> str | None:
        return self.headers.get("retry-after")


def http_infer(url: str, model: str, seed: int = 1, *, timeout: float = 60.0,
               conn: http.client.HTTPConnection | None = None) -> HttpAnswer:
    """POST /v2/models/{model}/infer with JSON add_sub inputs; never raises for an HTTP error."""
    a, b = add_sub_inputs(seed)
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [len(a)], "datatype": "FP32", "data": a.tolist()},
        {"name": "INPUT1", "shape": [len(b)], "datatype": "FP32", "data": b.tolist()},
    ]}).encode()
    host, port = url.rsplit(":", 1)
    own = conn is None
    c = conn or http.client.HTTPConnection(host, int(port), timeout=timeout)
    began = time.monotonic()
    try:
        c.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        data = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        status = resp.status
    except (OSError, http.client.HTTPException) as exc:
        if not own:
            c.close()
        return HttpAnswer(0, {}, b"", False, time.monotonic() - began, repr(exc))
    finally:
        if own:
            c.close()
    seconds = time.monotonic() - began
    try:
        doc = json.loads(data)
    except ValueError:
        doc = {}
    if status != 200:
        error = doc.get("error", data.decode(errors="replace")) if isinstance(doc, dict) else str(doc)
        return HttpAnswer(status, headers, data, False, seconds, str(error))
    outputs = {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in doc.get("outputs", [])}
    return HttpAnswer(status, headers, data, _check(outputs, a, b), seconds)


@dataclass
class GrpcAnswer:
    code: str  # "OK" or the grpc.StatusCode name
    details: str
    trailers: dict[str, str]
    right: bool
    seconds: float


def grpc_infer(url: str, model: str, seed: int = 1, *, timeout: float = 60.0, channel: Any = None) -> GrpcAnswer:
    """ModelInfer with add_sub inputs (raw contents); never raises for a gRPC error."""
    import grpc
    from tritonclient.grpc import service_pb2

    a, b = add_sub_inputs(seed)
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        request.inputs.add(name=name, datatype="FP32", shape=[len(arr)])
        request.raw_input_contents.append(arr.tobytes())
    own = channel is None
    ch = channel or grpc.insecure_channel(url)
    call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                          request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                          response_deserializer=service_pb2.ModelInferResponse.FromString)
    began = time.monotonic()
    try:
        response, rpc = call.with_call(request, timeout=timeout)
        trailers = {k: v if isinstance(v, str) else v.decode(errors="replace")
                    for k, v in (rpc.trailing_metadata() or ())}
        outputs = {o.name: np.frombuffer(raw, dtype=np.float32)
                   for o, raw in zip(response.outputs, response.raw_output_contents)}
        return GrpcAnswer("OK", "", trailers, _check(outputs, a, b), time.monotonic() - began)
    except grpc.RpcError as exc:
        trailers = {k: v if isinstance(v, str) else v.decode(errors="replace")
                    for k, v in (exc.trailing_metadata() or ())}
        return GrpcAnswer(exc.code().name, exc.details() or "", trailers, False,
                          time.monotonic() - began)
    finally:
        if own:
            ch.close()


# ------------------------------------------------------------------------------------------ metrics


def metric(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of the samples ``name`` on a Prometheus page whose labels include ``labels``; 0 if none."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


# --------------------------------------------------------------------------------------- load bounds


def lru_loads(sequence: Sequence[str], capacity: int) -> int:
    """Loads an LRU cache of ``capacity`` needs to serve ``sequence`` (each miss one load)."""
    held: list[str] = []  # least recent first
    loads = 0
    for model in sequence:
        if model in held:
            held.remove(model)
        else:
            loads += 1
            if len(held) >= capacity:
                held.pop(0)
        held.append(model)
    return loads


def optimal_loads(sequence: Sequence[str], capacity: int) -> int:
    """Loads Belady's optimum (evict the one used furthest in the future) needs: the lower bound."""
    held: set[str] = set()
    loads = 0
    for i, model in enumerate(sequence):
        if model in held:
            continue
        loads += 1
        if len(held) >= capacity:
            rest = list(sequence[i + 1 :])
            held.remove(max(held, key=lambda m: rest.index(m) if m in rest else len(rest) + 1))
        held.add(model)
    return loads
