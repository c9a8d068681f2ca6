"""Issue 35, "Backends are untrusted input too": HTTP/1.1 backends that misbehave, one way each
(tests/support/badbackend.py), behind a real gateway, met by real clients.

Each case starts a misbehaving backend and a gateway of its own (well under a second) with two
backends: ``bad`` (protocol http, that backend, ``timeout_s`` 2, ``max_message_bytes`` 4 MiB) and
``good`` (the reference V2 server's HTTP port, model add_sub). Twelve clients at once —
six tritonclient.http (binary-extension and JSON requests: the pass-through path), six
tritonclient.grpc (the gRPC → HTTP converting path) — each send their own id and data, in waves
on kept connections (so a connection the gateway wrongly keeps is met again). What must hold:

* every client gets ITS OWN correct answer (its id, its data) or a clear error, within the route's
  timeout plus a margin: never a hang, never another request's answer (the first check of all);
* a clear error names the party at fault: the backend's is HTTP 502 (504 for a timeout, 503 when
  nothing could reach it) / gRPC INTERNAL or UNAVAILABLE (DEADLINE_EXCEEDED) — never a 4xx, 413,
  429, 499, RESOURCE_EXHAUSTED, CANCELLED or INVALID_ARGUMENT — and its message names the backend
  ('bad') and says why;
* ``oip_gateway_upstream_errors_total{backend="bad"}`` counts each such failure under the kind
  the case calls for (gateway/errors.py: UpstreamTimeout, UpstreamReset, UpstreamFraming,
  UpstreamTooLarge, UpstreamEncoding);
* valid HTTP (interim 1xx answers, an answer ended by closing the connection) succeeds;
* the good backend answers correctly during and after, the gateway stays alive and answers readiness;
* memory: the gateway's RSS never rises anywhere near a lying claim (1 GB, a 550 GB chunk, an
  endless body, a 10 MiB head): under idle + 200 MB throughout, and back within 50 MB of idle
  within 30 s.

``test_backend_says_what_it_should`` checks the misbehaving server itself over a raw socket.
Run: ``.venv/bin/python -m pytest -q tests/integration/test_hostile_backends.py``.
"""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass, replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.badbackend import BadBackend
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

pytestmark = pytest.mark.timeout(150)

TIMEOUT_S = 2.0  # the bad backend's timeout_s
MARGIN_S = 3.0  # every outcome within TIMEOUT_S + MARGIN_S (a shared 2-core machine)
CLIENT_TIMEOUT_S = TIMEOUT_S + 8.0  # the clients' own bound: past it, the request hung
LIMIT = 4 << 20  # the bad backend's max_message_bytes
CLIENTS = 6  # per protocol
MB = 1 << 20


# -- what each behaviour must produce ------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    own: str = "any"  # who may get their own correct answer: "any" client, "http" clients only, "none"
    must_succeed: bool = False  # every request must get its own correct answer
    http: tuple[int, ...] = (502,)  # statuses a failed HTTP request may get
    grpc: tuple[str, ...] = ("INTERNAL", "UNAVAILABLE")  # codes a failed gRPC request may get
    kinds: tuple[str, ...] = ()  # kinds oip_gateway_upstream_errors_total{backend="bad"} may count
    why: tuple[str, ...] = ()  # an error message contains one of these (case-insensitive)
    waves: int = 2  # requests per client, one wave after the other


SUCCEED = Expect(must_succeed=True)
TIMEOUT = Expect(own="none", http=(504,), grpc=("DEADLINE_EXCEEDED",), kinds=("UpstreamTimeout",), why=("within",))
EXTRA = Expect(own="any", kinds=("UpstreamFraming", "UpstreamReset"), why=("framing", "unexpected", "bytes", "answer"),
               waves=3)
FRAMING = Expect(own="none", grpc=("INTERNAL",), kinds=("UpstreamFraming",))
TOO_LARGE = Expect(own="none", grpc=("INTERNAL",), kinds=("UpstreamTooLarge",))
# Bounded by the gateway's limit on the body, or by the timeout while it stays within it.
UNBOUNDED = Expect(own="none", http=(502, 504), grpc=("INTERNAL", "DEADLINE_EXCEEDED"),
                   kinds=("UpstreamTooLarge", "UpstreamTimeout"), why=("max_message_bytes", "limit", "within"))
