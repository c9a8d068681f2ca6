"""Triton's generate extension (POST .../generate, .../generate_stream) through the gateway, on
both backend protocols, against the real Triton (2.51, from nvidia-pytriton) answering the same
requests directly: passed through to an HTTP backend, converted for a gRPC backend.

``generate_words`` (tests/models/triton) is decoupled: one answer per word; with a ``gate``
parameter every word after the first waits until the test creates the gate file, so "the
first event reached the client before the backend produced the last" is a fact the test
arranges, not a timing it measures; a request cancelled while waiting leaves
``<gate>.cancelled`` behind.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_gateway
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for

TIMEOUT = 30.0  # bound of every wait on a socket
SSE = "text/event-stream; charset=utf-8"
EXACTLY_ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
               "generates various number of responses")


@pytest.fixture(scope="module", params=["http", "grpc"])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def gateways(triton, tmp_path_factory):
    """One gateway per backend protocol, every model routed to the one Triton."""
    gws = {}
    try:
        for protocol in ("http", "grpc"):
            gws[protocol] = start_gateway(tmp_path_factory.mktemp(f"generate-{protocol}"), triton.http_url,
                                          triton.grpc_url, protocol)
        yield gws
    finally:
        for gw in gws.values():
            gw.stop()


@pytest.fixture
def gw(gateways, backend):
    return gateways[backend]


def post(hostport: str, path: str, body: Any, headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, str, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection(hostport, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        assert b"Traceback" not in data
        return resp.status, resp.getheader("content-type", ""), data
    finally:
        conn.close()


class Events:
    """A generate_stream answer read event by event, as it arrives."""

    def __init__(self, hostport: str, path: str, body: Any) -> None:
        self.conn = http.client.HTTPConnection(hostport, timeout=TIMEOUT)
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.content_type = self.resp.getheader("content-type", "")
        self.buf = b""

    def next(self) -> Any:
        """The next event's JSON, or None at the end of the answer (each read bounded by TIMEOUT)."""
        while b"\n\n" not in self.buf:
            chunk = self.resp.read1(65536)
            if not chunk:
                assert self.buf == b"", self.buf
                return None
            self.buf += chunk
        event, self.buf = self.buf.split(b"\n\n", 1)
        assert event.startswith(b"data: "), event
        return json.loads(event[6:])

    def rest(self) -> list[Any]:
        out = []
        while (event := self.next()) is not None:
            out.append(event)
        return out

    def close(self) -> None:
        self.conn.close()


def stream(hostport: str, path: str, body: Any) -> tuple[int, str, list[Any]]:
    s = Events(hostport, path, body)
    try:
        if not s.content_type.startswith("text/event-stream"):  # an error before the stream began
            return s.status, s.content_type, [json.loads(s.resp.read())]
        return s.status, s.content_type, s.rest()
    finally:
        s.close()


GENERATE = [
    ("generate_words", {"text_input": "hello"}),
    ("generate_words", {"id": "42", "text_input": "hello", "extra": "E", "n": 3,
                        "parameters": {"temperature": 0.5, "flag": True}}),
    ("generate_words", {"text_input": "three words here", "parameters": {"max_tokens": 1}}),
    ("generate_words", {"text_input": "hello world"}),  # two answers: Triton's "exactly 1" error, status 200
    ("generate_words", {"text_input": "", "max_tokens": 0}),  # no answer at all: the same
    ("string_reverse", {"INPUT0": "abc"}),  # one element: a bare value
    ("string_reverse", {"INPUT0": ["abc", "de", ""]}),
    ("add_sub", {"INPUT0": [1, 2.5, -0.1], "INPUT1": [0.5, 0.25, 3]}),
    ("add_sub", {"INPUT0": 1.5, "INPUT1": 2}),
    ("identity_INT64", {"INPUT0": [1, -2, 9007199254740993]}),
    ("identity_BOOL", {"INPUT0": [True, False, True]}),
    ("identity_UINT8", {"INPUT0": 255}),
    ("identity_FP64", {"INPUT0": [1e308, 5e-324, -0.0]}),
]


