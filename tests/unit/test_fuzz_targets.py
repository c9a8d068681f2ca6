"""Bounded runs of the coverage-guided fuzz harnesses (fuzz/, docs/fuzzing.md).

- every file of fuzz/corpus/<target>/ (seeds, and the inputs of bugs found: crash-*) replays
  through the harness, which checks the contract and its differential checks;
- atheris (libFuzzer) runs each harness for a fixed number of inputs from a fixed seed, in a
  subprocess (new inputs go to a temporary directory, never into the seed corpus);
- hypothesis builds structured inputs mutation seldom reaches — V2 JSON whose data matches
  its shape, ModelInferRequests, configs, backends' HTTP/1.1 answers, well-formed HTTP/2 gRPC
  exchanges of a client and of a backend (written by the ``h2`` package, so the harnesses'
  differential checks apply) — and feeds them to the same harnesses.

The long run is in docs/fuzzing.md.
"""
from __future__ import annotations

import gzip
import importlib
import json
import os
import pathlib
import resource
import subprocess
import sys
import zlib
from typing import Any

import h2.config
import h2.connection
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz import NEEDS_H2, TARGETS, config, grpc_wire, h1_answer, h2_answer, h2_listen, http_body
from gateway import h2 as gateway_h2
from gateway._pb import grpc_predict_v2_pb2 as pb
from tests.unit.test_h1_framing_diff import Answer, answers

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Inputs per target beyond the seeds: ~3-10 s each here (instrumented, 2 cores shared; a config
# input is a whole load and check, ~5 ms).
RUNS = {"http_body": 6000, "grpc_wire": 15000, "config": 1500, "h1_answer": 30000, "h2_listen": 6000,
        "h2_answer": 3500}


def _skip_without_h2(target: str) -> None:
    if target in NEEDS_H2 and not gateway_h2.available():
        pytest.skip("gateway.h2._h2 is not built (no libnghttp2-dev): no HTTP/2 path to fuzz")


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_replays(target: str) -> None:
    _skip_without_h2(target)
    harness = importlib.import_module(f"fuzz.{target}")
    files = sorted((ROOT / "fuzz" / "corpus" / target).iterdir())
    assert any(f.name.startswith("seed-") for f in files)
    for f in files:
        harness.one_input(f.read_bytes())


@pytest.mark.parametrize("target", TARGETS)
def test_bounded_atheris_run(target: str, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("atheris")
    _skip_without_h2(target)
    # libFuzzer holds getrusage's peak RSS to -rss_limit_mb, and a process started from this one
    # inherits this one's peak (ru_maxrss survives fork and exec): a test that drove the test
    # process's own RSS up would make every fuzzer "run out of memory" at its first input.
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    assert inherited < 1400, (f"the test process peaked at {inherited} MB before this test, and a fuzzer started "
                              "from it inherits that peak: send large bursts from a process of their own "
                              "(tests/support/burst.py)")
    runs = RUNS[target]
    found = tmp_path / "corpus"
    found.mkdir()
    cmd = [sys.executable, "-m", f"fuzz.{target}", f"-runs={runs}", "-seed=1", "-rss_limit_mb=1536",
           f"-dict={ROOT / 'fuzz' / 'dicts' / f'{target}.dict'}", f"-artifact_prefix={tmp_path}/",
           str(found), str(ROOT / "fuzz" / "corpus" / target)]
    # TMPDIR: the config harness's scratch file (libFuzzer exits from C, past Python's atexit).
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "oom-", "timeout-", "leak-")))
    assert proc.returncode == 0 and not crashes, f"{crashes}\n{proc.stderr[-6000:]}"
    assert f"Done {runs} runs" in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------ structured inputs
_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
              "FP16", "BF16", "FP32", "FP64", "BYTES"]
_NUMBERS = st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=False, width=64), st.booleans(), st.none())
_PARAM = st.one_of(st.text(max_size=8), st.integers(-(2**64), 2**64), st.floats(allow_nan=False), st.booleans())
_NAMES = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", "x", "sequence_id", "\u00e9", ""])


