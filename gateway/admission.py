"""Admission control: bytes of inference requests in flight in this process, held against
``max_inflight_bytes``, each request counted as what its path holds in memory per byte of its
body (``COST_*``: a backend says which applies to it, ``Backend.http_cost`` / ``grpc_cost`` /
``generate_cost``).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from .budget import ByteBudget
from .errors import Overloaded

__all__ = ["COST_CONVERT", "COST_CONVERT_BINARY", "COST_PASS_GRPC", "COST_PASS_HTTP", "Admission", "StreamHeld"]


class Admission:
    """Bytes of inference request bodies in flight in this process, held against
    ``max_inflight_bytes`` (0: unbounded, only counted). Over the limit a request is
    refused at once (503 / UNAVAILABLE: retry later), before its body is read or sent."""

    __slots__ = ("auto", "budget", "gauge", "large_at", "large_inflight")

    # A request this large marks "large-tensor activity" (when it enters and leaves): the
    # allocator's freed pages go back to the system once it has been quiet (``idle_trim``).
    LARGE: Final = 1 << 20

    def __init__(self, limit: int | None, gauge: Any, auto: int = 0,
                 track: Callable[[Any, Callable[[], float]], bool] | None = None) -> None:
        self.auto = auto  # the limit when the config leaves it unset (memlimit.py)
        budget = self.budget = ByteBudget(self.auto if limit is None else limit)
        # The gauge reads the budget when scraped (Metrics.track), else it is set as it changes.
        self.gauge = None if track is not None and track(gauge, lambda: budget.used) else gauge
        self.large_at = 0.0  # time.monotonic() of the last large request entering or leaving
        self.large_inflight = 0  # large requests in flight: no idle trim while any is (it would re-fault)

    def configure(self, limit: int | None) -> None:
        self.budget.limit = self.auto if limit is None else limit

    def enter(self, n: int) -> None:
        # One request is always admitted when none is in flight: a limit below the message
        # size (a small pod) bounds concurrency, it does not refuse a request forever.
        budget = self.budget
        if not budget.take(n):
            if budget.used:
                raise Overloaded(f"gateway overloaded: {budget.used} bytes of requests in flight, {n} more "
                                 f"would pass max_inflight_bytes ({budget.limit}); retry later")
            budget.used += n  # alone: admitted though larger than the limit
        if n >= self.LARGE:
            self.large_at = time.monotonic()
            self.large_inflight += 1
        if self.gauge is not None:
            self.gauge.set(self.budget.used)

    def leave(self, n: int) -> None:
        self.budget.give(n)
        if n >= self.LARGE:
            self.large_at = time.monotonic()
            self.large_inflight -= 1
        if self.gauge is not None:
            self.gauge.set(self.budget.used)


# What a request is expected to hold in this process while in flight, per byte of its body:
# admission control counts a request as its body's size times this (``max_inflight_bytes`` is
# a memory budget). Measured here as peak RSS over idle per request, 8 concurrent 16 MB
# requests to real Triton: HTTP binary → gRPC backend 6.8 ×, gRPC → HTTP backend 2.4 ×,
# HTTP JSON → gRPC backend 2.3 × (of the JSON text), gRPC → gRPC 1.4 × (grpcio's own copies),
# HTTP → HTTP 0.2–1.2 × (binary bodies stream; JSON bodies are read whole). Without the factors
# a 640 MiB cgroup with the default share (a fifth) was OOM-killed by 24 clients of 16 MB
# through the binary → gRPC conversion (tests/integration/test_memory_cgroup.py).
COST_PASS_HTTP = 1
COST_PASS_GRPC = 2
COST_CONVERT = 3  # JSON → gRPC, gRPC → HTTP, ModelStreamInfer to an HTTP backend, generate → gRPC
COST_CONVERT_BINARY = 7  # HTTP binary extension → gRPC: the body, its tensors and the message


class StreamHeld:
    """The request messages of one ModelStreamInfer held against admission control: each from
    when it is read until grpc asks for the next (it has been handed to the backend's stream),
    so a stream of large tensors counts as the unary calls do — and marks large-tensor activity
    for the idle trim (each large request, and the end of a stream that carried one). One
    message is held at a time (the next is read once the last was handed on). ``close()``
    gives back one that a stream ended while holding; a message handed on after that is not
    given back twice."""

    __slots__ = ("admission", "cost", "held", "large", "open")

    def __init__(self, admission: Admission, cost: int = 1) -> None:
        self.admission = admission
        self.cost = cost  # per byte of a request (COST_*)
        self.held = 0  # the message held now, in admission's units (0: none)
        self.large = False
        self.open = True

    def take(self, n: int) -> None:
        assert self.held == 0, "one message at a time"
        n *= self.cost
        self.admission.enter(n)  # raises Overloaded past max_inflight_bytes
        self.held = n
        self.large = self.large or n >= Admission.LARGE

    def give(self) -> None:
        if self.open and self.held:
            self.admission.leave(self.held)
            self.held = 0

    def close(self) -> None:
        if self.open:
            self.give()
            self.open = False
            if self.large:
                # Answers to large requests flow until the stream's end, after its last request
                # was handed on: the idle trim counts its quiet from here.
                self.admission.large_at = time.monotonic()
