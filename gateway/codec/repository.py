"""Repository index answers (Triton's model repository extension), read for the
health checker. No I/O.

HTTP: ``POST /v2/repository/index`` answers a JSON array of
``{"name", "version", "state", "reason"}`` (a model never loaded has only a name, or
state ``UNAVAILABLE``). gRPC: ``RepositoryIndex`` answers ``RepositoryIndexResponse``
(``repeated ModelIndex models = 1``; ModelIndex: name 1, version 2, state 3, reason 4),
read here from the wire so no Triton proto has to be compiled. A model is ready only
in state ``READY`` (MLServer's gRPC index spells it ``State.READY``). Anything else
malformed raises InvalidRequest.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import orjson

from ..errors import InvalidRequest
from .wire import encode_len_field, iter_fields

__all__ = ["INDEX_REQUEST_JSON", "INDEX_REQUEST_PB", "BackendIndexEntry", "IndexEntry", "encode_index_pb",
           "index_request_ready", "parse_index_json", "parse_index_pb"]


class IndexEntry(NamedTuple):
    """One model version of a repository index; version "" when the entry names none."""

    name: str
    version: str
    ready: bool
    state: str = ""
    reason: str = ""


class BackendIndexEntry(NamedTuple):
    """An entry of the gateway's own, merged index: Triton's fields, then which backend holds
    the model and on which endpoints (extra JSON keys ``backend`` and ``endpoints``)."""

    name: str
    version: str
    ready: bool
    state: str
    reason: str
    backend: str
    endpoints: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "state": self.state, "reason": self.reason,
                "backend": self.backend, "endpoints": list(self.endpoints)}

# Every model of the repository, ready or not: the names tell "loading" from "unknown".
INDEX_REQUEST_JSON = b"{}"
INDEX_REQUEST_PB = b""


def parse_index_json(body: bytes | bytearray) -> list[IndexEntry]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"repository index is not JSON: {exc}") from exc
    if not isinstance(doc, list):
        raise InvalidRequest("repository index is not a JSON array")
    out: list[IndexEntry] = []
    for entry in doc:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidRequest("repository index entry without a name")
        version = entry.get("version", "")
        state = entry.get("state", "")
        reason = entry.get("reason", "")
        out.append(IndexEntry(entry["name"], str(version) if version is not None else "", _ready(state),
                              state if isinstance(state, str) else "", reason if isinstance(reason, str) else ""))
    return out


def parse_index_pb(message: bytes) -> list[IndexEntry]:
    out: list[IndexEntry] = []
    for fnum, wtype, value in iter_fields(memoryview(message)):
        if fnum != 1 or wtype != 2:
            continue
        fields = {f: bytes(v) for f, w, v in iter_fields(value) if w == 2 and f in (1, 2, 3, 4)}  # type: ignore[arg-type]
        try:
            name, version, state, reason = (fields.get(f, b"").decode("utf-8") for f in (1, 2, 3, 4))
        except UnicodeDecodeError as exc:
            raise InvalidRequest("repository index entry is not valid UTF-8") from exc
        if not name:
            raise InvalidRequest("repository index entry without a name")
        out.append(IndexEntry(name, version, _ready(state), state, reason))
    return out


def _ready(state: object) -> bool:
    return state == "READY" or state == "State.READY"


def index_request_ready(message: bytes) -> bool:
    """``ready`` (field 2) of a serialized RepositoryIndexRequest."""
    ready = False
    for fnum, wtype, value in iter_fields(memoryview(message)):
        if fnum == 2 and wtype == 0:
            ready = bool(value)
    return ready


def encode_index_pb(entries: Iterable[IndexEntry | BackendIndexEntry]) -> bytes:
    """A RepositoryIndexResponse: ``repeated ModelIndex models = 1``."""
    out = bytearray()
    for e in entries:
        body = bytearray()
        for fnum, text in ((1, e.name), (2, e.version), (3, e.state), (4, e.reason)):
            if text:
                data = text.encode("utf-8")
                body += encode_len_field(fnum, len(data)) + data
        out += encode_len_field(1, len(body)) + body
    return bytes(out)