ENCODING = Expect(own="http", grpc=("INTERNAL",), kinds=("UpstreamEncoding",), why=("encoding",))

CASES: dict[str, Expect] = {
    # valid HTTP: must be read and delivered
    "interim:100": SUCCEED,
    "interim:102": SUCCEED,
    "interim:103": SUCCEED,
    "interim:all": SUCCEED,
    "http10_close": SUCCEED,
    "http10_close:http11": SUCCEED,
    # bytes after a complete answer: that answer may be delivered, the bytes never to anyone
    "extra_after:garbage": EXTRA,
    "extra_after:answer": EXTRA,
    "extra_after:garbage_delayed": EXTRA,
    "extra_after:answer_delayed": EXTRA,
    # lengths that lie
    "cl_too_long:close": Expect(own="none", http=(502,), grpc=("UNAVAILABLE", "INTERNAL"),
                                kinds=("UpstreamReset", "UpstreamFraming"),
                                why=("closed", "reset", "content-length", "before", "incomplete")),
    "cl_too_long:silent": TIMEOUT,
    "cl_lie_huge:close": replace(TOO_LARGE, why=("max_message_bytes", "limit", "content-length")),
    "cl_lie_huge:silent": replace(TOO_LARGE, why=("max_message_bytes", "limit", "content-length")),
    # framing that has no one meaning
    "conflicting:two_lengths": replace(FRAMING, why=("content-length",)),
    # RFC 9112 6.3: Transfer-Encoding overrides Content-Length (the answer may be read that way,
    # the connection then closed) or the answer is refused; never read by its length
    "conflicting:length_and_chunked": replace(FRAMING, own="any", why=("content-length", "transfer-encoding")),
    "conflicting:bad_chunk_size": replace(FRAMING, why=("chunk",)),
    "conflicting:huge_chunk": replace(UNBOUNDED, kinds=UNBOUNDED.kinds + ("UpstreamFraming",),
                                      why=UNBOUNDED.why + ("chunk",)),
    "endless_chunked": UNBOUNDED,
    "huge_head:count": replace(TOO_LARGE, why=("header", "head")),
    "huge_head:bytes": replace(TOO_LARGE, why=("header", "head")),
    # time
    "slow": TIMEOUT,
    "silent": TIMEOUT,
    # resets: before any byte of the answer (safe to retry; nothing could reach it: 503 too) / mid-answer
    "reset_before": Expect(own="none", http=(502, 503), grpc=("UNAVAILABLE",),
                           kinds=("UpstreamReset", "NoEndpointAvailable", "ModelNotReady"),
                           why=("reset", "closed", "reach", "refused", "not ready", "unavailable")),
    "reset_mid": Expect(own="none", http=(502,), grpc=("UNAVAILABLE",), kinds=("UpstreamReset",),
                        why=("reset", "closed", "broken", "before")),
    # an answer in an encoding the gateway cannot read: an HTTP client may get it relayed (and read
    # it: it is plain JSON), the converting path must refuse it rather than read it as plain
    "bad_encoding:br": ENCODING,
    "bad_encoding:x-unknown": ENCODING,
}
MEMORY_CASES = {"cl_lie_huge:close", "cl_lie_huge:silent", "conflicting:huge_chunk", "endless_chunked",
                "huge_head:count", "huge_head:bytes"}
FORBIDDEN_HTTP = {400, 404, 408, 413, 415, 429, 431, 499}
FORBIDDEN_GRPC = {"RESOURCE_EXHAUSTED", "CANCELLED", "INVALID_ARGUMENT", "NOT_FOUND", "UNKNOWN", "OK"}


