"""What the first-generation ("v1") front ends share: the calls to the data plane.

The HTTP (``v1_http.py``) and gRPC (``v1_grpc.py``) front ends parse their wire form and
hand the v1 request here; this module asks the data plane for what the translation needs
(a model's configuration, cached briefly; the repository index; readiness), runs the V2
inference through ``DataPlane.infer_grpc`` — which any backend answers, HTTP or gRPC — and
returns v1 messages built by the pure ``codec/v1.py``. Spec: ../shared/spec/legacy-v1-*.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._pb import legacy_v1_pb2 as v1
from .._pb import triton_extensions_pb2 as tx
from ..codec.content import is_count
from ..codec.bounds import limit_count, limit_shape
from ..codec.v1 import (
    ModelInfo,
    build_request,
    finish,
    model_info,
    plan_inputs,
    request_status,
    server_status,
    split_body,
    v1_version,
)
from ..config.security import Limits
from ..dataplane import DataPlane
from ..errors import GatewayError, InvalidRequest, ModelNotFound, Unsupported, UpstreamError

__all__ = ["V1Bridge", "path_version"]

log = logging.getLogger("oip_gateway.v1")

# A model's configuration is asked once per this many seconds (per model and version), not
# once per inference; a model reloaded with another configuration is seen within it.
CACHE_S = 5.0


def path_version(text: str) -> str:
    """The V2 version of ``/api/infer/<model>/<version>``'s version (a number, API text "Inference")."""
    if not is_count(text.lstrip("-")):
        raise InvalidRequest(f"model version '{text}' is not a number")
    return v1_version(int(text))


