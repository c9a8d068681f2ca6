"""A V2 HTTP backend whose health answers can be made slow or failing on command, while
its inference keeps answering at once: a KServe predictor that is busy (its health
answers wait on its event loop) but serving.

asyncio on a thread of its own (so a test may block on a gateway process), HTTP/1.1
keep-alive, bound to port 0. What it answers:

- ``GET /v2/health/live``, ``GET /v2/health/ready`` — kinds ``live``, ``ready``;
- ``POST /v2/repository/index`` — kind ``index``: every model of ``models`` READY;
- ``GET /v2/models/<m>[/versions/<v>]/ready`` — kind ``model_ready``;
- ``POST /v2/models/<m>/infer`` — always at once: one INT32 output echoing the model name
  in ``id``; counted in ``inferences``.

Each kind answers after ``delay[kind]`` seconds with ``status[kind]`` (200 unless set); a
call whose client went away meanwhile is counted in ``abandoned``. ``received[kind]`` and
``answered[kind]`` count calls (``answered`` only those whose answer was written) — tests
wait on them (bounded), never on sleeps.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading

__all__ = ["SlowHealthBackend"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


class SlowHealthBackend:
    def __init__(self, models: tuple[str, ...] = ("m",)) -> None:
        self.models = models
        self.delay: dict[str, float] = {}
        self.status: dict[str, int] = {}
        self.received: collections.Counter[str] = collections.Counter()
        self.answered: collections.Counter[str] = collections.Counter()
        self.failed_answers = 0  # health answers written with a status other than 200
        self.abandoned: collections.Counter[str] = collections.Counter()
        self.inferences = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("slow-health backend did not start")
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"

    # -- control (from the test's thread) -------------------------------------------------
    def set(self, kind: str, *, delay: float = 0.0, status: int = 200) -> None:
        with self._lock:
            self.delay[kind] = delay
            self.status[kind] = status

    def count(self, kind: str, what: str = "answered") -> int:
        with self._lock:
            return getattr(self, what)[kind]

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> SlowHealthBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the server ------------------------------------------------------------------------
    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        started.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(fields.get("content-length", "0")))
                status, answer, kind = self._route(method, path, body)
                if kind:
                    with self._lock:
                        self.received[kind] += 1
                        delay = self.delay.get(kind, 0.0)
                        status = self.status.get(kind, 200) if status == 200 else status
                    if delay:
                        await asyncio.sleep(delay)
                    if reader.at_eof():  # the client gave up waiting (its timeout): nobody reads this
                        with self._lock:
                            self.abandoned[kind] += 1
                        return
                if status != 200:
                    answer = json.dumps({"error": f"{kind or path}: status {status} on command"}).encode()
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, _REASONS.get(status, "Status").encode(), len(answer)) + answer)
                await writer.drain()
                if kind:
                    with self._lock:
                        self.answered[kind] += 1
                        self.failed_answers += status != 200
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str]:
        """(status, body, health kind or "" for inference and the rest)."""
        if method == "GET" and path == "/v2/health/live":
            return 200, b"", "live"
        if method == "GET" and path == "/v2/health/ready":
            return 200, b"", "ready"
        if method == "POST" and path == "/v2/repository/index":
            index = [{"name": m, "version": "1", "state": "READY", "reason": ""} for m in self.models]
            return 200, json.dumps(index).encode(), "index"
        parts = path.split("/")
        if len(parts) >= 4 and parts[1:3] == ["v2", "models"]:
            model = parts[3]
            known = model in self.models
            if method == "GET" and parts[-1] == "ready":
                return (200 if known else 404), b"", "model_ready"
            if method == "POST" and parts[-1] == "infer":
                if not known:
                    return 404, json.dumps({"error": f"Request for unknown model: '{model}'"}).encode(), ""
                with self._lock:
                    self.inferences += 1
                answer = {"model_name": model, "id": model,
                          "outputs": [{"name": "y", "datatype": "INT32", "shape": [1], "data": [1]}]}
                return 200, json.dumps(answer).encode(), ""
        return 404, json.dumps({"error": "Not Found"}).encode(), ""