# -- process plumbing ----------------------------------------------------------------------------
def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def unread_from(port: int) -> int:
    """Bytes waiting in the receive queues of sockets connected to ``port`` (the gateway's
    connections to the backend): 0 once the gateway has read everything the backend wrote."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if int(parts[2].rsplit(":", 1)[1], 16) == port:
                        total += int(parts[4].split(":")[1], 16)
        except FileNotFoundError:
            continue
    return total


def upstream_errors(gw: GatewayProcess, backend: str = "bad") -> dict[str, float]:
    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    kinds: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("oip_gateway_upstream_errors_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.index("}")]))
            if labels.get("backend") == backend:
                kinds[labels["kind"]] = kinds.get(labels["kind"], 0) + float(line.rsplit(" ", 1)[1])
    return kinds


def http_status(url: str, path: str, timeout: float = 3.0) -> int:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# -- clients -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    who: str  # "http3/w1"
    kind: str  # "http" or "grpc"
    elapsed: float
    own: bool = False  # its own correct answer
    status: str = ""  # "502", "DEADLINE_EXCEEDED", "" (an answer), or "client:<exception>"
    message: str = ""

    def __str__(self) -> str:
        what = "own answer" if self.own else f"{self.status} {self.message[:300]!r}"
        return f"{self.who} ({self.kind}, {self.elapsed:.2f}s): {what}"


class Client:
    """One tritonclient (HTTP or gRPC) that keeps its connection; ``send`` returns an Outcome."""

    def __init__(self, kind: str, index: int, gw: GatewayProcess) -> None:
        self.kind, self.index, self.gw = kind, index, gw
        self.json = kind == "http" and index % 2 == 1  # half the HTTP clients send JSON, half binary
        self.version = "1" if index == 0 else ""
        # tritonclient.http (geventhttpclient) must stay on the thread that made it: one thread each
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{kind}{index}")
        self.client = self._thread.submit(self._open).result()

    def submit(self, wave: int, salt: int = 0) -> concurrent.futures.Future[Outcome]:
        return self._thread.submit(self.send, wave, salt)

    def _open(self):
        if self.kind == "http":
            return httpclient.InferenceServerClient(self.gw.http_url, network_timeout=CLIENT_TIMEOUT_S,
                                                    connection_timeout=CLIENT_TIMEOUT_S)
        return grpcclient.InferenceServerClient(self.gw.grpc_url)

    def close(self) -> None:
        self._thread.submit(self._close).result()
        self._thread.shutdown()

    def _close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass

    def send(self, wave: int, salt: int = 0) -> Outcome:
        who = f"{self.kind}{self.index}/w{wave}"
        request_id = f"{who}/{salt}"
        base = float((salt * 64 + self.index * 8 + wave) * 4 + (100_000 if self.kind == "grpc" else 0))
        data = (np.arange(4, dtype=np.float32) + np.float32(base) + np.float32(0.25)).reshape(1, 4)
        mod = httpclient if self.kind == "http" else grpcclient
        tensor = mod.InferInput("INPUT0", [1, 4], "FP32")
        if self.kind == "http":
            tensor.set_data_from_numpy(data, binary_data=not self.json)
        else:
            tensor.set_data_from_numpy(data)
        began = time.monotonic()
        out = Outcome(who, self.kind, 0.0)
        try:
            if self.kind == "http":
                result = self.client.infer("bad", [tensor], model_version=self.version, request_id=request_id)
                got_id = result.get_response().get("id")
            else:
                result = self.client.infer("bad", [tensor], model_version=self.version, request_id=request_id,
                                           client_timeout=CLIENT_TIMEOUT_S)
                got_id = result.get_response().id
            got = result.as_numpy("OUTPUT0")
            out.own = got_id == request_id and got is not None and got.shape == data.shape \
                and np.array_equal(got, data)
            if not out.own:
                out.status = "WRONG ANSWER"
                out.message = f"id {got_id!r} data {None if got is None else got.tolist()} " \
                              f"(sent id {request_id!r} data {data.tolist()})"
        except InferenceServerException as exc:
            status = exc.status() or "client:InferenceServerException"
            out.status = status.removeprefix("StatusCode.")
            out.message = exc.message() or ""
        except Exception as exc:  # no answer the client could read: connection dropped, timeout, garbage
            out.status = f"client:{type(exc).__name__}"
            out.message = str(exc)
            self._close()
            self.client = self._open()
        out.elapsed = time.monotonic() - began
        return out


def good_request(kind: str, client, n: int) -> str | None:
    """add_sub on the good backend; None when correct, else what went wrong."""
    a = np.full(4, n, dtype=np.float32) + np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    mod = httpclient if kind == "http" else grpcclient
    ins = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    try:
        kw = {} if kind == "http" else {"client_timeout": 10}
        r = client.infer("add_sub", ins, request_id=f"good-{n}", **kw)
        if not np.array_equal(r.as_numpy("OUTPUT0"), a + b):
            return f"good backend ({kind}) answered {r.as_numpy('OUTPUT0')} for {a} + {b}"
    except Exception as exc:
        return f"good backend ({kind}) failed: {exc!r}"
    return None


class GoodTraffic:
    """add_sub over HTTP and gRPC on the good backend, and readiness, in a thread, while a case runs."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.problems: list[str] = []
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GoodTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:  # a case over in a blink still sees the good backend used while it ran
            wait_for(lambda: self.done >= 2 or not self._thread.is_alive(), timeout=15, what="good-backend requests")
        finally:
            self._stop.set()
            self._thread.join(30)

    def _run(self) -> None:
        h = httpclient.InferenceServerClient(self.gw.http_url, network_timeout=10, connection_timeout=10)
        g = grpcclient.InferenceServerClient(self.gw.grpc_url)
        n = 0
        try:
            while not self._stop.wait(0.05):
                n += 1
                for kind, c in (("http", h), ("grpc", g)):
                    problem = good_request(kind, c, n)
                    if problem:
                        self.problems.append(problem)
                try:
                    http_status(self.gw.http_url, "/v2/health/ready")
                except OSError as exc:
                    self.problems.append(f"readiness not answered: {exc!r}")
                self.done += 1
        finally:
            h.close()
            g.close()


