"""A misbehaving V2 HTTP/1.1 backend for tests (issue 35: backends are untrusted input too).

``BadBackend(behaviour)`` listens on 127.0.0.1, port 0 (``.address`` reads back the one it got),
with one thread per connection, in threads of its own (never the test's event loop), keep-alive.
Everything but inference is a well-behaved Triton-like server, so the gateway's health checker
finds it live with its model ready:

* ``GET /v2/health/live``, ``/v2/health/ready`` → 200, empty;
* ``POST /v2/repository/index`` → 200 ``[{"name": <model>, "version": "1", "state": "READY"}]``
  (``index=False``: 404, and the gateway asks ``GET /v2/models/<model>/ready`` → 200 instead);
* ``GET /v2/models/<model>`` → metadata (INPUT0 → OUTPUT0, FP32 [-1, -1]); ``GET /v2`` → server metadata.

``POST /v2/models/<model>[/versions/1]/infer`` is answered by ONE behaviour, fixed per instance,
written ``name`` or ``name:variant``. The normal answer it starts from echoes the request: V2
JSON whose ``id`` is the request's and whose ``OUTPUT0`` is ``INPUT0`` (same datatype and shape),
read from a JSON request or a binary-extension one (``Inference-Header-Content-Length``), so a
client can tell its own answer from anyone else's. Behaviours (``BEHAVIOURS``):

==========================  ===================================================================
``echo``                    the normal answer (a control)
``interim:100|102|103|all`` ``100 Continue`` / ``102 Processing`` / ``103 Early Hints`` (with a
                            Link header) / all three, each written alone, then the answer
``extra_after:garbage``     the answer and, in the same write, bytes that are no HTTP answer
``extra_after:answer``      the answer and, in the same write, a complete second answer carrying
                            another request's output (the previous request's answer, any
                            connection; a decoy before the first)
``extra_after:garbage_delayed`` / ``extra_after:answer_delayed``
                            the same extra bytes written ``delay_s`` after the answer, only if no
                            request came on the connection meanwhile (unsolicited bytes on an idle
                            connection, which a client can tell; ``extras_sent`` counts them,
                            ``delaying`` is the number of connections still inside that window)
``cl_too_long:close|silent`` Content-Length 64 more than the body sent, then close (FIN) / silence
``cl_lie_huge:close|silent`` ``Content-Length: 1000000000``, the real body (a few bytes), then
                            close / silence
``conflicting:two_lengths`` two different Content-Length headers (the body fits the first)
``conflicting:length_and_chunked`` Content-Length (the unchunked body's length) and
                            ``Transfer-Encoding: chunked``, body chunked: read by length it is
                            garbage and leaves bytes on the connection
``conflicting:bad_chunk_size`` chunked, the first chunk size ``zz``
``conflicting:huge_chunk``  chunked, one chunk announcing 0x7fffffffff bytes, a few sent, silence
``endless_chunked``         chunked JSON that never ends (16 KiB of spaces every 2 ms) until the
                            client goes or ``max_s`` passes
``huge_head:count``         100,000 header lines, then Content-Length and the body
``huge_head:bytes``         one 10 MiB header, then Content-Length and the body
``slow``                    the answer after ``slow_s`` seconds
``silent``                  no answer; the connection stays open until the client closes it
``reset_before``            RST (SO_LINGER 0) right after reading the request
``reset_mid``               the head and half the body, then RST
``http10_close``            ``HTTP/1.0 200 OK``, no Content-Length, the body, close (valid)
``http10_close:http11``     ``HTTP/1.1 200 OK``, ``Connection: close``, no length, body, close (valid)
``bad_encoding:br|x-unknown`` the answer (plain JSON) labelled ``Content-Encoding: br`` / ``x-unknown``
==========================  ===================================================================

``infers`` counts inference requests received; ``close()`` stops everything (threads end, open
connections are shut down). ``python -m tests.support.badbackend BEHAVIOUR [--model M]`` runs one in
a process of its own and prints its address.
"""
from __future__ import annotations

