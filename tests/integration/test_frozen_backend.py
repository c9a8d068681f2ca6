"""Issue 35: a backend that freezes (SIGSTOP: its sockets stay open, nothing answers) and comes back.

A Triton of its own (the shared ``triton`` fixture is never stopped), a gateway with a short
``timeout_s`` in front of it over both backend protocols — add_sub through an HTTP backend, identity_FP32
through a gRPC backend — and a bounded load of tritonclient requests (HTTP and gRPC clients, each
request with its own id and data). Triton is stopped for 10 s, then continued. What must hold:

* no request ever gets another's answer, and none takes longer than the backend's timeout plus a
  margin (a request in flight when Triton froze ends in 504 / DEADLINE_EXCEEDED naming its backend,
  not when Triton wakes up);
* a timeout's message names the backend and says why ("did not answer within 2.0s");
* before the freeze, and from the moment the gateway is ready again after it, every request
  succeeds; failures happen only around the freeze: 504 / DEADLINE_EXCEEDED, or 503 / UNAVAILABLE
  once the health checker has seen the endpoint down (nothing could reach it);
* after SIGCONT the gateway's readiness recovers and everything serves again, within 30 s;
* the gateway process stays up throughout.

Run: ``.venv/bin/python -m pytest -q tests/integration/test_frozen_backend.py``.
"""
from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for
from tests.support.triton import TritonServer

pytestmark = pytest.mark.timeout(300)

TIMEOUT_S = 2.0  # both backends' timeout_s
MARGIN_S = 3.0
CLIENT_TIMEOUT_S = TIMEOUT_S + 10.0  # past it, a request hung
FREEZE_S = 10.0
BACKENDS = {"add_sub": "triton-http", "identity_FP32": "triton-grpc"}


@dataclass
class Outcome:
    who: str
    began: float
    ended: float
    own: bool = False
    status: str = ""
    message: str = ""

    def __str__(self) -> str:
        what = "own answer" if self.own else f"{self.status} {self.message[:200]!r}"
        return f"{self.who} [{self.began:.2f}s → {self.ended:.2f}s]: {what}"


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


class Load(threading.Thread):
    """One client (``kind`` http or grpc) sending ``model`` requests one after another, paced,
    until stopped; every outcome with its times (seconds since ``t0``)."""

    def __init__(self, kind: str, model: str, index: int, gw: GatewayProcess, t0: float) -> None:
        super().__init__(daemon=True, name=f"load-{kind}-{model}-{index}")
        self.kind, self.model, self.index, self.gw, self.t0 = kind, model, index, gw, t0
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()

    def _open(self):
        if self.kind == "http":
            return httpclient.InferenceServerClient(self.gw.http_url, network_timeout=CLIENT_TIMEOUT_S,
                                                    connection_timeout=CLIENT_TIMEOUT_S)
        return grpcclient.InferenceServerClient(self.gw.grpc_url)

    def run(self) -> None:
        client = self._open()
        n = 0
        try:
            while not self.stop.wait(0.05):
                n += 1
                client = self._one(client, n)
        finally:
            client.close()

    def _one(self, client, n: int):
        who = f"{self.kind}-{self.model}-{self.index}#{n}"
        base = np.float32((self.index * 10_000 + n) * 4 + (500_000 if self.kind == "grpc" else 0))
        a = (np.arange(4, dtype=np.float32) + base).reshape(1, 4)
        mod = httpclient if self.kind == "http" else grpcclient
        if self.model == "add_sub":
            b = np.full((4,), 0.5, dtype=np.float32)
            ins = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
            ins[0].set_data_from_numpy(a.reshape(4))
            ins[1].set_data_from_numpy(b)
            want = a.reshape(4) + b
        else:
            ins = [mod.InferInput("INPUT0", [1, 4], "FP32")]
            ins[0].set_data_from_numpy(a)
            want = a
        began = time.monotonic()
        out = Outcome(who, began - self.t0, 0.0)
        try:
            kw = {} if self.kind == "http" else {"client_timeout": CLIENT_TIMEOUT_S}
            r = client.infer(self.model, ins, request_id=who, **kw)
            got_id = r.get_response().get("id") if self.kind == "http" else r.get_response().id
            got = r.as_numpy("OUTPUT0")
            out.own = got_id == who and got is not None and np.array_equal(got, want)
            if not out.own:
                out.status = "WRONG ANSWER"
                out.message = f"id {got_id!r} data {None if got is None else got.tolist()}, want {want.tolist()}"
        except InferenceServerException as exc:
            out.status = (exc.status() or "client:InferenceServerException").removeprefix("StatusCode.")
            out.message = exc.message() or ""
        except Exception as exc:
            out.status, out.message = f"client:{type(exc).__name__}", str(exc)
            client.close()
            client = self._open()
        out.ended = time.monotonic() - self.t0
        self.outcomes.append(out)
        return client


