"""A fleet of fake V2 (Triton-like) endpoints for control-plane tests: N loopback ports served by
one object, on one asyncio loop in a thread of its own (so a test may block on a gateway process,
or await the gateway's own loop, while the fleet answers).

Every port binds port 0 (read back into ``ports`` / ``addresses``) and speaks HTTP/1.1 keep-alive:

- ``GET /v2/health/live``, ``GET /v2/health/ready`` — 200;
- ``GET /v2`` — Triton's server metadata (``name: triton``);
- ``POST /v2/repository/index`` — that port's entries as Triton lists them
  (``[{"name", "version", "state": "READY" | "UNAVAILABLE", "reason"}]``), or the HTTP status it
  was told to refuse with (:meth:`refuse_index`);
- ``GET /v2/models/<m>[/versions/<v>]/ready`` — 200 when that port's entries have ``m`` READY
  (in ``v``, if given), else 400 (what Triton answers) — the entries count even while the index
  itself is refused, as a restricted repository API still serves its models;
- ``GET /metrics`` — that port's Triton-style page (:meth:`set_metrics`), or a status.

Per port, programmable from the test's thread: entries (:meth:`set_index`, serialized once per
call, so ports given the same call answer byte-identical indexes), an index refusal, a delay per
kind (:meth:`delay`), the metrics page, and the port itself (:meth:`close_port`: listener and open
connections gone, connections refused = the endpoint died; :meth:`open_port`: the same port
again). Requests are counted per port and kind (``live``, ``ready``, ``meta``, ``index``,
``model_ready``, ``metrics``, ``other``); the models asked ready are recorded per port; the most
``/metrics`` requests in progress at once over the whole fleet is kept (``metrics_peak``).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["FakeFleet", "index_entries", "metrics_page"]

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error",
            503: b"Service Unavailable"}
_META = json.dumps({"name": "triton", "version": "2.51.0", "extensions": ["model_repository"]}).encode()


def index_entries(models: Iterable[str], unavailable: Iterable[str] = (), version: str = "1") -> list[dict[str, str]]:
    """Triton's index entries: every model READY in ``version``, those in ``unavailable`` not."""
    out = set(unavailable)
    return [{"name": m, "version": version, "state": "UNAVAILABLE" if m in out else "READY",
             "reason": "unloaded" if m in out else ""} for m in models]


def metrics_page(pending: dict[tuple[str, str], float]) -> bytes:
    """A Triton metrics page with ``nv_inference_pending_request_count`` per (model, version),
    among a few lines of other families (which the reader must skip)."""
    lines = ["# HELP nv_inference_count Number of inferences performed", "# TYPE nv_inference_count counter"]
    lines += [f'nv_inference_count{{model="{m}",version="{v}"}} 7' for m, v in pending]
    lines += ["# HELP nv_inference_pending_request_count Instantaneous number of pending requests",
              "# TYPE nv_inference_pending_request_count gauge"]
    lines += [f'nv_inference_pending_request_count{{model="{m}",version="{v}"}} {n:g}'
              for (m, v), n in pending.items()]
    lines += ["# TYPE nv_cpu_utilization gauge", "nv_cpu_utilization 0.01"]
    return ("\n".join(lines) + "\n").encode()


def _answer(status: int, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
            % (status, _REASONS.get(status, b"Status"), ctype, len(body)) + body)


class _Port:
    __slots__ = ("conns", "delay", "index", "metrics", "number", "ready", "ready_names", "refuse", "server")

    def __init__(self) -> None:
        self.number = 0
        self.server: asyncio.Server | None = None
        self.conns: set[asyncio.StreamWriter] = set()
        self.index = b"[]"  # the index answer's body
        self.refuse: int | None = None  # the status the index is refused with, or None
        self.ready: frozenset[tuple[str, str]] = frozenset()  # (model, version) READY in the entries
        self.ready_names: frozenset[str] = frozenset()
        self.metrics: bytes | int = metrics_page({})  # the page, or a status
        self.delay: dict[str, float] = {}