class RssPeak:
    """The gateway's peak RSS, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss(self.pid))
            except (OSError, AssertionError):
                return


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture
def case(request, reference, tmp_path):
    """(behaviour, its backend, a gateway in front of it and the good backend)."""
    behaviour = request.param
    bad = BadBackend(behaviour, "bad", slow_s=TIMEOUT_S + 2.0)
    backends = {
        "bad": {"protocol": "http", "endpoints": [bad.address], "timeout_s": TIMEOUT_S, "max_message_bytes": LIMIT,
                # each request meets the behaviour itself (no ejection turning it into 503s)
                "outlier": {"consecutive_failures": 1000}},
        "good": {"protocol": "http", "endpoints": [reference.http_url]},
    }
    routes = [{"model": "bad", "backend": "bad"}, {"model": "add_sub", "backend": "good"}]
    gw = GatewayProcess(gateway_config(backends, routes, access_log=True), tmp_path, "gateway-hostile")
    try:
        gw.start()

        def ready() -> bool:
            return http_status(gw.http_url, "/v2/models/bad/ready") == 200 \
                and http_status(gw.http_url, "/v2/models/add_sub/ready") == 200

        wait_for(ready, timeout=30, what="the gateway ready for both backends")
        yield behaviour, bad, gw
    finally:
        gw.stop()
        bad.close()


def log_tail(gw: GatewayProcess, n: int = 15) -> str:
    lines = [line for line in gw.log_tail(400).splitlines() if "oip_gateway.access" not in line]
    return "\n".join(lines[-n:])


# -- the tests -----------------------------------------------------------------------------------
def judge(outcomes: list[Outcome], expect: Expect) -> list[str]:
    """What is wrong with the clients' outcomes under ``expect``."""
    problems = []
    for o in outcomes:
        if o.elapsed > TIMEOUT_S + MARGIN_S:
            problems.append(f"HUNG past {TIMEOUT_S + MARGIN_S}s: {o}")
        if o.own:
            if expect.own == "none" or (expect.own == "http" and o.kind != "http"):
                problems.append(f"answered although the backend's answer is unusable: {o}")
            continue
        if o.status == "WRONG ANSWER":
            problems.append(f"ANOTHER REQUEST'S (or a garbled) ANSWER: {o}")
            continue
        if expect.must_succeed:
            problems.append(f"valid HTTP not delivered: {o}")
            continue
        allowed = [str(s) for s in expect.http] if o.kind == "http" else list(expect.grpc)
        if o.status.startswith("client:"):
            problems.append(f"no clear error (the client got no answer it could read): {o}")
        elif o.status not in allowed:
            forbidden = o.status in FORBIDDEN_GRPC or (o.status.isdigit() and int(o.status) in FORBIDDEN_HTTP)
            problems.append(f"{'client-fault status' if forbidden else 'wrong status'} (want one of {allowed}): {o}")
        if not o.status.startswith("client:"):
            if "'bad'" not in o.message:
                problems.append(f"error does not name the backend 'bad': {o}")
            if expect.why and not any(w in o.message.lower() for w in expect.why):
                problems.append(f"error does not say why (one of {expect.why}): {o}")
    return problems


