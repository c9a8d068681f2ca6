"""The retry budget of a backend (Envoy's ``retry_budget``). Pure state, no I/O.

A retry is allowed while the retries in progress stay within ``percent`` of the
backend's requests in flight (at least ``min_concurrency``), so when a backend is dying
the retries cannot multiply its load: with 20 %, a backend at 100 requests in flight
carries at most 20 retries at once and the rest fail fast.
"""
from __future__ import annotations

__all__ = ["RetryBudget"]


class RetryBudget:
    __slots__ = ("active", "min_concurrency", "percent", "retrying")

    def __init__(self, percent: float = 20.0, min_concurrency: int = 3) -> None:
        self.percent = percent
        self.min_concurrency = min_concurrency
        self.active = 0  # requests in flight on the backend
        self.retrying = 0  # of which are on a retry now

    def allows(self) -> bool:
        return self.retrying < max(self.min_concurrency, self.active * self.percent / 100.0)
