"""The access log: one JSON object per finished request, on logger
``oip_gateway.access`` (stderr), off by default and optionally sampled.

A request's record is filled as it goes: the front end opens it (request id, bytes
in), the backend that answers notes the endpoint and the protocol it spoke
(:func:`note_endpoint`, through a context variable — each request runs in a task
of its own, so nothing is shared), and :meth:`Metrics.observe` writes it with the
status and duration. When the log is off nothing is allocated per request.

Fields: ``time`` (ISO 8601, UTC), ``request_id`` (the client's ``x-request-id``),
``protocol`` / ``protocol_out`` (client side / backend side), ``api``, ``model``,
``version``, ``route``, ``backend`` (and ``pool``, a deprecated alias with the same value,
docs/metrics.md), ``endpoint``, ``status`` (HTTP status or gRPC code),
``duration_ms``, ``bytes_in``, ``bytes_out``, and ``reason``: a short text for a
failure the gateway itself decided (not ready, timeout, bad request…), absent when the
backend answered.
"""
from __future__ import annotations

import datetime
import logging
import random
from contextvars import ContextVar
from dataclasses import dataclass

import orjson

__all__ = ["AccessLog", "AccessRecord", "attach", "current", "note_endpoint"]


@dataclass(slots=True)
class AccessRecord:
    request_id: str = ""
    bytes_in: int = 0
    bytes_out: int = 0
    endpoint: str = ""
    protocol_out: str = ""
    reason: str = ""


_CURRENT: ContextVar[AccessRecord | None] = ContextVar("oip_gateway_access", default=None)


def current() -> AccessRecord | None:
    return _CURRENT.get()


def attach(record: AccessRecord) -> None:
    """``record`` (opened by hand, :meth:`AccessLog.open`) is the current task's from now on:
    :func:`note_endpoint` fills it."""
    _CURRENT.set(record)


def note_endpoint(endpoint: object, protocol: str) -> None:
    """The backend's attempt on ``endpoint`` (the last one tried is what the log shows)."""
    record = _CURRENT.get()
    if record is not None:
        record.endpoint = str(endpoint)
        record.protocol_out = protocol


class AccessLog:
    """``sample`` in (0, 1]: the share of requests logged (chosen at random per request)."""

    def __init__(self, sample: float = 1.0) -> None:
        self.sample = sample
        self._log = logging.getLogger("oip_gateway.access")

    def begin(self, request_id: str | None, bytes_in: int = 0) -> AccessRecord | None:
        """A record for the request the current task serves (:func:`note_endpoint` finds it)."""
        record = self.open(request_id, bytes_in)
        if record is not None:
            _CURRENT.set(record)
        return record

    def open(self, request_id: str | None, bytes_in: int = 0) -> AccessRecord | None:
        """A record passed along by hand: for a request served from protocol callbacks, where
        a context variable set would outlive the request (the connection's context)."""
        if self.sample < 1.0 and random.random() >= self.sample:
            return None
        return AccessRecord(request_id or "", bytes_in)

    def write(self, record: AccessRecord, protocol: str, api: str, model: str, version: str, route: str,
              backend: str, status: str | int, seconds: float) -> None:
        entry = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "request_id": record.request_id,
            "protocol": protocol,
            "protocol_out": record.protocol_out,
            "api": api,
            "model": model,
            "version": version,
            "route": route,
            "backend": backend,
            "pool": backend,  # deprecated alias of "backend"
            "endpoint": record.endpoint,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "bytes_in": record.bytes_in,
            "bytes_out": record.bytes_out,
        }
        if record.reason:
            entry["reason"] = record.reason[:200]
        self._log.info("%s", orjson.dumps(entry).decode())
