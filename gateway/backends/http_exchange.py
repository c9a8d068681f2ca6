"""One exchange on one HTTP endpoint, and with the backend's endpoint choice and safe retries:
the base of :class:`~.http.HttpBackend`. The endpoints are made here (an ``h1`` connection pool
each, with the backend's TLS and answer limits), and the h1 client's errors are mapped to the
gateway's error tree here, once (``raise ... from exc``)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config.schema import BackendSpec, HostPort
from ..dataplane import IncomingBody
from ..errors import NoEndpointAvailable, RequestTimeout, UpstreamReset, UpstreamTimeout
from ..routing.table import STATEFUL
from .base import Backend
from .h1 import (
    AnswerLimits,
    BadAnswer,
    BodyStream,
    ConnectFailed,
    ConnectionDropped,
    H1ConnectionPool,
    H1Response,
    SourceStalled,
)
from .http_endpoint import (
    _NOT_READY_STATUS,
    Body,
    HttpEndpoint,
    UpstreamReply,
    _refused,
    _relayed,
    error_from_reply,
    ssl_context,
)
from .refusal import Refused, always_resendable

__all__ = ["HttpExchange"]


class HttpExchange(Backend[HttpEndpoint]):
    """An HTTP backend's endpoints and exchanges (what :class:`~.http.HttpBackend` asks them)."""

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self._ssl = ssl_context(spec.tls)
        self._check_headers = dict(spec.check_headers)
        self._base64_bytes = spec.non_utf8_bytes == "base64"
        self._infer_paths: dict[tuple[str, str], str] = {}
        self._apply(frozenset())  # static endpoints exist from the start: no loop needed

    def _make(self, address: HostPort) -> HttpEndpoint:
        b = self.spec
        limits = AnswerLimits(b.max_answer_header_count, b.max_answer_head_bytes, b.max_message_bytes)
        return HttpEndpoint(address, H1ConnectionPool(
            address.host, address.port, connect_timeout=b.connect_timeout_s, ssl=self._ssl,
            server_name=b.tls.server_name if b.tls else None, max_connections=b.max_connections, limits=limits))

    # -- one exchange on one endpoint ---------------------------------------------------
    async def _send(self, ep: HttpEndpoint, method: str, path: str, *, body: Body = None,
                    headers: Mapping[str, str] | None = None, timeout: float | None = None,
                    stream_min: int | None = None, stream_unsized: bool = False,
                    max_body: int | None = None, stateful: bool = False) -> UpstreamReply:
        """Raises Refused when nothing of an answer came (connection refused, or closed
        before a byte of it), so the request may go to another endpoint. ``stream_unsized``:
        an answer of unknown length (chunked) comes as a BodyStream (generate_stream).
        ``max_body``: a lower body limit than the backend's (health checks). ``stateful``: a
        request of a sequence, never sent twice (see :meth:`_mapped`)."""
        tmo = self.spec.timeout_s if timeout is None else min(timeout, self.spec.timeout_s)
        try:
            resp = await ep.connections.request(method, path, body=body, headers=headers, timeout=tmo,  # type: ignore[arg-type]
                                                stream_min=stream_min, stream_unsized=stream_unsized,
                                                max_body=max_body, resend=not stateful)
        except (SourceStalled, TimeoutError, ConnectFailed, ConnectionDropped, BadAnswer) as exc:
            raise self._mapped(ep, exc, tmo, stateful) from exc
        return self._reply(ep, resp, tmo)

    def _mapped(self, ep: HttpEndpoint, exc: Exception, tmo: float, stateful: bool = False) -> Exception:
        """The h1 client's error as the gateway's: a Refused when nothing of an answer came
        (the request may go to another endpoint).

        When a request is sent again (docs/config.md "Retries"): only when the endpoint could
        not be reached (nothing was written), or when the connection closed before a single
        byte of the answer — a reused one (the keep-alive race: the backend closed it idle as
        the request went out) on the same endpoint, a fresh one on another. A ``stateful``
        request (one carrying a ``sequence_id``) is never sent again once any of its bytes were
        written: a sequence's step must not run twice, so that close is an UpstreamReset."""
        where = self._where(ep)
        if isinstance(exc, SourceStalled):
            return RequestTimeout(str(exc))
        if isinstance(exc, TimeoutError):
            return UpstreamTimeout(f"{where}: {str(exc) or f'did not answer within {tmo}s'}")
        if isinstance(exc, ConnectFailed):
            return Refused(NoEndpointAvailable(f"{where} is unreachable: {exc}"), kind=Refused.TRANSPORT)
        if isinstance(exc, ConnectionDropped) and exc.before_response and not stateful:
            return Refused(NoEndpointAvailable(f"{where}: {exc}"), kind=Refused.TRANSPORT)
        self.transport_failed(ep)
        if isinstance(exc, BadAnswer):
            return _refused(where, exc)
        if isinstance(exc, ConnectionDropped) and exc.before_response:
            return UpstreamReset(f"{where}: {exc} before answering a request of a sequence (not sent again: "
                                 f"it may have run)")
        return UpstreamReset(f"{where}: {exc}")

    def _reply(self, ep: HttpEndpoint, resp: H1Response, tmo: float) -> UpstreamReply:
        return UpstreamReply(resp.status, self._answer_body(ep, resp, tmo), _relayed(resp.headers), ep)

    def _answer_body(self, ep: HttpEndpoint, resp: H1Response, tmo: float) -> bytes | bytearray | BodyStream:
        if isinstance(resp.body, BodyStream):
            resp.body.map_error = self._stream_error(ep, tmo)
        return resp.body

    def _where(self, ep: HttpEndpoint) -> str:
        return f"backend '{self.name}' endpoint {ep.address}"

    def _stream_error(self, ep: HttpEndpoint, tmo: float) -> Callable[[Exception], Exception]:
        def mapped(exc: Exception) -> Exception:
            if isinstance(exc, TimeoutError):
                return UpstreamTimeout(f"backend '{self.name}' endpoint {ep.address}: "
                                       f"answer not complete within {tmo}s")
            if isinstance(exc, BadAnswer):
                return _refused(self._where(ep), exc)
            return UpstreamReset(f"backend '{self.name}' endpoint {ep.address}: {exc}")

        return mapped

    async def request(self, method: str, path: str, model: str, version: str, *, body: Body = None,
                      headers: Mapping[str, str] | None = None, timeout: float | None = None,
                      affinity: str | None = None, stream_min: int | None = None,
                      stream_unsized: bool = False) -> UpstreamReply:
        """One exchange on the backend for ``model``: chosen endpoint, safe retries. An error
        answer meaning "model not here" from an endpoint thought ready is retried too."""
        # (Not isinstance(body, IncomingBody): a runtime Protocol check costs ~20 µs.)
        resendable: Callable[[], bool]
        if body is None or isinstance(body, (bytes, bytearray)):
            resendable = always_resendable
        elif isinstance(body, list):
            # The h1 client empties a body in pieces once a 2xx answer began (backends/h1/link.py
            # ``_parts``): from then on it is not sent again.
            resendable = _while_parts(body) if body else always_resendable
        else:
            resendable = _until_consumed(body)

        stateful = affinity is not None or STATEFUL.get()

        async def send(ep: HttpEndpoint) -> UpstreamReply:
            reply = await self._send(ep, method, path, body=body, headers=headers, timeout=timeout,
                                     stream_min=stream_min, stream_unsized=stream_unsized, stateful=stateful)
            if reply.status in _NOT_READY_STATUS and not isinstance(reply.body, BodyStream):
                error = error_from_reply(reply)
                outcome = self.refusal(ep, model, version, error, resendable())
                if outcome is not error:
                    raise outcome
            return reply

        return await self.attempt(model, version, affinity, send, (), resendable)


# (Closures of their own: a lambda in request() would share the environment of its nested
# send(), which the compiled module's closures keep in a reference cycle per request.)
def _while_parts(parts: list[bytes | memoryview]) -> Callable[[], bool]:
    return lambda: len(parts) > 0


def _until_consumed(stream: IncomingBody) -> Callable[[], bool]:
    return lambda: not stream.consumed
