"""ModelStreamInfer on a backend, as async generators: the backend classes are compiled
(setup.py) and mypyc builds no async generator, so their ``infer_stream`` hands over to these."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from grpc import aio

from ..codec.convert import grpc_request_to_http, http_answer_to_grpc
from ..codec.grpc import encode_stream_response
from ..codec.wire import scan_infer_routing
from ..errors import GatewayError
from ..routing.table import STATEFUL
from .grpc_outcome import mapped_error
from .h1 import BodyStream
from .h2frames import CallError
from .http_endpoint import error_from_reply, model_path
from .refusal import Refused

if TYPE_CHECKING:
    from .grpc import GrpcBackend
    from .http import HttpBackend


async def grpc_stream(backend: GrpcBackend, requests: AsyncIterator[bytes], model: str, version: str,
                      timeout: float | None, affinity: str | None,
                      metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
    """:meth:`GrpcBackend.infer_stream`."""
    ep = backend.first(model, version, affinity)
    call = ep.stream(requests, timeout=timeout, metadata=metadata or None)
    ep._inflight += 1
    try:
        async for answer in call:
            yield answer
    except (aio.AioRpcError, CallError) as exc:
        error = mapped_error(backend, ep, exc, timeout)
        if isinstance(error, Refused):
            if error.kind == Refused.TRANSPORT:
                backend.transport_failed(ep, live=False)
            raise error.error from exc
        raise error from exc
    finally:
        ep.left()
        call.cancel()  # a no-op once the stream ended; stops it if the client went away


async def http_stream(backend: HttpBackend, requests: AsyncIterator[bytes], model: str, version: str,
                      timeout: float | None, affinity: str | None,
                      metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
    """:meth:`HttpBackend.infer_stream`."""
    ep = backend.first(model, version, affinity)
    ep_headers = dict(metadata)
    async for message in requests:
        try:
            m, v, sequence = scan_infer_routing(message)
            backend.on_event("grpc_to_http")
            chunks, headers, typed = grpc_request_to_http(message, binary=backend.spec.binary_extension,
                                                        base64_bytes=backend._base64_bytes)
            try:
                reply = await backend._send(ep, "POST", model_path(m, v) + "/infer", body=chunks,
                                            headers={**headers, **ep_headers},
                                            stateful=sequence is not None or STATEFUL.get())
            except Refused as exc:
                raise exc.error from exc
            if reply.status != 200:
                raise error_from_reply(reply)
            assert not isinstance(reply.body, BodyStream)
            triton = backend.family(ep) == "triton"
            answer = http_answer_to_grpc(reply.body, reply.headers, backend.spec.max_message_bytes, backend.name,
                                         typed=typed and not triton, final_flag=triton)
        except GatewayError as err:
            yield encode_stream_response(error=err.message)
            continue
        yield encode_stream_response(answer=answer)
