"""A bounded load generator for tests: add_sub inference requests over HTTP and gRPC, every answer checked.

``Load`` runs in a thread of its own with its own asyncio event loop, so the test's thread stays free
to kill and restart servers, wait for conditions and read the running summary meanwhile::

    with Load(http_url=gw.http_url, grpc_url=gw.grpc_url, models=["add_sub"], max_seconds=60) as load:
        load.wait_requests(100, timeout=30)
        triton.kill()
        ...
    print(load.report())

Each worker sends one request at a time (a closed loop): ``http_concurrency`` workers POST
``/v2/models/{m}/infer`` with JSON (aiohttp), ``grpc_concurrency`` workers call ``ModelInfer`` with
``raw_input_contents`` (grpc.aio and the generated stubs in gateway/_pb). The inputs are INPUT0 and
INPUT1, FP32 [size], different for every request; an answer whose OUTPUT0 is not INPUT0 + INPUT1 is a
failure (outcome ``WRONG_ANSWER``). Every request ends as one ``Record``; its outcome is ``"ok"``, the
HTTP status (``"404"``), the gRPC code name (``"NOT_FOUND"``), ``"TIMEOUT"`` (over ``timeout_s``), or
the class name of a client-side error (``"ClientConnectorError"``, ``"ServerDisconnectedError"``).

Bounds: no request outlives ``timeout_s``; the load stops after ``max_requests`` requests, after
``max_seconds`` or on ``stop()``, whichever comes first; ``stop()`` joins with a bound.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import orjson

__all__ = ["OK", "FailureGroup", "Load", "Record", "Summary"]

OK = "ok"
TIMEOUT = "TIMEOUT"
WRONG_ANSWER = "WRONG_ANSWER"
CANCELLED = "CANCELLED"
_FP32 = np.dtype("<f4")  # the V2 wire order for FP32 raw contents
_MESSAGE_KEY = 80


@dataclass(frozen=True, slots=True)
class Record:
    """One request: ``start`` is ``time.monotonic()`` when it was sent, ``latency`` in seconds."""

    transport: str  # "http" | "grpc"
    model: str
    start: float
    latency: float
    outcome: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == OK


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Failures alike in transport, outcome and the first 80 characters of their message."""

    transport: str
    outcome: str
    message: str
    count: int
    max_latency: float
    first: float  # seconds after the load started, of the first and the last request in the group
    last: float


@dataclass(frozen=True, slots=True)
class Summary:
    sent: int  # requests started (those still in flight have no record yet)
    completed: int
    succeeded: int
    failed: int
    slow: int  # completed requests that took longer than slow_s, failed or not
    slow_s: float
    max_ok_latency: float
    max_failed_latency: float
    failures: tuple[FailureGroup, ...]  # most frequent first
    per_model: dict[str, dict[str, int]]  # model -> {"ok": n, "failed": n}
    per_transport: dict[str, dict[str, int]]  # "http"/"grpc" -> {"ok": n, "failed": n}

    def report(self) -> str:
        lines = [
            f"load: sent={self.sent} completed={self.completed} ok={self.succeeded} failed={self.failed} "
            f"slow(>{self.slow_s:g}s)={self.slow} max latency ok={self.max_ok_latency:.3f}s "
            f"failed={self.max_failed_latency:.3f}s",
            "  by transport: " + _counts(self.per_transport),
            "  by model: " + _counts(self.per_model),
        ]
        if self.failures:
            lines.append("  failures:")
        for g in self.failures:
            lines.append(
                f"    {g.count:>6} x {g.transport} {g.outcome} max {g.max_latency:.3f}s "
                f"t={g.first:.2f}..{g.last:.2f}s {g.message!r}"
            )
        return "\n".join(lines)


