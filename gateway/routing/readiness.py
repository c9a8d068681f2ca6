"""Per-endpoint health: liveness, which models are ready there, passive outlier
ejection. Pure state, no I/O: the health checker (``backends/health.py``) and the
backends' calls write it, endpoint choice reads it.

Why per endpoint and per model: a Triton pod that restarts opens its ports and
answers server-live long before its models are loaded; a backend that only knows
"live" sends it requests that come back "unknown model". An endpoint takes a
model's traffic only once a check has seen that model ready on it.

Two sources of model readiness:

- a repository index (Triton's ``POST /v2/repository/index``, gRPC
  ``RepositoryIndex``): every model of the endpoint's repository with its state,
  one call per endpoint per round. ``names`` holds every model the index lists
  (ready or not), so a model the fleet has but cannot serve now is told apart
  from one no endpoint has ever heard of;
- per-model ready calls (MLServer or OVMS when the index is refused): only the
  routed exact models, kept in ``per_model``.

Liveness is decided, not copied from each check (Envoy's ``unhealthy_threshold`` /
``healthy_threshold``): a live endpoint goes down after ``unhealthy`` consecutive
failed checks, a down one comes up after ``healthy`` consecutive good ones, and
the first check of a new endpoint decides at once (:meth:`EndpointHealth.checked`).
A busy server whose health answer misses one round keeps its traffic; inference
that succeeds on it (``succeeded``) clears its failed checks too — live traffic is
evidence of liveness (it keeps an endpoint up, it never brings one up). A refused
connection on live traffic still takes the endpoint out at once (``set_live``): a
process that is gone is not slow. A repository index that does not come keeps the
last one known for as many rounds (:meth:`EndpointHealth.index_missing`).

Outlier ejection (Envoy's consecutive-gateway-failure detector): ``failures``
consecutive transport failures eject the endpoint for ``base_s`` times the number
of times it has been ejected (capped), as long as no more than the allowed share of
the backend is ejected. When the time is up the endpoint stays out until the health
checker next finds it live (``readmit``).

A model the gateway has just loaded here (``placed``) is ready at once, and a check
asked before that load ended does not take it back: such an answer can arrive after
the load's (an index read while Triton was loading it lists it UNAVAILABLE). Each
answer carries the time its call was sent; placements made after it stand.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.schema import Outlier

__all__ = ["EndpointHealth", "Generation", "Index", "Ready"]

# (model, version) — version "" means "no particular version".
ModelKey = tuple[str, str]

# Triton's index states of a model that holds memory besides READY.
_HOLDING = frozenset({"LOADING", "UNLOADING"})


class Ready:
    """Answers of :meth:`EndpointHealth.ready_for`."""

    YES = 1
    NO = 0
    UNKNOWN = -1  # nothing checked says (a glob-routed model on an endpoint without an index)


class Generation:
    """A counter shared by the endpoints of one backend, bumped whenever anything that
    decides where a request may go changes: the backend caches its choice per model
    until it moves (the hot path does not re-derive it per request)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Index:
    """A repository index as read: the answer's bytes and what they say. Immutable, so
    endpoints whose answers are byte-identical (every pod of one deployment, usually) share one
    (backends/health.py keeps them by their bytes): a fleet's model state costs one index per
    distinct answer, not one per endpoint, and an answer identical to the last costs a
    comparison of bytes, not a parse."""

    __slots__ = ("_held", "changing", "listed", "names", "raw", "ready", "ready_names", "unloading")

    def __init__(self, raw: bytes, entries: Sequence[Sequence[Any]]) -> None:
        self.raw = raw
        intern = sys.intern
        self.names: frozenset[str] = frozenset(intern(e[0]) for e in entries)
        self.ready: frozenset[ModelKey] = frozenset((intern(e[0]), e[1]) for e in entries if e[2])
        self.listed: frozenset[ModelKey] = frozenset((intern(e[0]), e[1]) for e in entries)
        self.ready_names: frozenset[str] = frozenset(name for name, _ in self.ready)
        # Loading or unloading: they take the server's memory too (Triton frees an unloaded
        # model's memory only when UNLOADING ends). Usually none.
        self.changing: frozenset[str] = frozenset(e[0] for e in entries if len(e) > 3 and e[3] in _HOLDING)
        self.unloading: frozenset[str] = frozenset(e[0] for e in entries if len(e) > 3 and e[3] == "UNLOADING") \
            if self.changing else frozenset()
        self._held: frozenset[str] | None = None

    @property
    def held(self) -> frozenset[str]:
        """The models that take the server's memory: ready, loading or unloading (placement
        counts them against an endpoint's capacity)."""
        held = self._held
        if held is None:
            held = self._held = self.ready_names | self.changing
        return held

    def with_ready(self, model: str) -> Index:
        """This index with ``model`` ready in every version it is asked for (an endpoint's own
        copy: the gateway has just loaded it there, before a check has read the index again)."""
        other = Index.__new__(Index)
        other.raw = b""
        other.changing = self.changing
        other.unloading = self.unloading
        other.names = self.names | {model}
        other.listed = self.listed
        other.ready = self.ready
        other.ready_names = self.ready_names | {model}
        other._held = self.held | {model}
        return other

    def without(self, model: str) -> Index:
        """This index with ``model`` not ready (an endpoint's own copy: it answered "not ready").
        No bytes: the next answer read, whatever it says, replaces it."""
        other = Index.__new__(Index)
        other.raw = b""
        other.changing = self.changing
        other.unloading = self.unloading
        other.names = self.names
        other.listed = self.listed
        other.ready = frozenset(k for k in self.ready if k[0] != model)
        other.ready_names = self.ready_names - {model}
        other._held = None  # (ready_names | changing, computed when asked: one answer whatever was cached)
        return other