def _value(datatype: str) -> st.SearchStrategy[Any]:
    if datatype == "BYTES":
        return st.text(max_size=6)
    if datatype == "BOOL":
        return st.booleans()
    if datatype.startswith(("FP", "BF")):
        return st.floats(allow_nan=False, width=32)
    return st.integers(-300, 70000)


@st.composite
def _tensor(draw: st.DrawFn, binary: bool) -> tuple[dict[str, Any], bytes]:
    datatype = draw(st.sampled_from(_DATATYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = 1
    for d in shape:
        count *= d
    obj: dict[str, Any] = {"name": draw(_NAMES), "datatype": datatype, "shape": shape}
    if draw(st.booleans()):
        obj["parameters"] = draw(st.dictionaries(st.sampled_from(["sequence_id", "binary_data", "p"]), _PARAM,
                                                 max_size=2))
    if binary and draw(st.booleans()):
        raw = draw(st.binary(max_size=4 * count + 4))
        obj.setdefault("parameters", {})["binary_data_size"] = len(raw)
        return obj, raw
    n = count if draw(st.integers(0, 9)) else draw(st.integers(0, 5))  # mostly the right count
    obj["data"] = draw(st.lists(_value(datatype) if draw(st.integers(0, 9)) else _NUMBERS, min_size=n, max_size=n))
    return obj, b""


@st.composite
def _http_input(draw: st.DrawFn) -> bytes:
    binary = draw(st.booleans())
    tensors = draw(st.lists(_tensor(binary), max_size=3))
    doc: dict[str, Any] = {"inputs": [t for t, _ in tensors]}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": draw(_NAMES), "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        doc["parameters"] = draw(st.dictionaries(st.sampled_from(["sequence_id", "binary_data_output", "q"]),
                                                 _PARAM, max_size=2))
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=4))
    header = json.dumps(doc).encode()  # the stdlib writes integers past 64 bits too
    tail = b"".join(raw for _, raw in tensors)
    flags = (1 if binary else 0) | draw(st.sampled_from([0, 8, 16]))  # shape; none, gzip or deflate
    return bytes([flags, draw(st.integers(0, 255))]) + header + (b"\0" + tail if binary else b"")


@given(_http_input())
@settings(max_examples=150)
def test_http_body_structured(data: bytes) -> None:
    http_body.one_input(data)
    http_body.one_input(bytes([data[0] | 4]) + data[1:])  # the same body as a backend's answer


@st.composite
def _grpc_input(draw: st.DrawFn) -> bytes:
    msg = pb.ModelInferRequest(model_name=draw(st.text(max_size=5)), model_version=draw(st.text(max_size=2)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = msg.inputs.add(name=draw(_NAMES), datatype=draw(st.sampled_from(_DATATYPES)),
                           shape=draw(st.lists(st.integers(0, 3), max_size=3)))
        if raw:
            msg.raw_input_contents.append(draw(st.binary(max_size=24)))
        elif t.datatype == "BYTES":
            t.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=4), max_size=4)))
        else:
            t.contents.int_contents.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)))
    sequence = draw(st.sampled_from(["int64_param", "uint64_param", "string_param", "bool_param", None]))
    if sequence is not None:
        value = {"int64_param": st.integers(-(2**63), 2**63 - 1), "uint64_param": st.integers(0, 2**64 - 1),
                 "string_param": st.text(max_size=4), "bool_param": st.booleans()}[sequence]
        setattr(msg.parameters["sequence_id"], sequence, draw(value))
    data = msg.SerializeToString()
    if draw(st.booleans()):  # protobuf's field order is free: shuffle by appending a repeat
        data += draw(st.binary(max_size=12))
    return data


@given(_grpc_input())
@settings(max_examples=150)
def test_grpc_wire_structured(data: bytes) -> None:
    grpc_wire.one_input(data)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True),
                     st.sampled_from(["127.0.0.1:8000", "[::1]:0", "grpc", "http", "least_queue", "", "a:b:c"]))