@pytest.fixture
def frozen_setup(triton_required, tmp_path):
    triton = TritonServer(startup_models=["add_sub", "identity_FP32"])
    triton.start(tmp_path / "triton")
    gw = None
    try:
        backends = {
            "triton-http": {"protocol": "http", "endpoints": [triton.http_url], "timeout_s": TIMEOUT_S},
            "triton-grpc": {"protocol": "grpc", "endpoints": [triton.grpc_url], "timeout_s": TIMEOUT_S},
        }
        routes = [{"model": m, "backend": p} for m, p in BACKENDS.items()]
        gw = GatewayProcess(gateway_config(backends, routes), tmp_path, "gateway-frozen")
        gw.start()
        wait_for(lambda: http_status(gw.http_url, "/v2/health/ready") == 200, timeout=30, what="gateway ready")
        yield triton, gw
    finally:
        if gw is not None:
            gw.stop()
        triton.stop()


def test_frozen_backend_times_out_cleanly_and_recovers(frozen_setup):
    triton, gw = frozen_setup
    t0 = time.monotonic()
    loads = [Load(kind, model, i, gw, t0) for model in BACKENDS for kind in ("http", "grpc") for i in range(2)]
    for load in loads:
        load.start()
    stopped_at = resumed_at = recovered_at = None
    ready_during: list[int | str] = []
    try:
        # warm: every client has had answers
        wait_for(lambda: all(sum(o.own for o in load.outcomes) >= 3 for load in loads), timeout=30,
                 what="answers before the freeze")
        os.kill(triton.pid, signal.SIGSTOP)
        stopped_at = time.monotonic() - t0
        freeze_end = time.monotonic() + FREEZE_S
        while time.monotonic() < freeze_end:  # the freeze lasts FREEZE_S; readiness must keep answering
            try:
                ready_during.append(http_status(gw.http_url, "/v2/health/ready", timeout=TIMEOUT_S + MARGIN_S))
            except OSError as exc:
                ready_during.append(f"not answered: {exc!r}")
            time.sleep(0.5)  # (pacing the probe, not synchronisation)
    finally:
        os.kill(triton.pid, signal.SIGCONT)
    resumed_at = time.monotonic() - t0

    problems: list[str] = []
    try:
        def recovered() -> bool:
            return (http_status(gw.http_url, "/v2/health/ready") == 200
                    and all(http_status(gw.http_url, f"/v2/models/{m}/ready") == 200 for m in BACKENDS))

        wait_for(recovered, timeout=30, interval=0.2, what="gateway readiness after SIGCONT")
        recovered_at = time.monotonic() - t0
        # keep the load going a while after recovery: every client must get answers again
        count = {load.name: sum(1 for o in load.outcomes if o.began > recovered_at) for load in loads}
        wait_for(lambda: all(sum(1 for o in load.outcomes if o.began > recovered_at) >= count[load.name] + 5
                             for load in loads), timeout=30, what="answers after recovery")
    except TimeoutError as exc:
        problems.append(str(exc))
    finally:
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(CLIENT_TIMEOUT_S + 5)

    assert stopped_at is not None
    window = (stopped_at - TIMEOUT_S - MARGIN_S, recovered_at if recovered_at is not None else float("inf"))
    outcomes = [o for load in loads for o in load.outcomes]
    for o in outcomes:
        backend = BACKENDS[o.who.split("-")[1]]
        if o.ended - o.began > TIMEOUT_S + MARGIN_S:
            problems.append(f"HUNG past {TIMEOUT_S + MARGIN_S}s: {o}")
        if o.own:
            continue
        if o.status == "WRONG ANSWER":
            problems.append(f"ANOTHER REQUEST'S ANSWER: {o}")
        elif not (window[0] <= o.began <= window[1]):
            problems.append(f"failed outside the freeze ({window[0]:.2f}s .. {window[1]:.2f}s): {o}")
        elif o.status not in ("504", "503", "DEADLINE_EXCEEDED", "UNAVAILABLE"):
            problems.append(f"wrong status (want 504 / DEADLINE_EXCEEDED, or 503 / UNAVAILABLE): {o}")
        elif f"'{backend}'" not in o.message:
            problems.append(f"error does not name the backend '{backend}': {o}")
        elif o.status in ("504", "DEADLINE_EXCEEDED") and "within" not in o.message:
            problems.append(f"timeout does not say why ('did not answer within ...'): {o}")
    failed_in_freeze = [o for o in outcomes if not o.own and o.began >= stopped_at]
    if not failed_in_freeze:
        problems.append("no request failed during a 10 s freeze: the freeze did not happen")
    if any(isinstance(r, str) for r in ready_during):
        problems.append(f"readiness not answered during the freeze: {ready_during}")
    if gw.proc.poll() is not None:
        problems.append(f"the gateway exited ({gw.proc.returncode})")

    timeline = (f"freeze {stopped_at:.2f}s, SIGCONT {resumed_at:.2f}s, ready again "
                f"{'never' if recovered_at is None else f'{recovered_at:.2f}s'}; readiness during: {ready_during}")
    statuses = Counter(o.status or "answered" for o in outcomes)
    print(f"{timeline}; {len(outcomes)} requests: {dict(statuses)}")
    failures = "\n".join(f"  {o}" for o in outcomes if not o.own)
    assert not problems, ("\n".join(f"- {p}" for p in problems[:60]) + f"\n{timeline}\nfailed requests:\n{failures}"
                          + f"\n--- gateway log ---\n{gw.log_tail(20)}")