def _counts(table: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{k} ok={v['ok']} failed={v['failed']}" for k, v in sorted(table.items())) or "-"


def _summarize(records: Sequence[Record], *, sent: int, started: float, slow_s: float) -> Summary:
    groups: dict[tuple[str, str, str], list[Record]] = {}
    per_model: dict[str, dict[str, int]] = {}
    per_transport: dict[str, dict[str, int]] = {}
    max_ok = max_failed = 0.0
    slow = 0
    for r in records:
        key = "ok" if r.ok else "failed"
        per_model.setdefault(r.model, {"ok": 0, "failed": 0})[key] += 1
        per_transport.setdefault(r.transport, {"ok": 0, "failed": 0})[key] += 1
        slow += r.latency > slow_s
        if r.ok:
            max_ok = max(max_ok, r.latency)
        else:
            max_failed = max(max_failed, r.latency)
            groups.setdefault((r.transport, r.outcome, r.message[:_MESSAGE_KEY]), []).append(r)
    failures = tuple(
        sorted(
            (
                FailureGroup(
                    transport,
                    outcome,
                    message,
                    len(rs),
                    max(r.latency for r in rs),
                    min(r.start for r in rs) - started,
                    max(r.start for r in rs) - started,
                )
                for (transport, outcome, message), rs in groups.items()
            ),
            key=lambda g: (-g.count, g.transport, g.outcome),
        )
    )
    failed = sum(g.count for g in failures)
    return Summary(
        sent=sent,
        completed=len(records),
        succeeded=len(records) - failed,
        failed=failed,
        slow=slow,
        slow_s=slow_s,
        max_ok_latency=max_ok,
        max_failed_latency=max_failed,
        failures=failures,
        per_model=per_model,
        per_transport=per_transport,
    )


def _inputs(seq: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """INPUT0/INPUT1 that differ from request to request; small integers, so exact in FP32."""
    a = np.arange(size, dtype=_FP32) + np.float32(seq % 4096)
    b = np.full(size, seq % 13, dtype=_FP32)
    return a, b


def _address(url: str, scheme: str) -> str:
    return url if "://" in url else f"{scheme}://{url}"


class Load:
    """Closed-loop HTTP and gRPC inference load in a background thread; see the module docstring."""

    def __init__(
        self,
        *,
        models: Sequence[str],
        http_url: str | None = None,
        grpc_url: str | None = None,
        http_concurrency: int = 4,
        grpc_concurrency: int = 4,
        max_requests: int | None = None,
        max_seconds: float | None = 60.0,
        timeout_s: float = 10.0,
        size: int = 16,
        slow_s: float = 1.0,
        pause_s: float = 0.0,
    ) -> None:
        self._http_workers = http_concurrency if http_url else 0
        self._grpc_workers = grpc_concurrency if grpc_url else 0
        if self._http_workers + self._grpc_workers <= 0:
            raise ValueError("Load needs http_url or grpc_url with a concurrency above 0")
        if max_requests is None and max_seconds is None:
            raise ValueError("Load needs a bound: max_requests or max_seconds")
        if timeout_s <= 0 or size <= 0 or pause_s < 0:
            raise ValueError("timeout_s and size must be > 0, pause_s >= 0")
        self.http_url = _address(http_url, "http") if http_url else None
        self.grpc_target = grpc_url.split("://", 1)[-1] if grpc_url else None
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.timeout_s = timeout_s
        self.size = size
        self.slow_s = slow_s
        self.pause_s = pause_s
        self._models: tuple[str, ...] = ()
        self.set_models(models)

        self._cond = threading.Condition()
        self._records: list[Record] = []
        self._ok = 0
        self._sent = 0
        self._turn = itertools.count()  # model round robin and request inputs
        self._stopping = threading.Event()
        self._finished = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.started = 0.0
        self._deadline = float("inf")

    # ------------------------------------------------------------------------------------ control

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def set_models(self, models: Sequence[str]) -> None:
        """Change the models requested, round robin, from the next request on."""
        if isinstance(models, str) or not models:
            raise ValueError(f"models must be a non-empty list of names, got {models!r}")
        self._models = tuple(models)

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("Load already started")
        self.started = time.monotonic()
        if self.max_seconds is not None:
            self._deadline = self.started + self.max_seconds
        self._thread = threading.Thread(target=self._run, name="test-load", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> Summary:
        """Send no more requests; wait for those in flight (at most ``timeout``, default timeout_s + 5 s).

        Requests still in flight then are cancelled (outcome ``CANCELLED``). Raises if the load's own
        thread failed (not a request: those are records) or does not end.
        """
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.timeout_s + 5.0 if timeout is None else timeout)
            if thread.is_alive() and self._loop is not None:
                self._loop.call_soon_threadsafe(self._cancel_all)
                thread.join(5.0)
            if thread.is_alive():
                raise RuntimeError(f"load thread did not end\n{self.report()}")
        if self._error is not None:
            raise RuntimeError(f"load thread failed: {self._error!r}") from self._error
        return self.summary()

    def _cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def sent(self) -> int:
        return self._sent

    def wait_requests(self, n: int, timeout: float, *, ok_only: bool = False) -> int:
        """Block until ``n`` more requests (only successes with ``ok_only``) completed; return how many
        have completed. Raises TimeoutError after ``timeout`` s, or at once when the load has ended."""

        def count() -> int:
            return self._ok if ok_only else len(self._records)

        with self._cond:
            target = count() + n
            reached = self._cond.wait_for(lambda: count() >= target or self._finished, timeout)
            done = count()
            reached = reached and done >= target
        if not reached:
            what = "successful requests" if ok_only else "requests"
            ended = " (the load has ended)" if self._finished else ""
            raise TimeoutError(f"{done}/{target} {what} after {timeout}s{ended}\n{self.report()}")
        return len(self._records)

    def wait_done(self, timeout: float) -> Summary:
        """Wait (bounded) for the load to end by itself (max_requests or max_seconds reached)."""
        if self._thread is None:
            raise RuntimeError("Load not started")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"load still running after {timeout}s\n{self.report()}")
        return self.stop()

    def records(self, since: float | None = None) -> list[Record]:
        """Completed requests (those sent at or after ``since``, a ``time.monotonic()`` value)."""
        with self._cond:
            records = list(self._records)
        return records if since is None else [r for r in records if r.start >= since]

    def summary(self, since: float | None = None) -> Summary:
        records = self.records(since)
        sent = self._sent if since is None else len(records)
        return _summarize(records, sent=sent, started=self.started, slow_s=self.slow_s)

    def report(self, since: float | None = None) -> str:
        return self.summary(since).report()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise

    # ------------------------------------------------------------------------- the load's thread

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _claim(self) -> int | None:
        """A sequence number for the next request, or None when the load must end."""
        if self._stopping.is_set() or time.monotonic() >= self._deadline:
            return None
        with self._cond:
            if self.max_requests is not None and self._sent >= self.max_requests:
                return None
            self._sent += 1
        return next(self._turn)

    def _record(self, record: Record) -> None:
        with self._cond:
            self._records.append(record)
            self._ok += record.ok
            self._cond.notify_all()

    async def _main(self) -> None:
        import aiohttp
        import grpc  # type: ignore[import-untyped]

        from gateway._pb import grpc_predict_v2_pb2_grpc as pb_grpc

        session = channel = None
        try:
            senders: list[tuple[str, Callable[[str, np.ndarray, np.ndarray], Awaitable[tuple[str, str]]]]] = []
            if self._http_workers:
                session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self._http_workers),
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                )
                senders += [("http", self._http_sender(session))] * self._http_workers
            if self._grpc_workers:
                assert self.grpc_target is not None
                channel = grpc.aio.insecure_channel(self.grpc_target)
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                senders += [("grpc", self._grpc_sender(stub))] * self._grpc_workers
            self._tasks = [asyncio.ensure_future(self._worker(t, send)) for t, send in senders]
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if session is not None:
                await session.close()
            if channel is not None:
                await channel.close()

    async def _worker(
        self, transport: str, send: Callable[[str, np.ndarray, np.ndarray], Awaitable[tuple[str, str]]]
    ) -> None:
        while (seq := self._claim()) is not None:
            began = time.monotonic()  # before reading the models: records since a set_models() use the new ones
            models = self._models
            model = models[seq % len(models)]
            a, b = _inputs(seq, self.size)
            try:
                # The clients have their own timeout; this one bounds whatever they miss.
                outcome, message = await asyncio.wait_for(send(model, a, b), self.timeout_s + 1.0)
            except TimeoutError as exc:
                outcome, message = TIMEOUT, str(exc) or f"no answer within {self.timeout_s}s"
            except asyncio.CancelledError:
                self._record(Record(transport, model, began, time.monotonic() - began, CANCELLED, "stop()"))
                raise
            except Exception as exc:
                outcome, message = type(exc).__name__, str(exc)
            self._record(Record(transport, model, began, time.monotonic() - began, outcome, message))
            if self.pause_s:
                await asyncio.sleep(self.pause_s)  # pacing between requests, not synchronization

    def _http_sender(self, session):  # type: ignore[no-untyped-def]
        base = self.http_url

        async def send(model: str, a: np.ndarray, b: np.ndarray) -> tuple[str, str]:
            body = orjson.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "shape": [a.size], "datatype": "FP32", "data": a},
                        {"name": "INPUT1", "shape": [b.size], "datatype": "FP32", "data": b},
                    ]
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            async with session.post(
                f"{base}/v2/models/{model}/infer", data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                raw = await resp.read()
                status = resp.status
            if status != 200:
                return str(status), _error_text(raw)
            return _check(_http_output0(raw), a + b)

        return send

    def _grpc_sender(self, stub):  # type: ignore[no-untyped-def]
        import grpc

        from gateway._pb import grpc_predict_v2_pb2 as pb

        tensor = pb.ModelInferRequest.InferInputTensor

        async def send(model: str, a: np.ndarray, b: np.ndarray) -> tuple[str, str]:
            request = pb.ModelInferRequest(
                model_name=model,
                inputs=[
                    tensor(name="INPUT0", datatype="FP32", shape=[a.size]),
                    tensor(name="INPUT1", datatype="FP32", shape=[b.size]),
                ],
                raw_input_contents=[a.tobytes(), b.tobytes()],
            )
            try:
                response = await stub.ModelInfer(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                outcome = TIMEOUT if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
                return outcome, exc.details() or ""
            return _check(_grpc_output0(response), a + b)

        return send


def _error_text(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace")
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return raw[:200].decode(errors="replace")


def _http_output0(raw: bytes) -> np.ndarray | str:
    try:
        for out in orjson.loads(raw)["outputs"]:
            if out["name"] == "OUTPUT0":
                return np.asarray(out["data"], dtype=_FP32).reshape(out["shape"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return f"malformed answer ({exc!r}): {raw[:120]!r}"
    return f"no OUTPUT0 in {raw[:120]!r}"


def _grpc_output0(response) -> np.ndarray | str:  # type: ignore[no-untyped-def]
    for i, out in enumerate(response.outputs):
        if out.name != "OUTPUT0":
            continue
        if len(response.raw_output_contents) > i:
            data = np.frombuffer(response.raw_output_contents[i], dtype=_FP32)
        else:
            data = np.asarray(out.contents.fp32_contents, dtype=_FP32)
        try:
            return data.reshape(list(out.shape))
        except ValueError as exc:
            return f"OUTPUT0 shape {list(out.shape)} does not fit {data.size} values: {exc}"
    return f"no OUTPUT0 among {[o.name for o in response.outputs]}"


def _check(got: np.ndarray | str, want: np.ndarray) -> tuple[str, str]:
    if isinstance(got, str):
        return WRONG_ANSWER, got
    # Constant messages: the summary groups failures by their message.
    if got.shape != want.shape:
        return WRONG_ANSWER, f"OUTPUT0 shape {list(got.shape)} != INPUT0 shape {list(want.shape)}"
    if not np.array_equal(got, want):
        return WRONG_ANSWER, "OUTPUT0 != INPUT0 + INPUT1"
    return OK, ""