def run_waves(behaviour: str, bad: BadBackend, gw: GatewayProcess, expect: Expect) -> list[Outcome]:
    """Every client sends one request per wave, all at once; the next wave starts when all ended."""
    clients = [Client(kind, i, gw) for kind in ("http", "grpc") for i in range(CLIENTS)]
    outcomes: list[Outcome] = []
    try:
        for wave in range(expect.waves):
            if behaviour.endswith("_delayed"):
                settle_extras(bad)
                if wave == 0:  # a first answer alone, so its unsolicited bytes meet an idle connection
                    outcomes.append(clients[0].submit(wave, salt=1).result())
                    settle_extras(bad, at_least=1)
            outcomes += [f.result() for f in [c.submit(wave) for c in clients]]
    finally:
        for c in clients:
            c.close()
    return outcomes


def settle_extras(bad: BadBackend, at_least: int = 0) -> None:
    """Delayed extras: wait until the backend has written every one it will (no connection in its
    delay) and the gateway has read them off its sockets (bounded; a gateway that leaves idle
    connections unread is not waited for)."""
    port = int(bad.address.rsplit(":", 1)[1])
    try:  # (none written at all: the test reports that the case did not happen)
        wait_for(lambda: bad.extras_sent >= at_least and bad.delaying == 0, timeout=5,
                 what="the backend's unsolicited bytes written")
        wait_for(lambda: unread_from(port) == 0, timeout=3, what="the gateway reading its backend sockets")
    except TimeoutError:
        pass


@pytest.mark.parametrize("case", list(CASES), indirect=True)
def test_hostile_backend(case):
    behaviour, bad, gw = case
    expect = CASES[behaviour]
    # warm: a few good requests, then the idle RSS
    with httpclient.InferenceServerClient(gw.http_url) as h, grpcclient.InferenceServerClient(gw.grpc_url) as g:
        for n in range(3):
            for kind, c in (("http", h), ("grpc", g)):
                assert good_request(kind, c, n) is None
    idle = rss(gw.proc.pid)
    errors_before = upstream_errors(gw)

    with GoodTraffic(gw) as good, RssPeak(gw.proc.pid) as mem:
        outcomes = run_waves(behaviour, bad, gw, expect)
    problems = judge(outcomes, expect)

    # the good backend served throughout, and still does; the gateway is alive and answers readiness
    problems += good.problems
    if good.done == 0:
        problems.append("no good-backend request completed while the case ran")
    if gw.proc.poll() is not None:
        problems.append(f"the gateway exited ({gw.proc.returncode})")
    else:
        with httpclient.InferenceServerClient(gw.http_url) as h, grpcclient.InferenceServerClient(gw.grpc_url) as g:
            for n in range(3):
                for kind, c in (("http", h), ("grpc", g)):
                    if (p := good_request(kind, c, 1000 + n)) is not None:
                        problems.append(f"after the case: {p}")
        try:
            if http_status(gw.http_url, "/v2/models/add_sub/ready") != 200:
                problems.append("after the case: add_sub (good backend) not ready")
            http_status(gw.http_url, "/v2/health/ready")
        except OSError as exc:
            problems.append(f"after the case: readiness not answered: {exc!r}")

        # memory: never near a claim, and back near idle
        if mem.peak > idle + 200 * MB:
            problems.append(f"RSS peaked at {mem.peak / MB:.0f} MB, idle {idle / MB:.0f} MB (+200 MB allowed)")
        try:
            wait_for(lambda: rss(gw.proc.pid) < idle + 50 * MB, timeout=30, interval=0.2,
                     what="the gateway's RSS back within 50 MB of idle")
        except TimeoutError:
            problems.append(f"RSS {rss(gw.proc.pid) / MB:.0f} MB 30 s after the case, idle {idle / MB:.0f} MB")

        # each failure the gateway decided is counted under a kind the case calls for
        errors_after = upstream_errors(gw)
        counted = {k: v - errors_before.get(k, 0) for k, v in errors_after.items() if v > errors_before.get(k, 0)}
        failed = sum(1 for o in outcomes if not o.own and not o.status.startswith("client:")
                     and o.status != "WRONG ANSWER")
        if sum(counted.values()) < failed:
            problems.append(f"oip_gateway_upstream_errors_total{{backend=\"bad\"}} counted {counted} "
                            f"for {failed} failed requests")
        if set(counted) - set(expect.kinds):
            problems.append(f"upstream error kinds {sorted(set(counted) - set(expect.kinds))} counted; "
                            f"this case's are {list(expect.kinds)} (all counted: {counted})")

    if behaviour.endswith("_delayed") and bad.extras_sent == 0:
        problems.append("the backend never wrote its unsolicited bytes: the case did not happen")
    memory = f"gateway RSS idle {idle / MB:.0f} MB, peak {mem.peak / MB:.0f} MB"
    print(f"{behaviour}: {memory}; backend: {bad.infers} inference requests, {bad.extras_sent} extras")
    summary = "\n".join(f"  {o}" for o in outcomes)
    assert not problems, (f"{behaviour}: {len(problems)} problem(s):\n" + "\n".join(f"- {p}" for p in problems)
                          + f"\noutcomes:\n{summary}\nbackend got {bad.infers} inference requests; {memory}"
                          + f"\n--- gateway log (access lines left out) ---\n{log_tail(gw)}")
    assert bad.infers > 0