@pytest.mark.parametrize("model, body", GENERATE, ids=[f"{m}-{i}" for i, (m, _) in enumerate(GENERATE)])
def test_generate_matches_triton(triton, gw, backend, model, body):
    path = f"/v2/models/{model}/generate"
    direct = post(triton.http_url, path, body)
    through = post(gw.http_url, path, body)
    assert through[:2] == direct[:2]
    assert json.loads(through[2]) == json.loads(direct[2])
    if backend == "http":
        assert through[2] == direct[2]  # passed through byte for byte
    if body == {"text_input": "hello world"}:
        assert (through[0], json.loads(through[2])) == (200, {"error": EXACTLY_ONE})


def test_model_error_on_generate(triton, gateways):
    """A model's own error: Triton's HTTP generate answers 400 (its status comes from an error
    it already released); a gRPC backend relays the backend's code (the Python backend: INTERNAL)."""
    body, path = {"text_input": "FAIL"}, "/v2/models/generate_words/generate"
    assert post(gateways["http"].http_url, path, body)[0] == 400
    status, _, data = post(gateways["grpc"].http_url, path, body)
    assert status in (400, 500) and json.loads(data) == {"error": "word 0 failed"}


STREAMS = [
    ("generate_words", {"id": "7", "text_input": "one two three", "temperature": 0.5}),
    ("generate_words", {"text_input": "FAIL then fine"}),  # first answer an error: status 400, events go on
    ("generate_words", {"text_input": "fine then FAIL"}),  # an error mid-stream: status 200
    ("generate_words", {"text_input": "", "max_tokens": 0}),  # no answer: an empty stream
    ("string_reverse", {"INPUT0": ["abc", "de"]}),  # not decoupled: one event (Triton does not refuse it)
    ("add_sub", {"INPUT0": [1, 2]}),  # refused before inference: a plain JSON error, not an event
]


@pytest.mark.parametrize("model, body", STREAMS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(STREAMS)])
def test_generate_stream_matches_triton(triton, gw, model, body):
    path = f"/v2/models/{model}/generate_stream"
    direct = stream(triton.http_url, path, body)
    through = stream(gw.http_url, path, body)
    assert through == direct
    if model == "generate_words" and body["text_input"]:
        assert direct[:2] == (400 if body["text_input"].startswith("FAIL") else 200, SSE)
        assert len(direct[2]) == 3
    if model == "add_sub":
        assert direct[:2] == (400, "application/json") and "expected 2 inputs" in direct[2][0]["error"]


def test_events_arrive_as_the_backend_sends_them(gw, tmp_path):
    """The first event reaches the client while the backend cannot yet have produced the last:
    the model holds every later word until the gate exists, and the test opens it only then."""
    gate = tmp_path / "gate"
    s = Events(gw.http_url, "/v2/models/generate_words/generate_stream",
               {"text_input": "first second last", "gate": str(gate)})
    try:
        assert (s.status, s.content_type) == (200, SSE)
        first = s.next()
        assert first["text_output"] == "first" and first["index"] == 0
        assert not gate.exists()  # so "second" and "last" are not produced yet
        gate.touch()
        assert [e["text_output"] for e in s.rest()] == ["second", "last"]
    finally:
        s.close()


def test_client_leaving_cancels_the_backend(gw, tmp_path):
    """A client that leaves mid-stream: the gateway stops the backend's request (the model sees it
    cancelled), and goes on serving."""
    for i in range(2):  # twice: nothing of the first left behind stands in the way
        gate = tmp_path / f"gate{i}"
        s = Events(gw.http_url, "/v2/models/generate_words/generate_stream",
                   {"text_input": "first never", "gate": str(gate)})
        assert s.next()["text_output"] == "first"
        s.close()
        wait_for(lambda g=gate: Path(f"{g}.cancelled").exists(), timeout=TIMEOUT, what="the backend's cancellation")
        assert not gate.exists()
    status, _, data = post(gw.http_url, "/v2/models/generate_words/generate", {"text_input": "still"})
    assert status == 200 and json.loads(data)["text_output"] == "still"
    assert gw.proc.poll() is None


