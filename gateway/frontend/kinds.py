"""What kind of call a request is, for the guard (security/guard.py): open, metadata,
infer or control — and which model it names. One table per transport, so both
front ends protect the same things the same way."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..security.guard import CONTROL, INFER, METADATA, OPEN, Guard

__all__ = ["GRPC_KINDS", "admit_grpc", "http_kind"]


def admit_grpc(guard: Guard, kind: str, model: str, version: str, metadata: Sequence[tuple[str, Any]]) -> None:
    """The guard's check for a gRPC call: the credential from the ``authorization`` metadata,
    the metadata as headers (for header routes) when the call names a model."""
    auth = next((v for k, v in metadata if k == "authorization" and isinstance(v, str)), None)
    headers = {k: v for k, v in metadata if isinstance(v, str)} if model else None
    guard.admit(kind, model, version, auth, headers)


def _model_path(rest: str) -> tuple[str, str, str]:
    """``{m}[/versions/{v}][/tail]`` → (model, version, tail)."""
    parts = rest.split("/")
    model = parts[0]
    if len(parts) >= 3 and parts[1] == "versions":
        return model, parts[2], "/".join(parts[3:])
    return model, "", "/".join(parts[1:])


def http_kind(method: str, path: str) -> tuple[str, str, str]:
    """(kind, model, version) of an HTTP request (V2 paths, and the first-generation
    ``/api/`` paths). Unknown paths are ``metadata`` (they answer 404 anyway)."""
    if path.startswith("/v2/health/") or path.startswith("/api/health/"):
        return OPEN, "", ""
    if path.startswith("/v2/models/"):
        model, version, tail = _model_path(path[11:])
        if model == "stats" and not tail:
            return METADATA, "", ""
        if tail in ("infer", "generate", "generate_stream"):
            return INFER, model, version
        if tail == "trace/setting":
            return CONTROL, model, ""
        return METADATA, model, version
    if path.startswith("/v2/repository/models/"):
        return CONTROL, path[22:].split("/")[0], ""
    if path in ("/v2/trace/setting", "/v2/logging"):
        return CONTROL, "", ""
    if path.startswith("/api/infer/"):
        parts = path[11:].split("/")
        return INFER, parts[0], parts[1] if len(parts) > 1 else ""
    if path.startswith("/api/status/"):
        return METADATA, path[12:].split("/")[0], ""
    return METADATA, "", ""


GRPC_KINDS: dict[str, str] = {
    "ServerLive": OPEN,
    "ServerReady": OPEN,
    "ServerMetadata": METADATA,
    "ModelReady": METADATA,
    "ModelMetadata": METADATA,
    "ModelConfig": METADATA,
    "ModelStatistics": METADATA,
    "RepositoryIndex": METADATA,
    "ModelInfer": INFER,
    "ModelStreamInfer": INFER,
    "RepositoryModelLoad": CONTROL,
    "RepositoryModelUnload": CONTROL,
    "TraceSetting": CONTROL,
    "LogSettings": CONTROL,
}
