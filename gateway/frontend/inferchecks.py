"""What an HTTP inference request's target and body are, checked before anything is done with
them: the model and version of its path, a UTF-8 path, the binary extension's JSON length, the
JSON part's nesting depth. No I/O.

Compiled with mypyc with frontend/infer.py (setup.py), which calls these on every request.
"""
from __future__ import annotations

import urllib.parse

from ..codec.content import is_count
from ..codec.jsondepth import too_deep
from ..errors import InvalidRequest
from .incoming import too_deep_message

__all__ = ["check_depth", "header_length", "infer_target", "json_part", "utf8_path"]


def json_part(body: bytes | bytearray | memoryview, json_length: str | None) -> bytes | bytearray | memoryview:
    """The JSON of an inference body: all of it, or its first Inference-Header-Content-Length bytes."""
    if json_length is not None and is_count(json_length) and int(json_length) <= len(body):
        return memoryview(body)[: int(json_length)]
    return body


def check_depth(body: bytes | bytearray | memoryview, limit: int) -> None:
    """Refuse a JSON body nesting deeper than ``limit`` (codec/jsondepth.py: a scan, not a parse)."""
    if limit and too_deep(body, limit):
        raise InvalidRequest(too_deep_message(limit))


def header_length(value: str | None, body_length: int) -> int | None:
    """Inference-Header-Content-Length, checked (binary extension): a number within the body."""
    if value is None:
        return None
    text = value.strip()
    if not is_count(text) or int(text) > body_length:
        raise InvalidRequest(f"Inference-Header-Content-Length {value!r} is not a byte count within the "
                             f"{body_length}-byte body")
    return int(text)


def infer_target(path: str) -> tuple[str, str] | None:
    """(model, version) of ``/v2/models/{m}[/versions/{v}]/infer``, else None."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], ""
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def utf8_path(raw_path: bytes) -> bool:
    try:
        urllib.parse.unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
