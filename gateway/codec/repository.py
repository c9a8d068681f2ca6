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

import orjson

from ..errors import InvalidRequest
from .wire import iter_fields

__all__ = ["INDEX_REQUEST_JSON", "INDEX_REQUEST_PB", "IndexEntry", "parse_index_json", "parse_index_pb"]

# (name, version, ready); version "" when the entry names none.
IndexEntry = tuple[str, str, bool]

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
        out.append((entry["name"], str(version) if version is not None else "", _ready(state)))
    return out


def parse_index_pb(message: bytes) -> list[IndexEntry]:
    out: list[IndexEntry] = []
    for fnum, wtype, value in iter_fields(memoryview(message)):
        if fnum != 1 or wtype != 2:
            continue
        fields = {f: bytes(v) for f, w, v in iter_fields(value) if w == 2 and f in (1, 2, 3)}  # type: ignore[arg-type]
        try:
            name, version, state = (fields.get(f, b"").decode("utf-8") for f in (1, 2, 3))
        except UnicodeDecodeError as exc:
            raise InvalidRequest("repository index entry is not valid UTF-8") from exc
        if not name:
            raise InvalidRequest("repository index entry without a name")
        out.append((name, version, _ready(state)))
    return out


def _ready(state: object) -> bool:
    return state == "READY" or state == "State.READY"