@st.composite
def _config_input(draw: st.DrawFn) -> bytes:
    backend = {k: draw(_SCALARS) for k in draw(st.sets(st.sampled_from(
        ["timeout_s", "balance", "retries", "max_connections", "binary_extension", "tls", "non_utf8_bytes"])))}
    backend["protocol"] = draw(st.sampled_from(["http", "grpc", "tcp"]))
    backend["endpoints"] = draw(st.lists(st.one_of(_SCALARS, st.fixed_dictionaries({"dns": _SCALARS})),
                                         min_size=0, max_size=2))
    route: dict[str, Any] = {"model": draw(st.sampled_from(["m", "m-*", "", 3])), "backend": "b"}
    if draw(st.booleans()):
        route["version"] = draw(_SCALARS)
    doc: dict[str, Any] = {"backends": {"b": backend}, "routes": [route]}
    for key in draw(st.sets(st.sampled_from(["workers", "drain_s", "max_json_depth", "access_log", "listen"]))):
        doc[key] = draw(_SCALARS)
    return yaml.safe_dump(doc).encode()


@given(_config_input())
@settings(max_examples=100)
def test_config_structured(data: bytes) -> None:
    config.one_input(data)


@given(st.lists(answers(), min_size=1, max_size=2), st.integers(0, 63), st.binary(min_size=3, max_size=3))
@settings(max_examples=150)
def test_h1_answer_structured(exchanges: list[Answer], flags: int, sizes: bytes) -> None:
    """Answers of every framing (the generator of tests/unit/test_h1_framing_diff.py), each
    exchange's bytes apart (flag bit 5) when there are two."""
    flags = flags | 32 if len(exchanges) > 1 else flags & ~32
    h1_answer.one_input(bytes([flags]) + sizes + b"\0\0".join(a.data for a in exchanges))


# ------------------------------------------------------------------ HTTP/2 exchanges (h2 writes them)
def _h2_head(path: str) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"gateway:8001"), (b":path", path.encode()),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")]

_MESSAGES = st.lists(st.binary(max_size=90), max_size=3)


def _h2_peer(client: bool) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client, header_encoding=None))
    conn.initiate_connection()
    return conn


def _grpc_body(draw: st.DrawFn, messages: list[bytes], encoding: bytes) -> bytes:
    """The messages, each compressed (flag 1) or not when ``encoding`` is gzip or deflate."""
    out = b""
    for m in messages:
        if encoding and draw(st.booleans()):
            m = gzip.compress(m, mtime=0) if encoding == b"gzip" else zlib.compress(m)
            out += b"\x01" + len(m).to_bytes(4, "big") + m
        else:
            out += b"\x00" + len(m).to_bytes(4, "big") + m
    return out


