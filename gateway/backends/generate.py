"""Triton's generate extension on the backends: ``HttpBackend.generate`` and ``GrpcBackend.generate``
delegate here (docs/protocol/extension_generate.md; what the conversion follows is in
``codec/generate.py``).

- **HTTP backends** pass the request through to the server's own ``/generate`` or
  ``/generate_stream``. Triton answers both with chunked transfer encoding, one chunk per
  server-sent event: a stream is handed on as an h1 ``BodyStream`` of unknown length, each
  event relayed as it arrives.
- **gRPC backends** have no generate endpoint: the request is converted with the model's
  input metadata (cached per backend, model and version, :class:`_Metadata`). ``generate``
  is one ModelInfer; ``generate_stream`` — and ``generate`` for a decoupled model, which
  ModelInfer refuses — is Triton's ModelStreamInfer with that one request, each
  ModelStreamInferResponse becoming one event as it arrives. The HTTP status is decided,
  as Triton decides it, by the first answer (extension_generate.md "generate vs.
  generate_stream"): an error that came before inference began is a plain JSON error.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..codec import generate as gen
from ..codec.content import is_count
from ..dataplane import HttpReply
from ..errors import GatewayError, InvalidRequest, Unsupported, UpstreamError

if TYPE_CHECKING:
    from .base import Backend
    from .grpc import GrpcBackend
    from .http import HttpBackend

__all__ = ["via_grpc", "via_http"]

_JSON = {"content-type": "application/json"}
_SSE = {"content-type": gen.SSE_CONTENT_TYPE}

# A model's input metadata is asked again after this long, at once when a request cannot be
# converted with it (then converted again with the fresh one: a model reloaded on the backend
# with other inputs is seen by its first request), and after the backend refused a converted
# request. A config reload builds new backends, and so new caches.
_METADATA_TTL_S = 10.0
_MAX_MODELS = 1024  # clients choose model names (glob routes): the cache per backend stays bounded

# gRPC headers of an HTTP request: everything forwarded but the HTTP body's own framing.
_FRAMING = frozenset({"content-type", "inference-header-content-length", "content-encoding", "accept-encoding"})

# Triton's HttpCodeFromError, for a backend's gRPC status: its HTTP generate answers UNKNOWN,
# ALREADY_EXISTS and CANCELLED with 400 (the gateway's own table says 500, 409, 499).
_TRITON_HTTP = {"UNKNOWN": 400, "ALREADY_EXISTS": 400, "CANCELLED": 400}


# ---------------------------------------------------------------------- HTTP backends
async def via_http(backend: HttpBackend, model: str, version: str, body: bytes, headers: Mapping[str, str],
                   forwarded: Sequence[str], stream: bool) -> HttpReply:
    """Pass-through: the body as received; status, headers and body back unchanged. A
    stream's answer of unknown length (chunked) comes back as a BodyStream, relayed as it
    arrives; the whole exchange is bounded by the backend's ``timeout_s``."""
    from .http_endpoint import model_path

    fwd = {k: v for k in forwarded if (v := headers.get(k)) is not None}
    path = model_path(model, version) + ("/generate_stream" if stream else "/generate")
    reply = await backend.request("POST", path, model, version, body=body, headers=fwd, stream_unsized=stream)
    return HttpReply(reply.status, reply.body, reply.headers)


# ---------------------------------------------------------------------- gRPC backends
class _Metadata:
    __slots__ = ("decoupled", "expires", "inputs")

    def __init__(self, inputs: dict[str, gen.InputSpec], expires: float) -> None:
        self.inputs = inputs
        self.expires = expires
        self.decoupled = False  # learned from the backend's refusal of ModelInfer


_Slot = _Metadata | asyncio.Task[_Metadata]
_CACHES: weakref.WeakKeyDictionary[Backend[Any], dict[tuple[str, str], _Slot]] = weakref.WeakKeyDictionary()


async def _metadata(backend: GrpcBackend, model: str, version: str, *, fresh: bool = False) -> _Metadata:
    """The model's inputs, from the cache (unless ``fresh``) or the backend (one request at a
    time asks it: the others wait for that answer)."""
    cache = _CACHES.get(backend)
    if cache is None:
        cache = _CACHES[backend] = {}
    key = (model, version)
    slot = cache.get(key)
    if isinstance(slot, _Metadata) and slot.expires > time.monotonic() and not fresh:
        return slot
    if not isinstance(slot, asyncio.Task):
        if len(cache) >= _MAX_MODELS:
            cache.clear()

        async def fetch() -> _Metadata:
            try:
                meta = await backend.model_metadata(model, version)
                entry = _Metadata(gen.inputs_from_metadata(meta, backend.name), time.monotonic() + _METADATA_TTL_S)
            except BaseException:
                if cache.get(key) is task:
                    del cache[key]
                raise
            cache[key] = entry
            return entry

        slot = task = asyncio.ensure_future(fetch())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if no one waits
        cache[key] = task
    # Shielded: a client that leaves does not cancel the answer the others wait for.
    return await asyncio.shield(slot)


def _forget(backend: GrpcBackend, model: str, version: str) -> None:
    cache = _CACHES.get(backend)
    if cache is not None and isinstance(cache.get((model, version)), _Metadata):
        del cache[(model, version)]


