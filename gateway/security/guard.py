"""Who may call what, and how often: the gateway's one admission check before routing.

Both front ends ask :meth:`Guard.admit` with the kind of call, the model (if any) and
the client's ``Authorization`` value (HTTP header or gRPC metadata), before anything
is sent on. Kinds:

- ``open``: health (liveness/readiness probes never need a credential);
- ``metadata``: server/model metadata, model readiness, config, statistics, the
  repository index — a credential only with ``auth.protect_metadata``;
- ``infer``: inference and generate — a credential when the route needs one
  (``routes[].auth``, default: yes once ``auth`` is configured), then the rate limits;
- ``control``: model load/unload, trace and log settings — always a credential that
  allows control (when ``auth`` is configured).

A credential that may not use the model is refused with 403 / PERMISSION_DENIED. Rate
limits (429 / RESOURCE_EXHAUSTED with Retry-After): the credential's bucket and the
route's per-model bucket; a request takes a token from each only when both have one.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from ..config.schema import GatewayConfig
from ..errors import ModelNotFound, PermissionDenied, RateLimited, Unauthenticated
from ..routing.table import Match, RouteTable
from .bucket import Buckets, retry_after
from .credentials import JwtVerifier, KeyRing, Principal, bearer

__all__ = ["CONTROL", "INFER", "METADATA", "OPEN", "Gate", "Guard", "guard_for"]

OPEN, METADATA, INFER, CONTROL = "open", "metadata", "infer", "control"


class Guard:
    def __init__(self, config: GatewayConfig, table: RouteTable, previous: Guard | None = None) -> None:
        auth = config.auth
        self.table = table
        self.auth = auth is not None
        self.protect_metadata = auth is not None and auth.protect_metadata
        self.keys = KeyRing(auth.keys if auth is not None else ())
        self.jwt = JwtVerifier(auth.jwt) if auth is not None and auth.jwt is not None else None
        # Buckets survive a reload: a config change must not hand every client a fresh burst.
        self.principal_buckets: Buckets = previous.principal_buckets if previous is not None else Buckets()
        self.model_buckets: Buckets = previous.model_buckets if previous is not None else Buckets()

    def authenticate(self, authorization: str | None) -> Principal:
        token = bearer(authorization)
        found = self.keys.find(token) if self.keys else None
        if found is not None:
            return found
        if self.jwt is not None and token.count(".") == 2:
            return self.jwt.verify(token)
        raise Unauthenticated("invalid credential")

    def admit(self, kind: str, model: str, version: str, authorization: str | None,
              headers: Mapping[str, str] | None = None) -> str | None:
        """Raise Unauthenticated / PermissionDenied / RateLimited, or return the caller's
        name (None: anonymous) for the access log."""
        if kind == OPEN:
            return None
        if kind == METADATA:
            if not self.protect_metadata:
                return None
            principal = self.authenticate(authorization)
            if model and not principal.may_use(model):
                raise PermissionDenied(f"{principal.name} may not use model '{model}'")
            return principal.name
        if kind == CONTROL:
            if not self.auth:
                return None
            principal = self.authenticate(authorization)
            if not principal.control:
                raise PermissionDenied(f"{principal.name} may not use model control or settings")
            if model and not principal.may_use(model):
                raise PermissionDenied(f"{principal.name} may not use model '{model}'")
            return principal.name
        # Inference: the route decides whether a credential is needed and how fast it may go.
        try:
            match: Match | None = self.table.resolve(model, version, headers)
        except ModelNotFound:
            match = None  # the proxy answers 404 — to a caller that passed the checks below
        caller: Principal | None = None
        if self.auth and (match is None or match.auth is not False):
            caller = self.authenticate(authorization)
            if not caller.may_use(model):
                raise PermissionDenied(f"{caller.name} may not use model '{model}'")
        self._rate(caller, match, model)
        return caller.name if caller is not None else None

    def _rate(self, principal: Principal | None, match: Match | None, model: str) -> None:
        mine = route = None
        now = time.monotonic()
        if principal is not None and principal.rate is not None:
            mine = self.principal_buckets.get(principal.name, principal.rate, now)
        if match is not None and match.rate is not None:
            route = self.model_buckets.get((match.label, model), match.rate, now)
        if mine is None and route is None:
            return
        for bucket, whose in ((mine, principal.name if principal is not None else ""), (route, f"model '{model}'")):
            if bucket is not None and (wait := bucket.wait(now)) > 0.0:
                raise RateLimited(f"rate limit of {whose} reached ({bucket.rate.per_s:g}/s, burst "
                                  f"{bucket.rate.burst}): retry later", retry_after(wait))
        if mine is not None:
            mine.take()
        if route is not None:
            route.take()


class Gate:
    """The front ends' hold on the current :class:`Guard`: one object for the process's life,
    whose guard a reload replaces (``current``; None: an open gateway, nothing checked)."""

    __slots__ = ("current",)

    def __init__(self, current: Guard | None = None) -> None:
        self.current = current


def guard_for(config: GatewayConfig, table: RouteTable, previous: Guard | None = None) -> Guard | None:
    """A Guard when the config asks for one (an ``auth`` section or a route's ``rate``);
    None otherwise, so an open gateway pays nothing per request."""
    if config.auth is None and not any(r.rate is not None for r in config.routes):
        return None
    return Guard(config, table, previous)