def _send_cut(draw: st.DrawFn, conn: h2.connection.H2Connection, sid: int, body: bytes, end: bool) -> None:
    """``body`` as DATA frames cut where hypothesis says."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=3)))) if len(body) > 1 else []
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    for i, part in enumerate(parts):
        conn.send_data(sid, part, end_stream=end and i == len(parts) - 1)


@st.composite
def _h2_client_input(draw: st.DrawFn) -> bytes:
    """A gRPC client's calls (fuzz/h2_listen.py's methods, and an unknown one): messages cut
    into DATA frames, maybe compressed; each call ended, ended by trailers, reset or left open."""
    c = _h2_peer(True)
    own_preface = draw(st.booleans())
    if not own_preface:
        c.data_to_send()  # flag bit 2 puts one first
    sid = 1
    for _ in range(draw(st.integers(1, 4))):
        method = draw(st.sampled_from(["ModelInfer", "ModelInfer", "ServerLive", "ModelReady", "ModelStreamInfer",
                                       "Unknown"]))
        encoding = draw(st.sampled_from([b"", b"gzip", b"deflate"]))
        head = _h2_head(f"/inference.GRPCInferenceService/{method}")
        if encoding:
            head.append((b"grpc-encoding", encoding))
        if draw(st.booleans()):
            head.append((b"x-request-id", b"r-%d" % sid))
        # A unary call carries one message (mostly: the differential check needs that).
        messages = draw(_MESSAGES if method != "ModelInfer" or draw(st.integers(0, 3)) == 0 else
                        st.lists(st.binary(max_size=90), min_size=1, max_size=1))
        body = _grpc_body(draw, messages, encoding)
        end = draw(st.sampled_from(["end", "end", "trailers", "reset", "open"]))
        c.send_headers(sid, head, end_stream=end == "end" and not body)
        if body:
            _send_cut(draw, c, sid, body, end == "end")
        if end == "trailers":
            c.send_headers(sid, [(b"x-trailer", b"1")], end_stream=True)
        elif end == "reset":
            c.reset_stream(sid, 8)
        if draw(st.integers(0, 5)) == 0:
            c.ping(b"12345678")
        sid += 2
    if draw(st.integers(0, 5)) == 0:
        c.close_connection()
    flags = draw(st.integers(0, 255)) & ~4 | (0 if own_preface else 4)
    if draw(st.integers(0, 3)):
        flags &= ~(16 | 128)  # (the differential check is off with a moving clock or a drain)
    return bytes([flags]) + draw(st.binary(min_size=3, max_size=3)) + c.data_to_send()


@given(_h2_client_input())
@settings(max_examples=150, deadline=None)
def test_h2_listen_structured(data: bytes) -> None:
    _skip_without_h2("h2_listen")
    h2_listen.one_input(data)


@st.composite
def _h2_backend_input(draw: st.DrawFn) -> bytes:
    """A backend's answers to fuzz/h2_answer.py's calls (streams 1 and 3): a head, messages cut
    into DATA frames, maybe compressed, and trailers with any status; trailers-only; a reset; an
    answer without a status; or silence — the streams' frames interleaved, maybe a GOAWAY."""
    flags = draw(st.integers(0, 255))
    requests = (h2_answer.SMALL_REQUESTS if flags & 8 else h2_answer.REQUESTS)[:2 if flags & 16 else 1]
    c = _h2_peer(True)
    for sid, request in zip((1, 3), requests):
        c.send_headers(sid, _h2_head(h2_answer.METHOD))
        c.send_data(sid, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
    s = _h2_peer(False)
    s.receive_data(c.data_to_send())
    if flags & 4:
        s.data_to_send()  # flag bit 2 puts a SETTINGS and its ACK first
    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    steps: list[list[Any]] = []
    for sid in (1, 3)[:len(requests)]:
        kind = draw(st.sampled_from(["answer", "answer", "trailers_only", "reset", "no_status", "silence"]))
        status = [(b"grpc-status", str(draw(st.integers(0, 16))).encode())]
        if draw(st.booleans()):
            status.append((b"grpc-message", b"m%25"))
        ops: list[Any] = []
        if kind == "trailers_only":
            ops.append(lambda sid=sid, st_=status: s.send_headers(sid, ok + st_, end_stream=True))
        elif kind == "reset":
            code = draw(st.sampled_from([0, 2, 7, 8]))
            ops.append(lambda sid=sid, code=code: s.reset_stream(sid, code))
        elif kind != "silence":
            encoding = draw(st.sampled_from([b"", b"gzip", b"deflate"]))
            head = ok + ([(b"grpc-encoding", encoding)] if encoding else [])
            body = _grpc_body(draw, draw(_MESSAGES), encoding)
            ops.append(lambda sid=sid, h=head: s.send_headers(sid, h))
            if body:
                ops.append(lambda sid=sid, b=body, no_status=kind == "no_status": _send_cut(draw, s, sid, b, no_status))
            if kind == "answer":
                ops.append(lambda sid=sid, st_=status: s.send_headers(sid, st_, end_stream=True))
            elif not body:
                ops.append(lambda sid=sid: s.send_data(sid, b"", end_stream=True))
        steps.append(ops)
    while any(steps):
        ops = draw(st.sampled_from([o for o in steps if o]))
        ops.pop(0)()
    if draw(st.integers(0, 5)) == 0:
        s.close_connection(0, last_stream_id=draw(st.sampled_from([0, 1, 3])))
    return bytes([flags]) + draw(st.binary(min_size=3, max_size=3)) + s.data_to_send()


@given(_h2_backend_input())
@settings(max_examples=150, deadline=None)
def test_h2_answer_structured(data: bytes) -> None:
    _skip_without_h2("h2_answer")
    h2_answer.one_input(data)
