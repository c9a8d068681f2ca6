"""The one backend interface, and what every backend does the same way.

A backend is a named set of endpoints speaking one protocol (``http.py``,
``grpc.py``). The proxy sees only :class:`Backend`: live / ready / model
readiness for the health checker, metadata, and inference in either client
form (``infer_http``, ``infer_grpc``) — a backend that speaks the other protocol
converts through ``codec/convert.py``. No caller branches on the backend type.

Shared here:

- **endpoint set** (``endpoints.py``, :class:`EndpointSet`, the base of :class:`Backend`): static
  addresses plus those DNS discovery finds; endpoints come and go (``set_addresses``) without
  disturbing requests in flight on them; on a config reload a new backend adopts the endpoints
  (connections, health state) of the old one that it keeps (``adopt``);
- **choice** (:meth:`Backend.candidates`): only endpoints that are live, not
  ejected, and have the model ready (``routing/readiness.py``), ordered by the
  balancer;
- **safe retries** (:meth:`Backend.attempt`): an attempt refused before any
  inference could have run (``refusal.py``'s ``Refused``: connection refused or reset before
  a byte of the answer, or "unknown model / not ready" from an endpoint the
  checker thought ready) is retried on the next candidate, ``retries`` times at
  most and within the backend's retry budget. A timeout or an answer broken off is
  never retried (no duplicate inference), nor is a streamed body already sent.
- **passive outlier ejection**: transport failures counted per endpoint (``refusal.py`` counts them).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mypy_extensions import mypyc_attr

from ..codec.repository import IndexEntry
from ..config.schema import BackendSpec
from ..dataplane import AnswerSink, GrpcOutcome, HttpReply, IncomingBody, Pending, StreamedMessage
from ..errors import GatewayError, ModelNotReady, NoEndpointAvailable, UpstreamError
from ..observability.access import note_endpoint
from ..routing.balancer import balancer
from ..routing.readiness import Ready
from ..routing.retry import RetryBudget
from .endpoints import E, EndpointSet
from .refusal import Refused, always_resendable, count_transport_failure, refusal_for, retry_allowed

if TYPE_CHECKING:
    from .holds import Holds
    from .placement import Placer

__all__ = ["TRITON_GRPC_PREFIX", "Backend"]

# Triton's --grpc-restricted-protocol=<api>:<key>=<value> wants the gRPC metadata key
# "triton-grpc-protocol-<key>"; over HTTP the header is plain "<key>".
TRITON_GRPC_PREFIX = "triton-grpc-protocol-"

T = TypeVar("T")


# Compiled (setup.py), and still open to subclasses in Python (the unit tests' fake backends).
@mypyc_attr(allow_interpreted_subclasses=True)
class Backend(EndpointSet[E]):
    """The endpoints of one backend (config ``backends``) and what the gateway can ask of them.
    What differs between the backend kinds is said here, not asked with isinstance: the
    protocol, what admission counts per request byte on each path through the backend, and
    whether a whole small HTTP request can be served from callbacks (:meth:`infer_http_now`)."""

    protocol = ""
    # Whether :meth:`infer_http_now` can take a request (else it always declines).
    serves_now = False
    # Whether :meth:`infer_grpc_now` can take a request (else it always declines).
    serves_grpc_now = False

    def http_cost(self, binary: bool) -> int:
        """Admission's factor per body byte of an HTTP inference sent here (``binary``: with
        binary-extension tensors)."""
        raise NotImplementedError

    def grpc_cost(self, streamed: bool = False) -> int:
        """Admission's factor per byte of a gRPC ModelInfer (or ModelStreamInfer) request
        (``streamed``: one still arriving, a dataplane.StreamedMessage)."""
        raise NotImplementedError

    def generate_cost(self) -> int:
        """Admission's factor per byte of a generate-extension request."""
        raise NotImplementedError

    def infer_http_now(self, model: str, version: str, body: bytes | bytearray | memoryview,
                       headers: Mapping[str, str], forwarded: Sequence[str], record: Any,
                       done: Callable[[HttpReply | Exception | None], None]) -> bool:
        """An HTTP inference served from callbacks; False: nothing was sent."""
        return False

    def infer_grpc_now(self, message: bytes, model: str, version: str, timeout: float | None, affinity: str | None,
                       metadata: tuple[tuple[str, str], ...], sink: AnswerSink | None, record: Any,
                       done: Callable[[GrpcOutcome], None]) -> Pending | None:
        """A gRPC inference served from callbacks (DataPlane.infer_grpc_now); None: nothing was sent."""
        return None

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self.balancer = balancer(spec.balance)
        self.budget = RetryBudget(spec.retry_budget_percent)
        self._choice: dict[tuple[str, str], tuple[int, list[E]]] = {}
        # Exact model names routed to this backend: a model ready nowhere is then "not
        # ready" (503), where an unknown glob-routed one is left for the servers to refuse.
        self._routed: frozenset[str] = frozenset()
        # Counts what the backend did for metrics: "retry", "retry_budget_exhausted", "ejection",
        # and conversions ("http_to_grpc", "grpc_to_http").
        self.on_event: Callable[[str], None] = lambda kind: None
        # Requests held for a model ready nowhere yet (routes' hold_s), and the placement that
        # loads it (config ``placement``): set by the gateway (backends/holds.py, placement.py).
        self.holds: Holds | None = None
        self.placer: Placer | None = None

    @property
    def generation(self) -> int:
        """Moves whenever anything that decides where a request may go changes (cache key)."""
        return self._gen.n

    @property
    def routed(self) -> frozenset[str]:
        return self._routed

    @routed.setter
    def routed(self, names: frozenset[str]) -> None:
        self._routed = names
        self._gen.n += 1

    # -- choice ---------------------------------------------------------------------
    def candidates(self, model: str, version: str, affinity: str | None = None) -> list[E]:
        """Endpoints that may take a request for ``model`` now, the chosen one first.
        Raises ModelNotReady (routed, ready nowhere) or NoEndpointAvailable."""
        eligible = self.eligible(model, version)
        if len(eligible) == 1:
            return eligible  # (every balancer's order of one; attempt only reads it)
        return self.balancer.order(eligible, affinity, (model, version))

    def eligible(self, model: str, version: str) -> list[E]:
        """The endpoints that may take ``model`` now, unordered (cached until the generation
        moves); raises as :meth:`candidates`. Asking it chooses nothing (no balancer turn)."""
        key = (model, version)
        hit = self._choice.get(key)
        if hit is None or hit[0] != self._gen.n:
            hit = (self._gen.n, self._eligible(model, version))
            if len(self._choice) >= 4096:  # clients choose model names: keep it bounded
                self._choice.clear()
            self._choice[key] = hit
        return hit[1]

    def _eligible(self, model: str, version: str) -> list[E]:
        eps = list(self.endpoints.values())
        if not eps:
            raise NoEndpointAvailable(f"backend '{self.name}' has no endpoints (its DNS names resolve to nothing)")
        usable = [ep for ep in eps if ep.health.usable()]
        if not usable:
            # Nothing checked yet, or every endpoint down or ejected: try them all rather
            # than refuse outright (Envoy's panic routing) — the health state may be stale,
            # and a refused connection is answered in microseconds.
            return eps
        ready = [ep for ep in usable if ep.health.ready_for(model, version) != Ready.NO]
        if ready:
            return ready
        if version:
            # A version no endpoint lists (none of its versions, or not a number): not one
            # that is loading, so no "retry later" — the server says what it is.
            foreign = [ep for ep in usable if ep.health.lacks_version(model, version)]
            if foreign:
                return foreign
        if model in self.routed or any(ep.health.knows(model) for ep in eps):
            what = f"model '{model}'" + (f" version {version}" if version else "")
            raise ModelNotReady(f"{what} is not ready on any endpoint of backend '{self.name}' "
                                f"({len(usable)} live endpoints); retry later")
        # No endpoint has heard of the model: the servers answer for themselves (their own 404).
        return usable

    def can_take(self, model: str, version: str) -> bool:
        """Some live endpoint may take a request for ``model`` now: a split route sends this
        backend its share only then (else the other sides take it)."""
        try:
            return any(ep.health.usable() for ep in self.eligible(model, version))
        except GatewayError:
            return False

    def first(self, model: str, version: str, affinity: str | None = None) -> E:
        ep = self.candidates(model, version, affinity)[0]
        note_endpoint(ep.address, self.protocol)
        return ep

    async def attempt(self, model: str, version: str, affinity: str | None,
                      send: Callable[..., Awaitable[T]], args: tuple[Any, ...] = (),
                      resendable: Callable[[], bool] = always_resendable, tried: int = 0) -> T:
        """``send(endpoint, *args)`` to the chosen endpoint; on :class:`Refused`, to the next one
        while the retries, the retry budget and ``resendable()`` allow. (``args`` rather than a
        ``functools.partial`` with keywords: every inference passes here, and a keyword partial
        copies its dict and binds by name on every call.) ``tried``: attempts made already (from
        callbacks, :meth:`retries_after`, which counted the retry and checked the budget): the
        first send here is a retry."""
        order = self.candidates(model, version, affinity)
        budget = self.budget
        budget.active += 1
        retrying = tried > 0
        if retrying:
            budget.retrying += 1
        left = self.spec.retries - tried
        try:
            error: GatewayError | None = None
            for i, ep in enumerate(order):
                if i > 0:
                    if left <= 0 or not resendable():
                        break
                    if not retrying:
                        if not budget.allows():
                            self.on_event("retry_budget_exhausted")
                            break
                        retrying = True
                        budget.retrying += 1
                    left -= 1
                    self.on_event("retry")
                note_endpoint(ep.address, self.protocol)
                try:
                    result = await send(ep, *args)
                except Refused as exc:
                    error = exc.error
                    self.refused_by(ep, exc, model, version)
                    continue
                if ep.health.failures or ep.health.check_failures:  # live traffic is evidence too
                    ep.health.succeeded()
                return result
            assert error is not None
            raise error
        finally:
            budget.active -= 1
            if retrying:
                budget.retrying -= 1

    def refused_by(self, ep: E, refused: Refused, model: str, version: str) -> None:
        """What a Refused says of ``ep``: unreachable (no traffic until a check sees it live), or
        without the model (not ready there); busy says nothing."""
        if refused.kind == Refused.TRANSPORT:
            self.transport_failed(ep, live=False)
        elif refused.kind == Refused.NOT_READY:
            ep.health.not_ready(model, version)

    def retries_after(self, refused: Refused, others: int) -> bool:
        """Whether :meth:`attempt` would send a request that ``refused`` on its first endpoint to
        one of the ``others`` next (refusal.py). False: ``refused.error`` is the request's answer."""
        return retry_allowed(others, self.spec.retries, self.budget, self.on_event)

    def transport_failed(self, ep: E, *, live: bool = True) -> None:
        """A transport failure on ``ep``: counted for ejection; ``live=False`` (the
        connection was refused) also stops traffic to it until the checker sees it live."""
        count_transport_failure(ep, self.endpoints.values(), self.spec.outlier, self.name, self.on_event, live)

    def refusal(self, ep: E, model: str, version: str, error: GatewayError, resendable: bool) -> Exception:
        """What to raise for an endpoint's error answer: a :class:`Refused` when the endpoint lacks
        a model it was thought to have (refusal.py ``refusal_for``), else an error."""
        return refusal_for(ep, model, version, error, resendable, self.name, self.placer is not None)

    # -- the health checker's questions (errors are answers: False / None) ----------
    async def check_live(self, ep: E, timeout: float) -> bool:
        raise NotImplementedError

    async def check_index(self, ep: E, timeout: float) -> list[IndexEntry] | None:
        """The endpoint's repository index, or None when it has none (or refuses it, or
        answers something that does not read as one)."""
        raw = await self.check_index_raw(ep, timeout)
        if raw is None:
            return None
        try:
            return self.parse_index(raw)
        except GatewayError:
            return None

    async def check_index_raw(self, ep: E, timeout: float) -> bytes | bytearray | None:
        """The endpoint's repository index answer as it came (:meth:`parse_index` reads it),
        or None when it has none (or refuses it)."""
        raise NotImplementedError

    def parse_index(self, raw: bytes | bytearray) -> list[IndexEntry]:
        """The entries of an answer of :meth:`check_index_raw`; a GatewayError when it does
        not read as an index."""
        raise NotImplementedError

    async def check_model(self, ep: E, model: str, version: str, timeout: float) -> bool | None:
        """Whether ``model`` is ready on ``ep``; None when no answer came (not a "no")."""
        raise NotImplementedError

    # -- client-facing calls ----------------------------------------------------------
    async def model_ready(self, model: str, version: str) -> bool:
        raise NotImplementedError

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        raise NotImplementedError

    async def infer_http(self, model: str, version: str, body: bytes | bytearray | IncomingBody,
                         headers: Mapping[str, str],
                         forwarded: Sequence[str], limit: int) -> HttpReply:
        """An HTTP client's inference (headers lower-cased; ``forwarded``: the names passed on)."""
        raise NotImplementedError

    async def infer_grpc(self, message: bytes | StreamedMessage, model: str, version: str, timeout: float | None,
                         affinity: str | None, metadata: tuple[tuple[str, str], ...],
                         sink: AnswerSink | None = None, tried: int = 0) -> bytes:
        """A gRPC client's inference (DataPlane.infer_grpc): ``sink``, where the answer may be
        streamed as it arrives (a backend that cannot ignores it); ``tried``: attempts made
        already (Again.tried)."""
        raise NotImplementedError

    def infer_stream(self, requests: AsyncIterator[bytes], model: str, version: str, timeout: float | None,
                     affinity: str | None, metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[bytes]:
        raise NotImplementedError

    async def config_http(self, model: str, version: str) -> HttpReply:
        """Triton's model configuration as HTTP ``/config`` answers it (JSON)."""
        raise NotImplementedError

    async def config_grpc(self, message: bytes, model: str, version: str, timeout: float | None) -> bytes:
        """Triton's ModelConfig RPC: serialized ModelConfigRequest in, ModelConfigResponse out."""
        raise NotImplementedError

    async def endpoint_stats(self, ep: E, model: str, version: str, timeout: float | None) -> tuple[bytes, str]:
        """One endpoint's statistics for ``model`` (all models when ""), as it answered:
        (body, "json") from HTTP ``/stats``, (message, "pb") from gRPC ModelStatistics."""
        raise NotImplementedError

    async def statistics(self, model: str, version: str, timeout: float | None) -> list[tuple[bytes, str]]:
        """Every endpoint's statistics (see endpoint_stats), asked at once. An endpoint that
        fails is left out (a pod that is gone has no statistics to add); when none answers,
        the first failure is raised."""
        results = await self.each_endpoint(lambda ep: self.endpoint_stats(ep, model, version, timeout))
        if not results:
            raise NoEndpointAvailable(f"backend '{self.name}' has no endpoints to ask for statistics")
        answers = [answer for _, answer, err in results if err is None and answer is not None]
        if not answers:
            first = next(err for _, _, err in results if err is not None)
            raise first
        return answers

    async def endpoint_settings(self, ep: E, kind: str, model: str,
                                request: tuple[str, bytes | None]) -> tuple[str, bytes]:
        """Triton's trace (``kind`` "trace"; per model when ``model``) or log ("log")
        settings on one endpoint. ``request`` is the client's form: ("json", HTTP body, or
        None for a GET) or ("pb", serialized TraceSettingRequest / LogSettingsRequest);
        the answer comes back in the same form."""
        raise NotImplementedError

    async def each_endpoint(self, call: Callable[[E], Awaitable[T]]) -> list[tuple[E, T | None, GatewayError | None]]:
        """``call`` on every endpoint of the backend at once (model control, statistics,
        settings): (endpoint, answer, None) or (endpoint, None, error) for each."""
        async def one(ep: E) -> tuple[E, T | None, GatewayError | None]:
            try:
                return ep, await call(ep), None
            except Refused as refused:
                return ep, None, refused.error
            except GatewayError as exc:
                return ep, None, exc

        return list(await asyncio.gather(*(one(ep) for ep in list(self.endpoints.values()))))

    async def repository_http(self, action: str, model: str, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        """Triton's model control over HTTP (``load`` / ``unload``), sent to every endpoint."""
        raise NotImplementedError

    async def repository_grpc(self, rpc: str, model: str, message: bytes, timeout: float | None,
                              metadata: tuple[tuple[str, str], ...]) -> bytes:
        """Triton's model control over gRPC (RepositoryModelLoad / Unload), to every endpoint."""
        raise NotImplementedError

    async def control(self, ep: E, action: str, model: str, timeout: float) -> None:
        """``action`` ("load" or "unload") ``model`` on one endpoint (the V2 repository extension,
        over the backend's protocol, with the ``check_headers`` credentials): placement's call.
        Triton answers a load once the model is ready, an unload at once. Raises the
        endpoint's error (a GatewayError; an unreachable endpoint's too)."""
        raise NotImplementedError

    def combined(self, action: str, model: str, outcomes: Sequence[tuple[E, GatewayError | None]]) -> None:
        """Model control on every endpoint: succeeds when all did; else the first failure's
        status, with a message naming every endpoint that failed and why."""
        failed = [(ep, err) for ep, err in outcomes if err is not None]
        if not outcomes:
            raise NoEndpointAvailable(f"backend '{self.name}' has no endpoints to {action} '{model}' on")
        if failed:
            first = failed[0][1]
            assert first is not None
            detail = "; ".join(f"{ep.address}: {err.message}" for ep, err in failed)
            raise UpstreamError(f"{action} of '{model}' failed on {len(failed)} of {len(outcomes)} endpoints "
                                f"of backend '{self.name}': {detail}", http_status=first.http_status,
                                grpc_code=first.grpc_code)

    async def generate(self, model: str, version: str, body: bytes, headers: Mapping[str, str],
                       forwarded: Sequence[str], stream: bool) -> HttpReply:
        """Triton's generate extension (``stream``: generate_stream), JSON ``body`` in; the
        answer JSON, or server-sent events of unknown length (backends/generate.py)."""
        raise NotImplementedError