def test_unknown_model_and_version(triton, gw):
    for path in ("/v2/models/nope/generate", "/v2/models/nope/generate_stream",
                 "/v2/models/generate_words/versions/9/generate", "/v2/models/generate_words/versions/x/generate"):
        direct = post(triton.http_url, path, {"text_input": "a"})
        through = post(gw.http_url, path, {"text_input": "a"})
        assert through == direct, path
        assert direct[0] == 404


def test_other_methods_are_refused_as_triton_does(triton, gw):
    direct = post(triton.http_url, "/v2/models/generate_words/generate", b"", method="GET")
    through = post(gw.http_url, "/v2/models/generate_words/generate", b"", method="GET")
    expected = (405, {"error": "Method Not Allowed"})
    assert (through[0], json.loads(through[2])) == (direct[0], json.loads(direct[2])) == expected


def test_bad_json(triton, gw, backend):
    """Passed through, Triton's own answer (a 500, as its JSON parser reports it); converted,
    the gateway's 400 — a client's malformed body either way, never a traceback."""
    for raw in (b"{bad", b"", b"[1, 2]"):
        status, ctype, data = post(gw.http_url, "/v2/models/generate_words/generate_stream", raw)
        assert ctype == "application/json" and set(json.loads(data)) == {"error"}
        if backend == "http":
            assert (status, data) == post(triton.http_url, "/v2/models/generate_words/generate_stream", raw)[::2]
        else:
            assert status == 400


@pytest.mark.parametrize("body, named", [
    ({"text_input": "a", "timeout": 5}, "generate key 'timeout' cannot be sent to a gRPC backend"),
    ({"text_input": "a", "parameters": {"sequence_id": 3}}, "generate key 'sequence_id'"),
    ({"text_input": "a", "max_tokens": 2**31}, "input 'max_tokens': 2147483648 is out of range for INT32"),
    ({"text_input": "a", "max_tokens": 1.5}, "input 'max_tokens' is INT32"),
    ({"text_input": ["a", ["b"]]}, "input 'text_input': generate takes one value or a flat array"),
    ({"text_input": "a", "big": 2**64}, "parameter 'big' = 18446744073709551616 does not fit"),
])
def test_keys_that_cannot_be_converted(gateways, body, named):
    """What a gRPC backend cannot carry unchanged is refused before anything is sent, naming it."""
    for api in ("generate", "generate_stream"):
        status, ctype, data = post(gateways["grpc"].http_url, f"/v2/models/generate_words/{api}", body)
        assert status == 400 and ctype == "application/json"
        assert named in json.loads(data)["error"]