class FakeFleet:
    def __init__(self, n: int, entries: Sequence[dict[str, Any]] = ()) -> None:
        self._lock = threading.Lock()
        self._p = [_Port() for _ in range(n)]
        self.counts: list[collections.Counter[str]] = [collections.Counter() for _ in range(n)]
        self.asked: list[list[str]] = [[] for _ in range(n)]  # models asked ready, in order
        self.metrics_now = 0
        self.metrics_peak = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="fakefleet")
        self._thread.start()
        try:
            for i in range(n):
                self._call(self._listen(i, 0))
        except BaseException:
            self.close()
            raise
        self.ports = [p.number for p in self._p]
        self.addresses = [f"127.0.0.1:{port}" for port in self.ports]
        self.set_index(entries)

    # -- control (from the test's thread) -------------------------------------------------
    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _which(self, ports: Iterable[int] | None) -> list[_Port]:
        return list(self._p) if ports is None else [self._p[i] for i in ports]

    def set_index(self, entries: Sequence[dict[str, Any]], ports: Iterable[int] | None = None) -> bytes:
        """What the index answers on ``ports`` (all by default), and which models are ready
        there; the refusal of those ports ends. The body is serialized once: the ports given
        answer the very same bytes."""
        body = json.dumps(list(entries)).encode()
        ready = frozenset((e["name"], str(e.get("version", ""))) for e in entries if e.get("state") == "READY")
        names = frozenset(m for m, _ in ready)
        with self._lock:
            for p in self._which(ports):
                p.index, p.ready, p.ready_names, p.refuse = body, ready, names, None
        return body

    def refuse_index(self, status: int | None, ports: Iterable[int] | None = None) -> None:
        """The index answered with ``status`` and an error body (None: answered again). The
        entries stay: per-model ready calls still answer from them."""
        with self._lock:
            for p in self._which(ports):
                p.refuse = status

    def set_metrics(self, page: bytes | int, ports: Iterable[int] | None = None) -> None:
        """``/metrics``: a page (bytes), or a status (int) answered with an empty body."""
        with self._lock:
            for p in self._which(ports):
                p.metrics = page

    def delay(self, kind: str, seconds: float, ports: Iterable[int] | None = None) -> None:
        """Answers of ``kind`` (``live``, ``index``, ``model_ready``, ``metrics``, ...) wait this long."""
        with self._lock:
            for p in self._which(ports):
                p.delay[kind] = seconds

    def close_port(self, i: int) -> None:
        """The endpoint dies: its listener closes (connections refused) and so do its open
        connections (reset)."""
        self._call(self._close(i))

    def open_port(self, i: int) -> None:
        """The endpoint is back, on the same port."""
        self._call(self._listen(i, self._p[i].number))

    def count(self, i: int, kind: str) -> int:
        with self._lock:
            return self.counts[i][kind]

    def total(self, kind: str) -> int:
        with self._lock:
            return sum(c[kind] for c in self.counts)

    def asked_of(self, i: int) -> list[str]:
        with self._lock:
            return list(self.asked[i])

    def close(self) -> None:
        async def stop() -> None:
            for i in range(len(self._p)):
                await self._close(i)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._call(stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the servers (on the fleet's loop) --------------------------------------------------
    async def _listen(self, i: int, port: int) -> None:
        p = self._p[i]
        if p.server is not None:
            return
        p.server = await asyncio.start_server(lambda r, w: self._serve(i, r, w), "127.0.0.1", port,
                                              reuse_address=True, backlog=512)
        p.number = p.server.sockets[0].getsockname()[1]

    async def _close(self, i: int) -> None:
        p = self._p[i]
        if p.server is not None:
            p.server.close()
            p.server = None
        for writer in list(p.conns):
            writer.transport.abort()
        p.conns.clear()

    async def _serve(self, i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        p = self._p[i]
        p.conns.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                await reader.readexactly(int(fields.get("content-length", "0")))
                kind, answer = self._route(p, i, method, path)
                delay = p.delay.get(kind, 0.0)
                metrics = kind == "metrics"
                if metrics:
                    with self._lock:
                        self.metrics_now += 1
                        self.metrics_peak = max(self.metrics_peak, self.metrics_now)
                try:
                    if delay:
                        await asyncio.sleep(delay)
                    writer.write(answer)
                    await writer.drain()
                finally:
                    if metrics:
                        with self._lock:
                            self.metrics_now -= 1
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            p.conns.discard(writer)
            writer.close()

    def _route(self, p: _Port, i: int, method: str, path: str) -> tuple[str, bytes]:
        """(kind, the whole answer), counted."""
        with self._lock:
            kind, answer = self._answer(p, i, method, path)
            self.counts[i][kind] += 1
        return kind, answer

    def _answer(self, p: _Port, i: int, method: str, path: str) -> tuple[str, bytes]:
        if method == "GET" and path == "/v2/health/live":
            return "live", _answer(200, b"")
        if method == "GET" and path == "/v2/health/ready":
            return "ready", _answer(200, b"")
        if method == "GET" and path == "/v2":
            return "meta", _answer(200, _META)
        if method == "POST" and path == "/v2/repository/index":
            if p.refuse is not None:
                return "index", _answer(p.refuse, b'{"error":"the repository API is restricted"}')
            return "index", _answer(200, p.index)
        if method == "GET" and path == "/metrics":
            page = p.metrics
            if isinstance(page, int):
                return "metrics", _answer(page, b"", b"text/plain")
            return "metrics", _answer(200, page, b"text/plain; version=0.0.4")
        parts = path.split("/")
        if method == "GET" and len(parts) >= 5 and parts[1:3] == ["v2", "models"] and parts[-1] == "ready":
            model = parts[3]
            version = parts[5] if len(parts) == 7 and parts[4] == "versions" else ""
            self.asked[i].append(model)
            ok = (model, version) in p.ready if version else model in p.ready_names
            if ok:
                return "model_ready", _answer(200, b"")
            return "model_ready", _answer(400, b'{"error":"Request for unknown model: \'%s\' is not found"}'
                                          % model.encode())
        return "other", _answer(404, b'{"error":"Not Found"}')
