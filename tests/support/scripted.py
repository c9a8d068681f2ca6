"""A scripted HTTP/1.1 backend for tests: a real listening socket, one thread per
connection, keep-alive. Each request is parsed (request line, lower-cased headers, body
by Content-Length) and handed to ``on_post`` for POSTs, which returns the answer body
(sent as ``200 application/json``; a ``(status, body)`` pair for another status; None resets
the connection instead); GETs — health and
readiness probes — get an empty ``200`` at once, and the repository index a ``404`` (a
backend without Triton's repository extension, as OVMS: the gateway's health checker then
asks per model)."""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

__all__ = ["EMPTY_INFER_ANSWER", "ScriptedHttp"]

EMPTY_INFER_ANSWER = b'{"model_name":"m","outputs":[]}'


class ScriptedHttp:
    def __init__(self, on_post: Callable[[str, dict[str, str], bytes], bytes | tuple[int, bytes] | None]) -> None:
        self._on_post = on_post
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(fields.get("content-length", "0"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                if lines[0].startswith("POST /v2/repository/index"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                elif lines[0].startswith("POST"):
                    answer = self._on_post(lines[0], fields, body)
                    if answer is None:  # reset the connection (RST) without a byte of answer
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    status, answer = answer if isinstance(answer, tuple) else (200, answer)
                    conn.sendall(b"HTTP/1.1 %d Answer\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % (status, len(answer)) + answer)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
