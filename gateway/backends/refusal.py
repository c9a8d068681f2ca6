"""What a failed attempt on an endpoint says, read the same way for every backend kind.

- :class:`Refused`: an attempt that failed before any inference could have run, so another
  endpoint may take the request (``Backend.attempt`` retries it); its ``kind`` says what it tells
  of the endpoint;
- :func:`is_not_ready_message`: the words by which servers say they lack a model;
- :func:`refusal_for`: whether an endpoint's error answer is such a refusal (``Backend.refusal``);
- :func:`retry_allowed`: whether a refused request may go on to another endpoint: retries left
  and the retry budget allowing (``Backend.retries_after``);
- :func:`count_transport_failure`: a transport failure counted towards the endpoint's passive
  ejection (``Backend.transport_failed``).

``Backend`` (base.py) applies them with its own state (name, spec, endpoints, retry budget,
events). They are on the path of every failed request: compiled with it (setup.py).
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection
from typing import Final

from ..config.schema import Outlier
from ..errors import GatewayError, ModelNotReady
from ..routing.retry import RetryBudget
from .endpoints import Endpoint

__all__ = ["Refused", "always_resendable", "count_transport_failure", "is_not_ready_message", "refusal_for",
           "retry_allowed"]

log = logging.getLogger("oip_gateway.backend")

# How servers say "I do not have this model (yet)": Triton "Request for unknown model",
# "... has no available versions", "... is not ready"; MLServer "Model x not found";
# OVMS "Model with requested name is not found", "... version is not loaded yet".
_NOT_READY = re.compile(
    r"unknown model|model\b.{0,200}\b(not found|not ready|no available version|not loaded|is unavailable)",
    re.IGNORECASE | re.DOTALL)


def is_not_ready_message(message: str) -> bool:
    return _NOT_READY.search(message) is not None


def always_resendable() -> bool:
    """The ``resendable`` of a request kept whole: it may always be sent again."""
    return True


class Refused(Exception):
    """An attempt that failed before any inference could have run: another endpoint may
    take the request. ``error`` is what the client gets if none does. ``kind``:
    TRANSPORT (unreachable or reset: counted for ejection, no traffic until seen live),
    NOT_READY (the model is not there: none of its traffic until a check sees it), or
    BUSY (the server refused it for now, e.g. Triton's queue is full)."""

    TRANSPORT: Final = "transport"
    NOT_READY: Final = "not_ready"
    BUSY: Final = "busy"

    def __init__(self, error: GatewayError, *, kind: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind = kind


def refusal_for(ep: Endpoint, model: str, version: str, error: GatewayError, resendable: bool, backend: str,
                placing: bool) -> Exception:
    """What to raise for an error answer of ``ep`` (an endpoint of backend ``backend``): a
    :class:`Refused` (retry elsewhere) when it says "unknown model / not ready" and the checker
    thought the model ready there — or, in a placement pool (``placing``), its repository has the
    model (the index lists it): it was unloaded under the request, which may then be placed again
    (proxy.py) — ModelNotReady when such a request cannot be resent; else ``error`` itself."""
    if not is_not_ready_message(error.message) or not (
            ep.health.ready_exactly(model, version) or (placing and ep.health.lists(model))):
        return error
    if not resendable:
        ep.health.not_ready(model, version)
        return ModelNotReady(f"model '{model}' is not ready on endpoint {ep.address} of backend "
                             f"'{backend}' ({error.message}); the request could not be resent")
    return Refused(ModelNotReady(f"model '{model}' is not ready on backend '{backend}': {error.message}"),
                   kind=Refused.NOT_READY)


def retry_allowed(others: int, retries: int, budget: RetryBudget, on_event: Callable[[str], None]) -> bool:
    """Whether a request refused on its first endpoint goes to one of the ``others`` next:
    ``retries`` (the backend's) left and the retry ``budget`` allowing, counted in ``on_event``
    as ``Backend.attempt`` counts them."""
    if others <= 0 or retries <= 0:
        return False
    if not budget.allows():
        on_event("retry_budget_exhausted")
        return False
    on_event("retry")
    return True


def count_transport_failure(ep: Endpoint, endpoints: Collection[Endpoint], outlier: Outlier, backend: str,
                            on_event: Callable[[str], None], live: bool) -> None:
    """A transport failure on ``ep``, one of ``endpoints`` (those of backend ``backend``): counted
    for ejection by the ``outlier`` rules, an ejection told to ``on_event``; ``live=False`` (the
    connection was refused) also stops traffic to it until the checker sees it live."""
    if not live:
        ep.health.set_live(False)
    now = time.monotonic()
    ejected = sum(1 for e in endpoints if e.health.ejected_until is not None)
    if ep.health.failed(outlier, now, outlier.may_eject(ejected, len(endpoints))):
        on_event("ejection")
        log.warning("backend '%s': endpoint %s ejected for %.0f s after %d consecutive failures",
                    backend, ep.address, ep.health.ejected_until - now,  # type: ignore[operator]
                    outlier.consecutive_failures)