# -- the misbehaving server itself, over a raw socket ---------------------------------------------
REQUEST_DOC = json.dumps({"id": "raw-1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                                                     "data": [1.5, 2.5]}]}).encode()
BODY = json.dumps({"model_name": "bad", "model_version": "1", "outputs": [
    {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}], "id": "raw-1"}).encode()
N = len(BODY)
RAW_REQUEST = (b"POST /v2/models/bad/infer HTTP/1.1\r\nHost: bad\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST_DOC), REQUEST_DOC))
ANSWER = b'"id": "raw-1"'
OK = b"HTTP/1.1 200 OK\r\n"

# behaviour -> (what the bytes start with, what they contain, how they end: "open", "eof", "rst", "any")
RAW: dict[str, tuple[bytes, list[bytes], str]] = {
    "echo": (OK, [b"Content-Length: %d\r\n\r\n%s" % (N, BODY)], "open"),
    "interim:100": (b"HTTP/1.1 100 Continue\r\n\r\n" + OK, [ANSWER], "open"),
    "interim:102": (b"HTTP/1.1 102 Processing\r\n\r\n" + OK, [ANSWER], "open"),
    "interim:103": (b"HTTP/1.1 103 Early Hints\r\nLink: ", [b"\r\n\r\n" + OK, ANSWER], "open"),
    "interim:all": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 ", [b"HTTP/1.1 102 Processing\r\n\r\n" + OK], "open"),
    "extra_after:garbage": (OK, [ANSWER + b"}\x00\x01 this is not HTTP"], "open"),
    "extra_after:answer": (OK, [ANSWER + b"}" + OK, b'"id": "decoy-not-anyones"'], "open"),
    "extra_after:garbage_delayed": (OK, [ANSWER + b"}\x00\x01 this is not HTTP"], "open"),
    "extra_after:answer_delayed": (OK, [ANSWER + b"}" + OK, b'"id": "decoy-not-anyones"'], "open"),
    "cl_too_long:close": (OK, [b"Content-Length: %d\r\n" % (N + 64), ANSWER], "eof"),
    "cl_too_long:silent": (OK, [b"Content-Length: %d\r\n" % (N + 64), ANSWER], "open"),
    "cl_lie_huge:close": (OK, [b"Content-Length: 1000000000\r\n", ANSWER], "eof"),
    "cl_lie_huge:silent": (OK, [b"Content-Length: 1000000000\r\n", ANSWER], "open"),
    "conflicting:two_lengths": (OK, [b"Content-Length: %d\r\nContent-Length: %d\r\n" % (N, N + 10), ANSWER], "open"),
    "conflicting:length_and_chunked": (OK, [b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n{" % (N, N),
                                            ANSWER + b"}\r\n0\r\n\r\n"], "open"),
    "conflicting:bad_chunk_size": (OK, [b"chunked\r\n\r\nzz\r\n{", ANSWER], "open"),
    "conflicting:huge_chunk": (OK, [b"chunked\r\n\r\n7fffffffff\r\n{", ANSWER], "open"),
    "endless_chunked": (OK, [b"chunked\r\n\r\n%x\r\n{" % (N - 1),
                             ANSWER + b"\r\n4000\r\n" + b" " * 16384 + b"\r\n4000\r\n"], "open"),
    "huge_head:count": (OK, [b"X-Header-000000: value\r\n",
                             b"X-Header-099999: value\r\nContent-Length: %d\r\n\r\n{" % N, ANSWER], "open"),
    "huge_head:bytes": (OK + b"Content-Type: application/json\r\nX-Huge: aaaa",
                        [b"a" * 1000 + b"\r\nContent-Length: %d\r\n\r\n{" % N, ANSWER], "open"),
    "slow": (OK, [ANSWER], "open"),
    "silent": (b"", [], "open"),
    "reset_before": (b"", [], "rst"),
    "reset_mid": (OK, [b"Content-Length: %d\r\n\r\n%s" % (N, BODY[:N // 2])], "rst"),
    "http10_close": (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{", [ANSWER + b"}"], "eof"),
    "http10_close:http11": (OK + b"Content-Type: application/json\r\nConnection: close\r\n\r\n{", [ANSWER + b"}"],
                            "eof"),
    "bad_encoding:br": (OK, [b"Content-Encoding: br\r\n", ANSWER], "open"),
    "bad_encoding:x-unknown": (OK, [b"Content-Encoding: x-unknown\r\n", ANSWER], "open"),
}


def raw_exchange(address: str, request: bytes, want: int, quiet_s: float) -> tuple[bytes, str]:
    """Send ``request``, read until ``want`` bytes, EOF, a reset or ``quiet_s`` without a byte."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(request)
        s.settimeout(quiet_s)
        out = b""
        while len(out) < want:
            try:
                chunk = s.recv(1 << 20)
            except TimeoutError:
                return out, "open"
            except ConnectionResetError:
                return out, "rst"
            if not chunk:
                return out, "eof"
            out += chunk
        return out, "open"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("behaviour", list(RAW))
def test_backend_says_what_it_should(behaviour):
    start, contains, ending = RAW[behaviour]
    want = (11 << 20) if behaviour.startswith("huge_head") else 40_000 if behaviour == "endless_chunked" else 1 << 16
    with BadBackend(behaviour, slow_s=0.3, delay_s=0.1) as bad:
        out, how = raw_exchange(bad.address, RAW_REQUEST, want, quiet_s=0.4 if behaviour != "slow" else 1.0)
        assert out.startswith(start), out[:300]
        for piece in contains:
            assert piece in out, (piece[:200], out[:600])
        if ending != "any" and behaviour not in ("endless_chunked",) and not behaviour.startswith("huge_head"):
            assert how == ending, (how, out[-300:])
        if behaviour == "extra_after:answer_delayed" or behaviour == "extra_after:garbage_delayed":
            assert bad.extras_sent == 1
        assert bad.infers == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("index", [True, False])
def test_backend_is_well_behaved_but_for_inference(index):
    """Health, readiness, index and metadata answer as a Triton would (whatever the behaviour)."""
    empty = OK + b"Content-Type: application/json\r\nContent-Length: 0\r\n\r\n"
    with BadBackend("silent", index=index) as bad:
        for path in (b"GET /v2/health/live", b"GET /v2/health/ready", b"GET /v2/models/bad/ready",
                     b"GET /v2/models/bad/versions/1/ready"):
            out, _ = raw_exchange(bad.address, path + b" HTTP/1.1\r\nHost: bad\r\n\r\n", len(empty), 2)
            assert out == empty
        out, _ = raw_exchange(bad.address, b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
                              1 << 16, 0.3)
        if index:
            assert out.startswith(OK) and out.endswith(b'[{"name": "bad", "version": "1", "state": "READY"}]')
        else:
            assert out.startswith(b"HTTP/1.1 404 ")
        out, _ = raw_exchange(bad.address, b"GET /v2/models/bad HTTP/1.1\r\n\r\n", 1 << 16, 0.3)
        assert out.startswith(OK) and b'"inputs"' in out
        assert bad.infers == 0