def _as_triton(err: GatewayError) -> GatewayError:
    """A backend's gRPC error with the HTTP status Triton's own generate would give it."""
    if isinstance(err, UpstreamError) and err.body is None and err.grpc_code in _TRITON_HTTP:
        return UpstreamError(err.message, http_status=_TRITON_HTTP[err.grpc_code], grpc_code=err.grpc_code)
    return err


async def _one(message: bytes) -> AsyncIterator[bytes]:
    yield message


def _event(answer: gen.StreamAnswer, backend: str) -> tuple[int, bytes]:
    """(HTTP status this answer would give as the first, its JSON) of one stream answer."""
    if answer.error is not None:
        return 400, gen.error_json(answer.error)  # (a gRPC stream carries no code: Triton's usual 400)
    assert answer.answer is not None
    try:
        return 200, gen.answer_json(answer.answer, backend)
    except GatewayError as err:  # FinalizeResponse failed: Triton sends the error in its place
        return err.http_status, gen.error_json(err.message)


async def via_grpc(backend: GrpcBackend, model: str, version: str, body: bytes, headers: Mapping[str, str],
                   forwarded: Sequence[str], stream: bool) -> HttpReply:
    """Converted, in HandleGenerate's order: the model's metadata (unknown model: the
    backend's 404), the body's encoding, its JSON, its keys; then the call."""
    if version and not is_count(version):
        # Triton's HTTP routes take only digits for a version (http_server.cc's route regex).
        raise UpstreamError("Not Found", http_status=404, body=b'{"error":"Not Found"}', content_type="text/plain")
    meta = await _metadata(backend, model, version)
    if headers.get("content-encoding", "identity").strip().lower() != "identity":
        raise InvalidRequest("Unsupported content-encoding, only 'identity' is supported.")
    backend.on_event("http_to_grpc")
    doc = gen.parse_generate(body)
    try:
        message = gen.generate_to_grpc(doc, meta.inputs, model, version)
    except (InvalidRequest, Unsupported):
        # Perhaps the model changed since its metadata was cached: ask again, convert again.
        latest = await _metadata(backend, model, version, fresh=True)
        if latest.inputs == meta.inputs:
            raise
        meta = latest
        message = gen.generate_to_grpc(doc, meta.inputs, model, version)
    trace = tuple((k, v) for k in forwarded if k not in _FRAMING and (v := headers.get(k)) is not None)
    if not stream and not meta.decoupled:
        try:
            answer = await backend.infer_grpc(message, model, version, None, None, trace)
        except UpstreamError as err:
            if not (err.grpc_code == "UNIMPLEMENTED" and "decoupled" in err.message):
                _forget(backend, model, version)  # the model may have changed: ask its metadata again
                raise _as_triton(err) from err
            meta.decoupled = True  # ModelInfer refuses decoupled models: Triton's generate still serves them
        else:
            return HttpReply(200, gen.answer_json(answer, backend.name), _JSON)
    # One request, then half-close: the backend ends the stream after its last answer.
    answers = backend.infer_stream(_one(message), model, version, backend.spec.timeout_s, None, trace).__aiter__()
    try:
        first = gen.split_stream_answer(await answers.__anext__())
    except StopAsyncIteration:  # a decoupled model may answer nothing (only the final flag)
        return HttpReply(200, gen.error_json(gen.EXACTLY_ONE) if not stream else b"", _SSE if stream else _JSON)
    except BaseException:
        await _close(answers)
        raise
    if first.error is not None and not first.began:
        # Refused before inference began: Triton's plain JSON error (INVALID_ARG: 400), not an event.
        await _close(answers)
        _forget(backend, model, version)
        raise UpstreamError(first.error, http_status=400, grpc_code="INVALID_ARGUMENT")
    status, data = _event(first, backend.name)
    if stream:
        return HttpReply(status, _Events(gen.sse_event(data), answers, backend.name), _SSE)
    try:
        extra = 0
        async for _ in answers:
            extra += 1
    except GatewayError:
        extra += 1
    finally:
        await _close(answers)
    return HttpReply(status, data if extra == 0 else gen.error_json(gen.EXACTLY_ONE), _JSON)


async def _close(answers: AsyncIterator[bytes]) -> None:
    aclose = getattr(answers, "aclose", None)
    if aclose is not None:
        await aclose()  # GrpcBackend.infer_stream's finally cancels the call


class _Events:
    """:class:`gateway.dataplane.StreamedBody` of unknown length: the first event, then one
    per stream answer as it comes. A stream that breaks off ends with an error event, as
    Triton ends a request that failed (AddErrorJson)."""

    length: int | None = None

    def __init__(self, first: bytes, answers: AsyncIterator[bytes], backend: str) -> None:
        self._first: bytes | None = first
        self._answers = answers
        self._backend = backend
        self._closing: asyncio.Task[None] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    async def _events(self) -> AsyncIterator[bytes]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        try:
            async for message in self._answers:
                yield gen.sse_event(_event(gen.split_stream_answer(message), self._backend)[1])
        except GatewayError as err:
            yield gen.sse_event(gen.error_json(err.message))

    def ready(self) -> list[bytes | memoryview]:
        return []  # (each event goes out as it comes)

    def close(self) -> None:
        """Stop the backend's stream (a no-op once it ended): the client is done with it."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(_close(self._answers))