@dataclass(slots=True)
class EndpointHealth:
    # None until the first check: a new endpoint takes no traffic before it is checked.
    live: bool | None = None
    # From the repository index: every listed name, and the ready (model, version) pairs.
    # None while the endpoint has no index (never fetched, refused, or not live).
    index: Index | None = None
    # From per-model ready calls (no index): (model, route version or "") -> ready.
    per_model: dict[ModelKey, bool] = field(default_factory=dict)
    # The models were checked since the server was last seen coming up: until then
    # nothing is ready here (a restarted pod answers live before it has loaded anything).
    models_checked: bool = False
    # Active check counts (thresholds): failed checks in a row while live, good ones in a
    # row while down, rounds in a row the index did not come while one is known.
    check_failures: int = 0
    check_passes: int = 0
    index_misses: int = 0
    # Passive outlier state.
    failures: int = 0
    ejections: int = 0
    # model -> monotonic time the gateway's load of it here ended (``placed``); an answer of a
    # check sent before then does not mark it not ready.
    placed_at: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    ejected_until: float | None = None  # monotonic time; stays set past it until readmitted
    gen: Generation = field(default_factory=Generation, repr=False, compare=False)

    # -- checker side -----------------------------------------------------------------
    def set_live(self, live: bool) -> None:
        """The decided liveness (a threshold reached, a first check, or a refused connection).
        A server that was down (or never seen) and is up again is a new process: everything
        known about its models is forgotten until checked again."""
        if live and self.live is not True:
            self.forget_models()
        if not live and self.live is not False:
            self.forget_models()
        self.live = live
        self.check_failures = 0
        self.check_passes = 0

    def checked(self, ok: bool, unhealthy: int, healthy: int) -> None:
        """One liveness check's outcome through the thresholds: a live endpoint goes down
        on the ``unhealthy``-th failed check in a row, a down one comes up on the
        ``healthy``-th good one in a row; the first check of a new endpoint decides at once
        (Envoy's initial health check). A check that goes the way of the decided state
        clears the count towards the other."""
        if self.live is None:
            self.set_live(ok)
        elif ok:
            self.check_failures = 0
            if not self.live:
                self.check_passes += 1
                if self.check_passes >= healthy:
                    self.set_live(True)
        else:
            self.check_passes = 0
            if self.live:
                self.check_failures += 1
                if self.check_failures >= unhealthy:
                    self.set_live(False)

    def forget_models(self) -> None:
        self.gen.n += 1
        self.models_checked = False
        self.index_misses = 0
        self.index = None
        self.per_model.clear()
        self.placed_at.clear()

    @property
    def names(self) -> frozenset[str] | None:
        """Every model the index lists (ready or not); None without an index."""
        return self.index.names if self.index is not None else None

    def set_index(self, entries: Sequence[Sequence[Any]]) -> None:
        """A repository index: (name, version, ready, …) per entry."""
        self.set_index_state(Index(b"", entries))

    def set_index_state(self, index: Index, asked_at: float | None = None) -> None:
        """A repository index read (shared with the endpoints that answered the same bytes),
        asked for at monotonic ``asked_at`` (None: now)."""
        self.index_misses = 0
        if self.placed_at:
            index = self._keep_placed(index, asked_at)
        now = self.index
        if now is index and self.models_checked:
            return  # the same as last round: what is cached stays valid
        if (now is not None and self.models_checked and now.names == index.names and now.ready == index.ready
                and now.listed == index.listed and now.ready_names == index.ready_names):
            self.index = index  # other bytes, the same models: nothing to invalidate
            return
        self.gen.n += 1
        self.index = index
        self.models_checked = True

    def _keep_placed(self, index: Index, asked_at: float | None) -> Index:
        """``index`` with the models placed here after it was asked for still ready; the
        placements it is as new as are forgotten (it decides for them from now on)."""
        for model, t in list(self.placed_at.items()):
            if asked_at is None or t <= asked_at:
                del self.placed_at[model]
            elif model not in index.ready_names:
                index = index.with_ready(model)
        return index

    def index_missing(self, unhealthy: int) -> bool:
        """The index did not come this round (no answer, an error, an unreadable one). True
        while the last index known is kept: until ``unhealthy`` rounds in a row miss it, as
        liveness — a busy server's slow round does not flip its models to per-model calls
        (or to not ready). False: no index is known, or the threshold is reached (per-model
        calls decide from now on)."""
        if self.index is None:
            return False
        self.index_misses += 1
        return self.index_misses < unhealthy

    def set_no_index(self) -> None:
        """The endpoint has no index (any more): per-model checks decide — and until they have
        asked every model, a model not asked is not ready here (it was known from the index)."""
        if self.index is not None:
            self.gen.n += 1
            self.index = None
            self.models_checked = False

    def set_models_checked(self) -> None:
        if not self.models_checked:
            self.gen.n += 1
            self.models_checked = True

    def set_model(self, key: ModelKey, ready: bool, asked_at: float | None = None) -> None:
        """A per-model ready call's answer, asked at monotonic ``asked_at`` (None: now)."""
        placed = self.placed_at.get(key[0])
        if placed is not None:
            if asked_at is not None and placed > asked_at:
                return  # asked before the gateway's load here ended: that load's answer stands
            del self.placed_at[key[0]]  # (asked after it: this answer decides)
        if self.per_model.get(key) is not ready:
            self.gen.n += 1
        self.per_model[key] = ready

    def readmit(self, now: float) -> None:
        """The checker found the endpoint live: an ejection whose time is up ends."""
        if self.ejected_until is not None and now >= self.ejected_until:
            self.gen.n += 1
            self.ejected_until = None

    # -- request side -----------------------------------------------------------------
    def ready_for(self, model: str, version: str) -> int:
        index = self.index
        if index is not None:
            if version:
                if (model, version) in index.ready:
                    return Ready.YES
                # Loaded here by the gateway since the index was read: its versions are not known
                # yet; the server answers for a version it lacks.
                return Ready.YES if model in index.ready_names and not any(
                    k[0] == model for k in index.ready) else Ready.NO
            return Ready.YES if model in index.ready_names else Ready.NO
        state = self.per_model.get((model, version))
        if state is None and version:
            state = self.per_model.get((model, ""))  # checked without a version: any version
        if state is None:
            # Unknown — unless the models have not been checked since the server came up.
            return Ready.UNKNOWN if self.models_checked else Ready.NO
        return Ready.YES if state else Ready.NO

    def lists(self, model: str) -> bool:
        """The endpoint's index names ``model`` (in any state: its repository has it)."""
        index = self.index
        return index is not None and model in index.names

    def ready_exactly(self, model: str, version: str) -> bool:
        """A check saw this very version (or, without one, the model) ready here — not
        inferred from a check of another version."""
        index = self.index
        if index is not None:
            return (model, version) in index.ready if version else model in index.ready_names
        return self.per_model.get((model, version)) is True

    def lacks_version(self, model: str, version: str) -> bool:
        """The index has ``model`` ready in some version but does not list ``version`` at
        all: a version the server does not have (or not even a number), not one loading —
        the server answers such a request in its own words."""
        index = self.index
        return index is not None and model in index.ready_names and (model, version) not in index.listed

    def knows(self, model: str) -> bool:
        """The endpoint's index lists ``model`` (ready or not) or it was checked by name."""
        if self.index is not None:
            return model in self.index.names
        return any(m == model for m, _ in self.per_model)

    def usable(self) -> bool:
        """Live and not ejected. No clock: an ejection ends only through ``readmit`` (so
        what it answers changes only with ``gen``, and can be cached)."""
        return self.live is True and self.ejected_until is None

    def not_ready(self, model: str, version: str) -> None:
        """The endpoint answered "unknown model / not ready" although a check said ready:
        stop sending it the model until a check says otherwise."""
        self.gen.n += 1
        self.placed_at.pop(model, None)
        if self.index is not None:
            self.index = self.index.without(model)
        for key in [k for k in self.per_model if k[0] == model]:
            self.per_model[key] = False
        if (model, version) not in self.per_model and self.index is None:
            self.per_model[(model, version)] = False

    def placed(self, model: str, now: float) -> None:
        """The gateway loaded ``model`` here and the server said it is ready (at monotonic
        ``now``): traffic may come at once, before the next check reads the index — and a check
        asked before then does not take it back (the first one asked after decides)."""
        if len(self.placed_at) >= 4096:  # (bounded whatever a repository holds)
            self.placed_at.clear()
        self.placed_at[model] = now
        if self.index is not None:
            if model not in self.index.ready_names:
                self.gen.n += 1
                self.index = self.index.with_ready(model)
        elif self.per_model.get((model, "")) is not True:
            # No index read yet (or none at all): per-model state says it, as a ready call would.
            self.gen.n += 1
            self.per_model[(model, "")] = True

    def succeeded(self) -> None:
        """Traffic that succeeded: clears the outlier count and the failed checks (live
        traffic is evidence of liveness). It does not bring a down endpoint up."""
        self.failures = 0
        self.check_failures = 0

    def failed(self, outlier: Outlier, now: float, may_eject: bool) -> bool:
        """A transport failure (refused, reset, 502 from the hop). True when it ejects."""
        self.failures += 1
        if self.failures < outlier.consecutive_failures or self.ejected_until is not None or not may_eject:
            return False
        self.gen.n += 1
        self.ejections += 1
        self.failures = 0
        self.ejected_until = now + min(outlier.base_ejection_s * self.ejections, outlier.max_ejection_s)
        return True