def _load_generate_words(triton, max_tokens_dims: list[int]) -> None:
    """Reload generate_words on Triton with ``max_tokens`` of these dims (its config.pbtxt's, as an
    override: Triton serves the old config until the new one is loaded — no gap; a load without
    an override would keep the last override)."""
    config = {"name": "generate_words", "backend": "python", "max_batch_size": 0,
              "model_transaction_policy": {"decoupled": True},
              "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]},
                        {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": max_tokens_dims, "optional": True}],
              "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
                         {"name": "index", "data_type": "TYPE_INT32", "dims": [1]}],
              "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
    body = {"parameters": {"config": json.dumps(config)}}
    status, _, data = post(triton.http_url, "/v2/repository/models/generate_words/load", body)
    assert status == 200, data


def test_metadata_follows_a_model_reload(triton, gateways):
    """A gRPC backend converts with the model's metadata as cached; reloaded on the backend with
    other inputs, the model's first request through the gateway is converted with the new ones."""
    gw, path = gateways["grpc"], "/v2/models/generate_words/generate"
    assert json.loads(post(gw.http_url, path, {"text_input": "a b", "max_tokens": 1})[2])["text_output"] == "a"
    try:
        _load_generate_words(triton, [2])
        body = {"text_input": "a b c", "max_tokens": [1, 0]}
        direct, through = post(triton.http_url, path, body), post(gw.http_url, path, body)
        assert (through[0], json.loads(through[2])) == (direct[0], json.loads(direct[2]))
        assert direct[0] == 200 and json.loads(direct[2])["text_output"] == "a"
    finally:
        _load_generate_words(triton, [1])  # back to config.pbtxt's
    status, _, data = post(gw.http_url, path, {"text_input": "a b", "max_tokens": 1})
    assert status == 200 and json.loads(data)["text_output"] == "a"


def test_metrics_count_both_endpoints(gw):
    post(gw.http_url, "/v2/models/generate_words/generate", {"text_input": "m"})
    stream(gw.http_url, "/v2/models/generate_words/generate_stream", {"text_input": "m"})
    with urllib.request.urlopen(f"http://{gw.metrics_url}/metrics", timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    for api in ("generate", "generate_stream"):
        assert any(line.startswith("oip_gateway_requests_total{") and f'api="{api}"' in line and 'code="200"' in line
                   for line in text.splitlines()), api


def test_a_server_without_generate_says_so(reference):
    """The embedded reference server's data plane has no generate: a clear refusal."""
    status, _, data = post(reference.http_url, "/v2/models/add_sub/generate", {"INPUT0": 1})
    assert status == 400 and "generate extension" in json.loads(data)["error"]


class BreakingBackend:
    """A real HTTP/1.1 listener that answers a generate_stream with one event, chunked as
    Triton sends it, and then drops the connection — between two events, or in the middle of
    the second (``{"cut": "mid"}``). Probes (GET) get an empty 200."""

    EVENT = b'data: {"model_name":"m","model_version":"1","text_output":"one"}\n\n'

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    if not (data := conn.recv(65536)):
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                if not head.startswith(b"POST /v2/models/m/generate_stream"):
                    conn.sendall(b"HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n"
                                 % (b"200 OK" if head.startswith(b"GET") else b"404 Not Found"))
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(self.EVENT), self.EVENT))
                if json.loads(body).get("cut") == "mid":
                    conn.sendall(b"%x\r\n%s\r\n" % (len(self.EVENT), self.EVENT[:20]))
                return  # the connection drops

    def close(self) -> None:
        self.sock.close()


def test_backend_breaking_off_mid_stream(tmp_path):
    """Between two events the relay ends with an error event and a complete answer; in the middle
    of one it cannot (the client sees the answer cut off). The gateway goes on serving."""
    backend = BreakingBackend()
    config = gateway_config({"s": {"protocol": "http", "endpoints": [backend.address]}},
                            [{"model": "m", "backend": "s"}])
    try:
        with GatewayProcess(config, tmp_path, "gw-breaking") as gw:
            status, ctype, events = stream(gw.http_url, "/v2/models/m/generate_stream", {"cut": "boundary"})
            assert (status, ctype) == (200, SSE)
            assert events[0]["text_output"] == "one" and "connection closed by the backend" in events[1]["error"]
            assert len(events) == 2
            s = Events(gw.http_url, "/v2/models/m/generate_stream", {"cut": "mid"})
            try:
                assert s.next()["text_output"] == "one"
                with pytest.raises(http.client.IncompleteRead):
                    s.next()
            finally:
                s.close()
            assert stream(gw.http_url, "/v2/models/m/generate_stream", {})[2][0]["text_output"] == "one"
            assert gw.proc.poll() is None
    finally:
        backend.close()