import json
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

__all__ = ["BEHAVIOURS", "BadBackend", "echo_answer"]

_DTYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
           "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
           "FP32": np.float32, "FP64": np.float64}
_DECOY = {"id": "decoy-not-anyones", "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1],
                                                  "data": [-12345.0]}]}


# -- requests --------------------------------------------------------------------------------------
class _Request:
    __slots__ = ("body", "headers", "method", "path", "version")

    def __init__(self, method: str, path: str, version: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.path, self.version, self.headers, self.body = method, path, version, headers, body


class _Reader:
    """Requests off one connection (Content-Length or chunked bodies), keeping what is left over."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def _more(self) -> bool:
        try:
            chunk = self.conn.recv(1 << 16)
        except OSError:
            return False
        self.buf += chunk
        return bool(chunk)

    def _line(self) -> bytes | None:
        while b"\r\n" not in self.buf:
            if not self._more():
                return None
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._more():
                return None
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def request(self) -> _Request | None:
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                return None
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, version = (lines[0].split(" ") + ["", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size_line = self._line()
                if size_line is None:
                    return None
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while self._line() not in (b"", None):  # trailers, up to the empty line
                        pass
                    break
                data = self._exactly(size + 2)
                if data is None:
                    return None
                body += data[:-2]
        else:
            body = self._exactly(int(headers.get("content-length", "0") or 0))
            if body is None:
                return None
        return _Request(method, path, version, headers, body)


def echo_answer(request: _Request, model: str) -> dict:
    """The V2 answer echoing ``request``: its id, OUTPUT0 = INPUT0 (JSON data)."""
    length = request.headers.get("inference-header-content-length")
    doc_bytes, binary = (request.body[:int(length)], request.body[int(length):]) if length else (request.body, b"")
    doc = json.loads(doc_bytes)
    outputs, offset = [], 0
    for tensor in doc.get("inputs", []):
        dtype, shape = tensor["datatype"], tensor["shape"]
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            array = np.frombuffer(binary[offset:offset + size], dtype=_DTYPES[dtype])
            offset += size
            data = array.tolist()
        else:
            data = np.asarray(tensor["data"]).reshape(-1).tolist()
        outputs.append({"name": tensor["name"].replace("INPUT", "OUTPUT"), "datatype": dtype, "shape": shape,
                        "data": data})
    answer = {"model_name": model, "model_version": "1", "outputs": outputs}
    if "id" in doc:
        answer["id"] = doc["id"]
    return answer


def _response(body: bytes, status: str = "200 OK", extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (version + b" " + status.encode() + b"\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


# -- the server ------------------------------------------------------------------------------------
class BadBackend:
    def __init__(self, behaviour: str, model: str = "bad", *, index: bool = True, slow_s: float = 4.0,
                 delay_s: float = 0.15, max_s: float = 30.0) -> None:
        name, _, self.variant = behaviour.partition(":")
        if name not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}; one of {', '.join(sorted(BEHAVIOURS))}")
        self.behaviour = behaviour
        self._act: Callable[[BadBackend, socket.socket, _Reader, _Request, bytes], bool] = BEHAVIOURS[name]
        self.model, self.index, self.slow_s, self.delay_s, self.max_s = model, index, slow_s, delay_s, max_s
        self.infers = 0
        self.extras_sent = 0
        self.delaying = 0  # connections inside their delay window (``*_delayed``): extras may still come
        self._last_answer = json.dumps(_DECOY).encode()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name=f"bad-{behaviour}").start()

    def __enter__(self) -> BadBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- plumbing --------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn)
        try:
            while not self._stop.is_set():
                request = reader.request()
                if request is None:
                    return
                if not self._dispatch(conn, reader, request):
                    return
        except OSError:
            return  # the gateway closed or reset its side: nothing to answer
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _dispatch(self, conn: socket.socket, reader: _Reader, request: _Request) -> bool:
        """Answer one request; False: the connection is done."""
        path, model = request.path.split("?")[0].rstrip("/"), self.model
        prefix = f"/v2/models/{model}"
        if request.method == "POST" and path in (f"{prefix}/infer", f"{prefix}/versions/1/infer"):
            with self._lock:
                self.infers += 1
            answer = json.dumps(echo_answer(request, model)).encode()
            keep = self._act(self, conn, reader, request, answer)
            with self._lock:
                self._last_answer = answer
            return keep
        if path in ("/v2/health/live", "/v2/health/ready", f"{prefix}/ready", f"{prefix}/versions/1/ready"):
            conn.sendall(_response(b""))
        elif request.method == "POST" and path == "/v2/repository/index":
            if self.index:
                conn.sendall(_response(json.dumps([{"name": model, "version": "1", "state": "READY"}]).encode()))
            else:
                conn.sendall(_response(b'{"error":"no repository index here"}', "404 Not Found"))
        elif request.method == "GET" and path in (prefix, f"{prefix}/versions/1"):
            meta = {"name": model, "versions": ["1"], "platform": "badbackend",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
                    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
            conn.sendall(_response(json.dumps(meta).encode()))
        elif request.method == "GET" and path == "/v2":
            conn.sendall(_response(b'{"name":"badbackend","version":"0","extensions":[]}'))
        else:
            conn.sendall(_response(json.dumps({"error": f"badbackend: no {request.method} {path}"}).encode(),
                                   "404 Not Found"))
        return True

    def _wait_for_close(self, conn: socket.socket, reader: _Reader, limit: float | None = None) -> None:
        """Stay silent until the client closes the connection (what it sends is ignored), ``close()``,
        or ``limit`` seconds."""
        deadline = time.monotonic() + (self.max_s if limit is None else limit)
        while not self._stop.is_set() and time.monotonic() < deadline:
            ready, _, _ = select.select([conn], [], [], 0.1)
            if ready and not reader._more():
                return

    def _idle_for(self, conn: socket.socket, reader: _Reader, seconds: float) -> bool:
        """Whether no byte came on the connection within ``seconds``."""
        if reader.buf:
            return False
        ready, _, _ = select.select([conn], [], [], seconds)
        return not ready

    @staticmethod
    def _reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


# -- behaviours: (server, conn, reader, request, answer body) -> keep the connection ------------------
def _echo(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(_response(answer))
    return True


def _interim(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    interims = {"100": [b"HTTP/1.1 100 Continue\r\n\r\n"],
                "102": [b"HTTP/1.1 102 Processing\r\n\r\n"],
                "103": [b"HTTP/1.1 103 Early Hints\r\nLink: </hints.css>; rel=preload; as=style\r\n"
                        b"X-Early: 1\r\n\r\n"]}
    interims["all"] = interims["100"] + interims["103"] + interims["102"]
    for head in interims[b.variant or "100"]:
        conn.sendall(head)
        time.sleep(0.01)  # each its own segment: the parser meets it alone, then the answer
    conn.sendall(_response(answer))
    return True


def _extra_after(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    variant = b.variant or "garbage"
    if variant.startswith("garbage"):
        extra = b"\x00\x01 this is not HTTP \xff\r\n\r\nHTTP/9.9 whatever\r\n\r\n"
    else:
        with b._lock:
            extra = _response(b._last_answer)  # another request's answer, complete and well framed
    if not variant.endswith("_delayed"):
        conn.sendall(_response(answer) + extra)
        return True
    with b._lock:
        b.delaying += 1  # before the answer goes: whoever sees the answer sees the window open
    try:
        conn.sendall(_response(answer))
        if b._idle_for(conn, reader, b.delay_s):  # unsolicited bytes on an idle connection
            conn.sendall(extra)
            with b._lock:
                b.extras_sent += 1
    finally:
        with b._lock:
            b.delaying -= 1
    return True


def _cl_too_long(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(answer) + 64, answer))
    if b.variant == "silent":
        b._wait_for_close(conn, reader)
    else:
        conn.shutdown(socket.SHUT_WR)
    return False


def _cl_lie_huge(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
                 + answer)
    if b.variant == "silent":
        b._wait_for_close(conn, reader)
    else:
        conn.shutdown(socket.SHUT_WR)
    return False


def _conflicting(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    variant = b.variant or "two_lengths"
    if variant == "two_lengths":
        conn.sendall(head + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(answer), len(answer) + 10, answer))
    elif variant == "length_and_chunked":
        conn.sendall(head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s"
                     % (len(answer), _chunked(answer)))
    elif variant == "bad_chunk_size":
        conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n%s\r\n0\r\n\r\n" % answer)
    elif variant == "huge_chunk":
        conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n7fffffffff\r\n" + answer)
        b._wait_for_close(conn, reader)
        return False
    else:
        raise ValueError(f"conflicting: unknown variant {variant!r}")
    return True


def _endless_chunked(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"%x\r\n%s\r\n" % (len(answer) - 1, answer[:-1]))  # the JSON, all but its closing brace
    chunk = b"%x\r\n%s\r\n" % (16384, b" " * 16384)
    deadline = time.monotonic() + b.max_s
    while not b._stop.is_set() and time.monotonic() < deadline:
        conn.sendall(chunk)  # raises once the client closed: the connection is done
        time.sleep(0.002)
    return False


def _huge_head(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    if b.variant == "bytes":
        conn.sendall(b"X-Huge: ")
        piece = b"a" * (1 << 16)
        for _ in range((10 << 20) // len(piece)):
            conn.sendall(piece)
        conn.sendall(b"\r\n")
    else:
        lines = b"".join(b"X-Header-%06d: value\r\n" % i for i in range(100_000))
        for i in range(0, len(lines), 1 << 16):
            conn.sendall(lines[i:i + (1 << 16)])
    conn.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
    return True


def _slow(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    if b._stop.wait(b.slow_s):
        return False
    conn.sendall(_response(answer))  # late: a gateway that kept the connection would read this next
    return True


def _silent(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    b._wait_for_close(conn, reader)
    return False


def _reset_before(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    b._reset(conn)
    return False


def _reset_mid(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    full = _response(answer)
    conn.sendall(full[:full.index(b"\r\n\r\n") + 4 + len(answer) // 2])
    time.sleep(0.05)  # let the half arrive before the RST
    b._reset(conn)
    return False


def _http10_close(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    if b.variant == "http11":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + answer)
    else:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + answer)
    conn.shutdown(socket.SHUT_WR)
    return False


def _bad_encoding(b: BadBackend, conn, reader, request, answer: bytes) -> bool:
    conn.sendall(_response(answer, extra=b"Content-Encoding: %s\r\n" % (b.variant or "br").encode()))
    return True


BEHAVIOURS: dict[str, Callable[..., bool]] = {
    "echo": _echo,
    "interim": _interim,
    "extra_after": _extra_after,
    "cl_too_long": _cl_too_long,
    "cl_lie_huge": _cl_lie_huge,
    "conflicting": _conflicting,
    "endless_chunked": _endless_chunked,
    "huge_head": _huge_head,
    "slow": _slow,
    "silent": _silent,
    "reset_before": _reset_before,
    "reset_mid": _reset_mid,
    "http10_close": _http10_close,
    "bad_encoding": _bad_encoding,
}


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.support.badbackend")
    parser.add_argument("behaviour")
    parser.add_argument("--model", default="bad")
    args = parser.parse_args(argv)
    backend = BadBackend(args.behaviour, args.model)
    print(backend.address, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1:])