class V1Bridge:
    """v1 requests answered through one DataPlane. ``settings`` comes from the data plane
    (``v1_settings()``: the config's ``v1`` section) when it has one: readiness strict or not,
    and the model repositories label files are read from."""

    def __init__(self, plane: DataPlane, limits: Limits | None = None) -> None:
        self.plane = plane
        self.limits = limits or Limits()
        self.started_ns = time.monotonic_ns()
        self._ids = itertools.count(1)
        self._cache: dict[tuple[str, str], tuple[float, ModelInfo, dict[str, list[str]]]] = {}

    # -- settings ----------------------------------------------------------------------
    def _settings(self) -> Any:
        return self.plane.v1_settings()

    def server_id(self) -> str:
        return str(self.plane.server_metadata().get("name", ""))

    def next_id(self) -> int:
        return next(self._ids)

    def status_of(self, err: GatewayError | None, request_id: int) -> v1.RequestStatus:
        return request_status(err, request_id, self.server_id())

    def live(self) -> bool:
        return self.plane.server_live()

    def ready(self) -> bool:
        """API text "Health": strict (the default) — ready when every model can be served
        (the gateway's own readiness: every exact-name route has a ready endpoint); non-strict
        (``v1: {ready: non_strict}``) — ready while the server is responsive."""
        settings = self._settings()
        if settings is not None and settings.ready == "non_strict":
            return self.plane.server_live() and not self.plane.draining
        return self.plane.server_ready()

    # -- model information -------------------------------------------------------------
    async def model(self, model: str, version: str, timeout: float | None = None
                    ) -> tuple[ModelInfo, dict[str, list[str]]]:
        """The model's information (Triton's model configuration; V2 metadata where the
        backend has none) and its outputs' labels, cached for CACHE_S."""
        key = (model, version)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1], hit[2]
        request = tx.ModelConfigRequest(name=model, version=version).SerializeToString()
        try:
            config: bytes | None = await self.plane.model_extension_grpc("ModelConfig", request, model, version,
                                                                         timeout)
            info = model_info(config, None, model)
        except (UpstreamError, InvalidRequest) as exc:
            # No Triton model configuration there (MLServer, OVMS): the V2 metadata, which
            # every backend has; a model it does not know fails here with the backend's answer.
            log.debug("v1: no model configuration for %s (%s); using its metadata", model, exc.message)
            info = model_info(None, await self.plane.model_metadata(model, version), model)
        labels = self._labels(model, info)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = (now, info, labels)
        return info, labels

    def _labels(self, model: str, info: ModelInfo) -> dict[str, list[str]]:
        """Label files the model's configuration names (``label_filename``), read from the
        configured model repositories (``<dir>/<model>/<file>``, one label per line)."""
        settings = self._settings()
        dirs = settings.model_repositories if settings is not None else ()
        out: dict[str, list[str]] = {}
        for t in info.outputs.values():
            name = t.label_filename
            if not name or not dirs or "/" in name or "\\" in name or name.startswith(".") or \
                    "/" in model or model.startswith("."):
                continue  # a path outside the model's directory is never read
            for d in dirs:
                path = Path(d) / model / name
                try:
                    out[t.name] = path.read_text(encoding="utf-8", errors="replace").splitlines()
                    break
                except OSError:
                    continue
        return out

    # -- inference ---------------------------------------------------------------------
    async def infer(self, model: str, version: str, header: v1.InferRequestHeader, legacy: dict[int, int],
                    body: bytes | bytearray | None, raws: Sequence[bytes] | None, timeout: float | None,
                    metadata: Sequence[tuple[str, str]] = ()) -> tuple[v1.InferResponseHeader, list[memoryview]]:
        """One v1 inference: the raw inputs come as an HTTP ``body`` or as gRPC ``raws``."""
        info, labels = await self.model(model, version, timeout)
        batching, plans = plan_inputs(header, info, legacy)
        # The V2 request built here skips the V2 front ends' checks: the same limits, on the
        # shapes as they will travel (a batching model's batch dimension included).
        limit_count("input", len(plans), self.limits)
        for p in plans:
            limit_shape(p.name, list(p.shape), self.limits)
        inputs = split_body(body, plans) if body is not None else list(raws or ())
        message, plan, affinity = build_request(model, version, header, info, batching, plans, inputs)
        del inputs
        answer = await self.plane.infer_grpc(message, model, version, timeout, affinity, metadata)
        return finish(answer, plan, info, labels)

    # -- status ------------------------------------------------------------------------
    async def status(self, model: str = "") -> v1.ServerStatus:
        """ServerStatus of one model (its errors are the answer's) or of every routed model
        the backends list (a model that fails shows as unavailable with the reason)."""
        try:
            entries = list(await self.plane.repository_index(False))
        except Unsupported:  # (a data plane without an index: the models named are all there is)
            entries = []
        names = [model] if model else sorted({e.name for e in entries})
        results = await asyncio.gather(*(self._model_status(n, entries) for n in names), return_exceptions=True)
        models = []
        for name, result in zip(names, results):
            if isinstance(result, BaseException):
                if model or not isinstance(result, GatewayError):
                    raise result
                if isinstance(result, ModelNotFound):
                    continue  # listed by a backend, but not routed here: not the gateway's model
                versions = [(e.version, "UNAVAILABLE", result.message) for e in entries if e.name == name]
                models.append((ModelInfo(name, "", 0, {}, {}), versions))
            else:
                models.append(result)
        meta = self.plane.server_metadata()
        return server_status(str(meta.get("name", "")), str(meta.get("version", "")),
                             time.monotonic_ns() - self.started_ns, self.ready(), models)

    async def _model_status(self, name: str, entries: Sequence[Any]
                            ) -> tuple[ModelInfo, list[tuple[str, str, str]]]:
        info, _ = await self.model(name, "")
        # One entry per backend that lists the version: a READY one last, so it is the one kept.
        versions = sorted(((e.version, e.state, e.reason) for e in entries if e.name == name and e.version),
                          key=lambda v: v[1] == "READY")
        if not versions:
            # No index lists its versions: the V2 metadata's, each asked whether it is ready.
            meta = await self.plane.model_metadata(name, "")
            listed = [str(v) for v in meta.get("versions") or ()]
            ready = await asyncio.gather(*(self.plane.model_ready(name, v) for v in listed), return_exceptions=True)
            versions = [(v, "READY" if r is True else "UNAVAILABLE", "") for v, r in zip(listed, ready)]
        return info, versions
