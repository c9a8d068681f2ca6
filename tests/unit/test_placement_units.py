"""Placement below the network (gateway/backends/{placement,holds,capacity}.py,
gateway/routing/readiness.py): the index's ``held`` / ``changing`` / ``with_ready`` / ``without``,
``EndpointHealth.placed``, ``Holds`` (the bounded per-model queue), ``Usage`` (Triton's
statistics), ``Room`` (capacity in models and bytes) and the ``Placer``'s
decisions against ``Pool``, an in-memory stand-in for a pool of Tritons in explicit mode: its
``control`` loads and unloads models in a per-endpoint state (LOADING, READY, UNLOADING),
publishes each endpoint's repository index as the health checker would, answers statistics as
Triton's ``/v2/models/stats`` JSON, and records every call and every rule a call broke
(capacity; a load of a model READY there)."""
from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import orjson
import pytest

from gateway._pb import triton_extensions_pb2 as tx
from gateway.backends import placement as placement_mod
from gateway.backends.base import Backend
from gateway.backends.endpoints import Endpoint
from gateway.backends.capacity import Room, Usage
from gateway.backends.holds import Holds
from gateway.backends.placement import Placer
from gateway.backends.refusal import Refused
from gateway.codec.repository import IndexEntry
from gateway.config.backends import BackendSpec, Placement
from gateway.config.network import HostPort
from gateway.errors import BadUpstreamResponse, ModelNotReady, UpstreamError
from gateway.routing.readiness import EndpointHealth, Index, Ready
from gateway.routing.rendezvous import rank

A, B, C = HostPort("10.0.0.1", 8001), HostPort("10.0.0.2", 8001), HostPort("10.0.0.3", 8001)
REPO = [f"m{i:02d}" for i in range(12)] + ["broken"]
ROUTE = "*"


# ------------------------------------------------------------------------------------ the stand-in


class Ep(Endpoint):
    @property
    def inflight(self) -> int:
        return 0

    async def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<ep {self.address}>"


class Events:
    """PlacementEvents, recorded."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.held_for: list[tuple[str, float]] = []
        self.refusals: list[tuple[str, str]] = []

    def loaded(self, backend: str, outcome: str, seconds: float) -> None:
        self.loads.append(outcome)

    def unloaded(self, backend: str, reason: str) -> None:
        self.unloads.append(reason)

    def held(self, route: str, backend: str, seconds: float) -> None:
        self.held_for.append((route, seconds))

    def hold_refused(self, route: str, backend: str, reason: str) -> None:
        self.refusals.append((route, reason))


class Pool(Backend[Ep]):
    """Tritons in explicit mode sharing ``repo``, in memory. ``capacity``: what each may hold
    (READY + LOADING, counted at every load: an UNLOADING model is the one overshoot allowed).
    Each change is published to the endpoint's index at once (``rounds=False``), or only when the
    test calls :meth:`round` (``rounds=True``: as the health checker reads indexes, once a round)."""

    protocol = "grpc"

    def __init__(self, spec: BackendSpec, *, capacity: int, repo: list[str] = REPO, load_s: float = 0.02,
                 unload_s: float = 0.0, rounds: bool = False) -> None:
        super().__init__(spec)
        self.capacity = capacity
        self.repo = list(repo)
        self.load_s = load_s
        self.unload_s = unload_s
        self.rounds = rounds
        self.state: dict[str, dict[str, str]] = {}
        self.last: dict[tuple[str, str], float] = {}  # (endpoint, model) -> ms since the epoch
        self.size: dict[str, int] = {}
        self.capacity_bytes = 0  # when not 0: READY + LOADING bytes checked at every load, as capacity
        self.refuse = {"broken"}
        self.calls: list[tuple[str, str, str]] = []
        self.over_capacity: list[str] = []
        self.reloads: list[str] = []  # loads sent where the index (or the server) had the model READY
        self.stats_calls = 0
        self.stats_error: Exception | None = None

    def _make(self, address: HostPort) -> Ep:
        return Ep(address)

    # -- what a health round would write ---------------------------------------------------------
    def entries(self, addr: str) -> list[IndexEntry]:
        st = self.state.setdefault(addr, {})
        out = []
        for m in sorted({*self.repo, *st}):
            s = st.get(m)
            out.append(IndexEntry(m, "1", True, "READY") if s == "READY" else
                       IndexEntry(m, "1", False, s) if s else IndexEntry(m, "", False, ""))
        return out

    def publish(self, ep: Ep, now: bool = False) -> None:
        if now or not self.rounds:
            ep.health.set_index(self.entries(str(ep.address)))

    def round(self) -> None:
        """A health round: every endpoint's index read as the server has it now."""
        for ep in self.endpoints.values():
            self.publish(ep, now=True)

    def set_loaded(self, addr: HostPort, *models: str, state: str = "READY") -> None:
        st = self.state.setdefault(str(addr), {})
        for m in models:
            st[m] = state
        self.publish(self.endpoints[addr], now=True)

    def used(self, addr: HostPort, model: str, seconds_ago: float) -> None:
        self.last[(str(addr), model)] = (time.time() - seconds_ago) * 1000

    def loads(self, model: str | None = None) -> list[tuple[str, str]]:
        return [(a, m) for k, a, m in self.calls if k == "load" and (model is None or m == model)]

    def unloads(self) -> list[tuple[str, str]]:
        return [(a, m) for k, a, m in self.calls if k == "unload"]

    # -- Backend -----------------------------------------------------------------------------------
    async def control(self, ep: Ep, action: str, model: str, timeout: float) -> None:
        addr = str(ep.address)
        st = self.state.setdefault(addr, {})
        self.calls.append((action, addr, model))
        if action == "load":
            index = ep.health.index
            if (index is not None and model in index.ready_names) or st.get(model) == "READY":
                self.reloads.append(f"load of '{model}' on {addr} where it is READY")
            taking = {m for m, s in st.items() if s in ("READY", "LOADING")} | {model}
            if len(taking) > self.capacity:
                self.over_capacity.append(f"{addr}: {sorted(taking)} at the load of '{model}'")
            if self.capacity_bytes and sum(self.size.get(m, 0) for m in taking) > self.capacity_bytes:
                self.over_capacity.append(f"{addr}: {sorted(taking)} of {sum(self.size.get(m, 0) for m in taking)} "
                                          f"bytes at the load of '{model}'")
            if model not in self.repo or model in self.refuse:
                raise UpstreamError(f"failed to load '{model}', failed to poll from model repository",
                                    http_status=400, grpc_code="INVALID_ARGUMENT")
            if st.get(model) != "READY":
                st[model] = "LOADING"
                self.publish(ep)
                await asyncio.sleep(self.load_s)
            st[model] = "READY"
            self.publish(ep)
        elif action == "unload":
            if st.get(model) == "READY":
                if self.unload_s:
                    st[model] = "UNLOADING"

                    def gone() -> None:
                        if st.get(model) == "UNLOADING":
                            del st[model]
                            self.publish(ep)

                    asyncio.get_running_loop().call_later(self.unload_s, gone)
                else:
                    del st[model]
            self.publish(ep)
        else:
            raise AssertionError(action)

    async def check_model(self, ep: Ep, model: str, version: str, timeout: float) -> bool | None:
        """What the server itself says now (the index may be a round behind)."""
        return self.state.get(str(ep.address), {}).get(model) == "READY"

    async def endpoint_stats(self, ep: Ep, model: str, version: str, timeout: float | None) -> tuple[bytes, str]:
        self.stats_calls += 1
        if self.stats_error is not None:
            raise self.stats_error
        addr = str(ep.address)
        stats = [{"name": m, "version": "1", "last_inference": int(self.last.get((addr, m), 0)),
                  "inference_count": 0, "execution_count": 0,
                  "memory_usage": [{"type": "CPU", "id": 0, "byte_size": self.size.get(m, 0)}]}
                 for m, s in self.state.get(addr, {}).items() if s in ("READY", "UNLOADING")]
        return orjson.dumps({"model_stats": stats}), "json"


async def make(n: int = 3, *, capacity: int = 3, owns: Any = None, load_s: float = 0.02, unload_s: float = 0.0,
               rounds: bool = False, **placement: Any) -> tuple[Pool, Placer, Holds, Events]:
    """A started pool of ``n`` live endpoints with empty indexes, its Holds and Placer."""
    placement.setdefault("min_residency_s", 0)
    placement.setdefault("load_timeout_s", 3)
    spec = Placement(capacity_models=capacity, **placement)
    addrs = (A, B, C)[:n]
    pool = Pool(BackendSpec(name="pool", protocol="grpc", endpoints=addrs, placement=spec), capacity=capacity,
                load_s=load_s, unload_s=unload_s, rounds=rounds)
    await pool.start()
    for ep in pool.endpoints.values():
        ep.health.set_live(True)
        ep.health.set_index(pool.entries(str(ep.address)))
    events = Events()
    holds = Holds(pool, spec.queue, events, placing=True)
    placer = Placer(pool, spec, holds, events, owns or (lambda m: True))
    return pool, placer, holds, events


def order(model: str, *addrs: HostPort) -> list[str]:
    return rank(model, [str(a) for a in addrs])


async def request(placer: Placer, model: str) -> None:
    """What the proxy does for one request of a placement pool: in flight while held and sent."""
    holds = placer.holds
    holds.enter(model, ROUTE)
    try:
        if not holds.ready(model, ""):
            await placer.ensure(model, "", ROUTE)
    finally:
        holds.leave(model, ROUTE)


def idle(holds: Holds) -> None:
    """Nothing left behind: no waiting entry, no count per route, nothing in flight."""
    assert holds.waiting == {} and holds.by_route == {}, (holds.waiting, holds.by_route)
    assert holds.inflight == {} and holds.inflight_by_route == {}, (holds.inflight, holds.inflight_by_route)


# ------------------------------------------------------------------------------------ Index, health


def test_index_held_and_changing():
    index = Index(b"raw", [("r", "1", True, "READY"), ("l", "1", False, "LOADING"), ("u", "1", False, "UNLOADING"),
                           ("gone", "1", False, "UNAVAILABLE"), ("never", "", False, ""), ("short", "1", True)])
    assert index.ready_names == {"r", "short"}
    assert index.changing == {"l", "u"}
    assert index.held == {"r", "short", "l", "u"}
    assert index.held is index.held  # computed once
    assert index.names == {"r", "l", "u", "gone", "never", "short"}


def test_index_with_ready():
    base = Index(b"raw", [("a", "1", True, "READY"), ("b", "1", False, "UNAVAILABLE"), ("c", "1", False, "LOADING")])
    placed = base.with_ready("b")
    assert placed.ready_names == {"a", "b"} and placed.held == {"a", "b", "c"}
    assert placed.names == base.names and placed.changing == {"c"}
    assert placed.ready == base.ready  # its versions are not known until the next index
    assert placed.raw == b""  # never taken for the next answer's bytes
    new = base.with_ready("new")  # a model the index had not listed yet
    assert "new" in new.names and "new" in new.ready_names and "new" in new.held
    # The original is untouched (indexes are shared between endpoints).
    assert base.ready_names == {"a"} and base.held == {"a", "c"} and "new" not in base.names


def test_index_without():
    base = Index(b"raw", [("a", "1", True, "READY"), ("a", "2", True, "READY"), ("b", "1", True, "READY"),
                          ("c", "1", False, "LOADING")])
    gone = base.without("a")
    assert gone.ready_names == {"b"} and gone.ready == {("b", "1")}
    assert gone.names == base.names and gone.listed == base.listed  # still known: not ready
    assert gone.held == {"b", "c"} and gone.changing == {"c"}
    assert base.ready_names == {"a", "b"}
    assert base.without("nothing").ready_names == {"a", "b"}
    # with_ready then without: back where it was.
    assert base.with_ready("x").without("x").ready_names == base.ready_names


def test_index_without_keeps_a_changing_model_held_whatever_was_cached():
    entries = [("x", "1", True, "READY"), ("x", "2", False, "LOADING"), ("y", "1", True, "READY")]
    fresh = Index(b"", entries).without("x")
    cached = Index(b"", entries)
    assert cached.held == {"x", "y"}
    assert fresh.held == {"x", "y"}  # x takes memory while version 2 loads
    assert cached.without("x").held == fresh.held


def test_placed_marks_ready_until_the_next_index():
    health = EndpointHealth()
    health.set_live(True)
    health.set_index([("m", "", False, ""), ("other", "1", True, "READY")])
    assert health.ready_for("m", "") == Ready.NO
    gen = health.gen.n
    health.placed("m", 10.0)
    assert health.gen.n == gen + 1  # a cached choice moves
    assert health.ready_for("m", "") == Ready.YES
    # A version: the loaded model's versions are not known yet; the server answers for them.
    assert health.ready_for("m", "1") == Ready.YES
    assert health.ready_for("m", "7") == Ready.YES
    assert health.ready_exactly("m", "") and not health.ready_exactly("m", "1")
    assert "m" in health.index.held
    health.placed("m", 11.0)  # ready already: nothing moves
    assert health.gen.n == gen + 1
    # The next index asked after the load decides as always.
    health.set_index_state(Index(b"", [("m", "1", False, "UNAVAILABLE"), ("other", "1", True, "READY")]), 12.0)
    assert health.ready_for("m", "") == Ready.NO and health.ready_for("m", "1") == Ready.NO
    assert not health.placed_at


def test_placed_before_any_index_is_ready_at_once():
    """A load that ends before the endpoint's first index read: ready there (per-model state),
    until an index asked after the load says otherwise."""
    health = EndpointHealth()
    health.set_live(True)
    assert health.ready_for("m", "") == Ready.NO  # nothing checked since it came up
    gen = health.gen.n
    health.placed("m", 10.0)
    assert health.gen.n != gen
    assert health.ready_for("m", "") == Ready.YES and health.ready_for("m", "3") == Ready.YES
    assert health.ready_for("other", "") == Ready.NO
    health.set_index_state(Index(b"", [("m", "1", True, "READY")]), 11.0)
    assert health.ready_for("m", "1") == Ready.YES and health.ready_for("m", "2") == Ready.NO


def test_an_index_asked_before_the_load_ended_does_not_undo_it():
    """Triton's index read while it loads lists the model UNAVAILABLE; its answer can come after
    the load's. Asked before the load ended: the model stays ready. The next one asked after
    it decides — whatever it says."""
    health = EndpointHealth()
    health.set_live(True)
    before = [("m", "1", False, "LOADING"), ("other", "1", True, "READY")]
    health.set_index_state(Index(b"", before), 1.0)
    health.placed("m", 10.0)
    health.set_index_state(Index(b"", before), 9.5)  # asked at 9.5, answered after 10.0
    assert health.ready_for("m", "") == Ready.YES
    assert health.ready_for("other", "1") == Ready.YES
    assert "m" in health.index.held
    health.set_index_state(Index(b"", [("m", "1", False, "UNAVAILABLE")]), 10.5)  # unloaded since
    assert health.ready_for("m", "") == Ready.NO
    health.placed("m", 20.0)
    health.set_index_state(Index(b"", [("m", "1", True, "READY")]), 21.0)
    assert health.ready_for("m", "1") == Ready.YES and not health.placed_at


def test_a_model_call_asked_before_the_load_ended_does_not_undo_it():
    health = EndpointHealth()
    health.set_live(True)
    health.set_model(("m", ""), False, 1.0)
    health.placed("m", 10.0)
    assert health.ready_for("m", "") == Ready.YES
    health.set_model(("m", ""), False, 9.0)  # sent before the load ended
    assert health.ready_for("m", "") == Ready.YES
    health.set_model(("m", ""), False, 11.0)  # sent after: it decides
    assert health.ready_for("m", "") == Ready.NO and not health.placed_at


def test_not_ready_and_a_restart_forget_placements():
    health = EndpointHealth()
    health.set_live(True)
    health.set_index_state(Index(b"", [("m", "1", False, "UNAVAILABLE"), ("x", "1", True, "READY")]), 1.0)
    health.placed("m", 10.0)
    health.not_ready("m", "")  # the server answered "not ready" since
    health.set_index_state(Index(b"", [("m", "1", False, "UNAVAILABLE"), ("x", "1", True, "READY")]), 9.0)
    assert health.ready_for("m", "") == Ready.NO
    health.placed("m", 12.0)
    health.set_live(False)
    health.set_live(True)
    assert not health.placed_at and health.ready_for("m", "") == Ready.NO


def test_an_index_that_undoes_placed_moves_the_generation():
    health = EndpointHealth()
    health.set_live(True)
    entries = [("m", "", False, ""), ("other", "1", True, "READY")]
    health.set_index(entries)
    health.placed("m", 10.0)
    gen = health.gen.n
    health.set_index_state(Index(b"", entries), 11.0)  # asked after the load ended: m went since
    assert health.ready_for("m", "") == Ready.NO
    assert health.gen.n != gen


def test_placed_does_not_widen_a_model_already_ready_in_known_versions():
    health = EndpointHealth()
    health.set_live(True)
    health.set_index([("m", "1", True, "READY")])
    health.placed("m", 10.0)
    assert health.ready_for("m", "1") == Ready.YES
    assert health.ready_for("m", "2") == Ready.NO  # its versions are known: 2 is not ready


# ------------------------------------------------------------------------------------ Usage


def _stats_doc() -> dict[str, Any]:
    return {"model_stats": [
        {"name": "a", "version": "1", "last_inference": 1000, "inference_count": 3,
         "memory_usage": [{"type": "GPU", "id": 0, "byte_size": 100}, {"type": "CPU", "id": 0, "byte_size": 5}]},
        {"name": "a", "version": "2", "last_inference": 3000,
         "memory_usage": [{"type": "GPU", "id": 1, "byte_size": 50}]},
        {"name": "b", "version": "1", "last_inference": 0},
        {"name": "c", "version": "1", "last_inference": 1_700_000_000_000},
    ]}


def test_usage_from_triton_stats_json():
    usage = Usage.read(orjson.dumps(_stats_doc()), "json")
    assert usage.models == {"a": (3000, 155), "b": (0, 0), "c": (1_700_000_000_000, 0)}
    room = Room(10, 1000)
    assert room.used({"a", "b"}, usage) == 155
    assert room.used({"nothing", "c"}, usage) == 0
    assert Usage.read(b'{"model_stats": []}', "json").models == {}
    assert Usage.read(b"{}", "json").models == {}


def test_usage_from_model_statistics_protobuf():
    msg = tx.ModelStatisticsResponse()
    for s in _stats_doc()["model_stats"]:
        ms = msg.model_stats.add(name=s["name"], version=s["version"], last_inference=s["last_inference"])
        for u in s.get("memory_usage", []):
            ms.memory_usage.add(type=u["type"], id=u["id"], byte_size=u["byte_size"])
    usage = Usage.read(msg.SerializeToString(), "pb")
    assert usage.models == Usage.read(orjson.dumps(_stats_doc()), "json").models
    assert Usage.read(b"", "pb").models == {}


@pytest.mark.parametrize("answer", [b"not json", b"[1, 2]", b'{"model_stats": 5}', b""])
def test_usage_of_garbage_is_a_bad_upstream_response(answer: bytes):
    with pytest.raises(BadUpstreamResponse):
        Usage.read(answer, "json")


def test_usage_of_a_garbage_protobuf_is_a_bad_upstream_response():
    with pytest.raises(BadUpstreamResponse):
        Usage.read(b"\x0a\xff\xff\xff", "pb")


# ------------------------------------------------------------------------------------ Room


def test_room_counts_models_and_nothing_else_without_a_byte_limit():
    room = Room(2, 0)
    assert room.fits("x", {"a"}, None) and not room.fits("x", {"a", "b"}, None)
    assert not room.over({"a", "b", "c"}, None)  # (over by models is the index's business, not over())


def test_room_by_bytes_reported_or_remembered():
    room = Room(10, 300)
    usage = Usage({"a": (0, 100), "b": (0, 100), "loading": (0, 0)})
    room.learn(usage)
    room.learn(Usage({"loading": (0, 50), "new": (0, 100), "big": (0, 900)}))  # seen on another endpoint
    assert room.used({"a", "b", "loading"}, usage) == 250  # a LOADING model reports nothing yet: remembered
    assert room.fits("tiny", {"a", "b", "loading"}, usage)  # size unknown: fits while any room is left
    assert not room.fits("new", {"a", "b", "loading"}, usage)  # 250 + 100 > 300
    assert room.fits("new", {"a", "b"}, usage)  # exactly 300
    assert not room.fits("tiny", {"a", "b", "c"}, Usage({"a": (0, 100), "b": (0, 100), "c": (0, 100)}))
    # Larger than the limit alone: only on an empty endpoint.
    assert not room.fits("big", {"a"}, usage) and room.fits("big", set(), usage)
    assert room.over({"a", "b", "new", "loading"}, usage) and not room.over({"a", "b", "new"}, usage)
    assert Room(1, 300).fits("new", set(), None) and not Room(1, 300).fits("new", {"a"}, None)



# ------------------------------------------------------------------------------------ Holds


async def plain(queue: int = 2) -> tuple[Pool, Holds, Events]:
    """A backend without placement whose exact route 'm' is ready nowhere (a hold_s route)."""
    pool = Pool(BackendSpec(name="pool", protocol="grpc", endpoints=(A, B)), capacity=10)
    await pool.start()
    pool.routed = frozenset({"m", "n"})
    for ep in pool.endpoints.values():
        ep.health.set_live(True)
        ep.health.set_index([("m", "1", False, "UNAVAILABLE"), ("n", "1", False, "UNAVAILABLE")])
    events = Events()
    return pool, Holds(pool, queue, events), events


async def test_holds_queue_bound_refuses_with_retry_after():
    _, holds, events = await plain(queue=2)
    assert not holds.ready("m", "")
    waiters = [asyncio.create_task(holds.wait("m", "", "r1", 5)) for _ in range(2)]
    await asyncio.sleep(0)
    assert holds.waiting["m"].count == 2 and holds.by_route == {"r1": 2}
    with pytest.raises(ModelNotReady) as info:
        await holds.wait("m", "", "r2", 5)
    assert info.value.retry_after == 2
    assert "'m'" in info.value.message and "'pool'" in info.value.message and "bound" in info.value.message
    assert events.refusals == [("r2", "queue_full")]
    # Another model has its own queue.
    other = asyncio.create_task(holds.wait("n", "", "r2", 5))
    await asyncio.sleep(0)
    assert holds.by_route == {"r1": 2, "r2": 1}
    holds.wake("m")
    holds.wake("n")
    await asyncio.gather(*waiters, other)
    idle(holds)
    assert len(events.held_for) == 3
    # The bound is per moment, not per lifetime: two may wait again.
    again = [asyncio.create_task(holds.wait("m", "", "r1", 5)) for _ in range(2)]
    await asyncio.sleep(0)
    holds.wake("m")
    await asyncio.gather(*again)
    idle(holds)


async def test_holds_timeout():
    _, holds, events = await plain()
    start = time.monotonic()
    with pytest.raises(ModelNotReady) as info:
        await holds.wait("m", "", "r", 0.1, " (why)")
    assert 0.09 <= time.monotonic() - start < 1
    assert info.value.retry_after == 1 and "0.1 s" in info.value.message and "(why)" in info.value.message
    assert events.refusals == [("r", "timeout")]
    idle(holds)


async def test_holds_wake_with_an_error_reaches_every_waiter():
    _, holds, _ = await plain(queue=10)
    waiters = [asyncio.create_task(holds.wait("m", "", "r", 5)) for _ in range(5)]
    await asyncio.sleep(0)
    boom = UpstreamError("failed to load 'm'", http_status=400)
    holds.wake("m", boom)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(r is boom for r in results)
    idle(holds)
    holds.wake("m", boom)  # nobody waits: nothing happens, no warning
    holds.wake("never-waited")


async def test_holds_a_cancelled_waiter_leaves_no_trace():
    """A client that goes away while held (its task cancelled): its place is given back."""
    _, holds, _ = await plain(queue=1)
    waiter = asyncio.create_task(holds.wait("m", "", "r", 5))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    idle(holds)
    second = asyncio.create_task(holds.wait("m", "", "r", 5))  # the place is free again
    await asyncio.sleep(0)
    holds.wake("m")
    await second


async def test_holds_recheck_wakes_only_what_is_ready():
    pool, holds, _ = await plain(queue=5)
    m = asyncio.create_task(holds.wait("m", "", "r", 5))
    n = asyncio.create_task(holds.wait("n", "", "r", 5))
    await asyncio.sleep(0)
    holds.recheck()
    await asyncio.sleep(0)
    assert not m.done() and not n.done()
    pool.endpoints[B].health.set_index([("m", "1", True, "READY"), ("n", "1", False, "UNAVAILABLE")])
    holds.recheck()
    await m
    await asyncio.sleep(0.01)
    assert not n.done() and set(holds.waiting) == {"n"}
    holds.wake("n")
    await n
    idle(holds)


async def test_holds_enter_and_leave_count_back_to_empty():
    _, holds, _ = await plain()
    for model, route in [("m", "r1"), ("m", "r2"), ("n", "r1"), ("m", "r1")]:
        holds.enter(model, route)
    assert holds.inflight == {"m": 3, "n": 1} and holds.inflight_by_route == {"r1": 3, "r2": 1}
    for model, route in [("m", "r1"), ("n", "r1"), ("m", "r2"), ("m", "r1")]:
        holds.leave(model, route)
    idle(holds)


async def test_holds_ready_in_a_placement_pool():
    pool, _, holds, _ = await make(2)
    a, b = pool.endpoints[A], pool.endpoints[B]
    assert not holds.ready("m00", "")
    b.health.set_index([("m00", "1", True, "READY")])
    assert holds.ready("m00", "") and holds.ready("m00", "1")
    assert holds.ready("m00", "9")  # a version it lacks: the server answers for it
    b.health.set_live(False)  # ready on a down endpoint only: not ready
    assert not holds.ready("m00", "")
    a.health.set_index([("m00", "1", True, "READY")])
    assert holds.ready("m00", "")
    for i in range(5000):  # clients choose the names: the cache stays bounded
        holds.ready(f"x{i}", "")
    assert len(holds._ready) <= 4096


# ------------------------------------------------------------------------------------ Placer


async def test_one_load_per_model_under_50_concurrent_requests():
    pool, placer, holds, events = await make(3, load_s=0.1)
    await asyncio.gather(*(request(placer, "m01") for _ in range(50)))
    first = order("m01", A, B, C)[0]
    assert pool.loads() == [(first, "m01")]
    assert events.loads == ["ok"] and pool.unloads() == [] and not pool.reloads
    assert holds.ready("m01", "")
    idle(holds)
    # Ready now: more requests send nothing.
    await asyncio.gather(*(request(placer, "m01") for _ in range(10)))
    assert len(pool.loads()) == 1


async def test_one_load_per_copy_under_50_concurrent_requests():
    pool, placer, holds, _ = await make(3, load_s=0.1, copies=2)
    results = await asyncio.gather(*(placer.ensure("m02", "", ROUTE) for _ in range(50)), return_exceptions=True)
    assert all(r is None for r in results), results
    assert sorted(pool.loads()) == sorted((a, "m02") for a in order("m02", A, B, C)[:2])
    assert placer.copies("m02") == 2
    idle(holds)


async def test_capacity_never_exceeded_under_concurrent_churn():
    """12 models over 3 endpoints that hold 2 each, 10 clients at a time: at every load, no endpoint
    holds (READY + LOADING) more than 2."""
    pool, placer, holds, events = await make(3, capacity=2, load_s=0.01, load_timeout_s=3)
    rng = random.Random(40)
    sem = asyncio.Semaphore(10)
    outcomes: list[BaseException | None] = []

    async def one(model: str) -> None:
        async with sem:
            try:
                await request(placer, model)
                for addr in (A, B, C):
                    if pool.state.get(str(addr), {}).get(model) == "READY":
                        pool.used(addr, model, 0)
                outcomes.append(None)
            except ModelNotReady as exc:
                outcomes.append(exc)

    await asyncio.gather(*(one(rng.choice(REPO[:12])) for _ in range(240)))
    assert not pool.over_capacity, pool.over_capacity[:5]
    assert not pool.reloads, pool.reloads[:5]
    assert sum(o is None for o in outcomes) >= 200, [o for o in outcomes if o is not None][:3]
    assert pool.unloads() and set(events.unloads) == {"evict"}
    idle(holds)


async def test_capacity_holds_with_slow_unloads():
    """An unload takes 50 ms (UNLOADING, counted by the index): the evictions decided count as done."""
    pool, placer, holds, _ = await make(3, capacity=2, load_s=0.01, unload_s=0.05, load_timeout_s=3)
    rng = random.Random(7)
    sem = asyncio.Semaphore(6)

    async def one(model: str) -> None:
        async with sem:
            try:
                await request(placer, model)
            except ModelNotReady:
                pass

    await asyncio.gather(*(one(rng.choice(REPO[:12])) for _ in range(120)))
    assert not pool.over_capacity, pool.over_capacity[:5]
    idle(holds)


async def test_a_model_requested_again_while_unloading_does_not_overfill_its_endpoint():
    """Indexes as the health checker reads them (once a round), unloads that take a while (Triton:
    ~1.3 s). Capacity 2 on one endpoint: X and Z held; Y evicts X; W evicts Z; a round reads X and
    Z UNLOADING; then X is asked for again. Loading X there means evicting another model first:
    Y and W are READY and the endpoint holds 2."""
    pool, placer, holds, _ = await make(1, capacity=2, unload_s=30, rounds=True)
    pool.set_loaded(A, "m01", "m02")  # X = m01, Z = m02
    pool.used(A, "m01", 600)
    pool.used(A, "m02", 300)
    await request(placer, "m03")  # Y: evicts X
    assert pool.calls[-2:] == [("unload", str(A), "m01"), ("load", str(A), "m03")]
    await request(placer, "m04")  # W: evicts Z (Y was just loaded)
    assert pool.calls[-2:] == [("unload", str(A), "m02"), ("load", str(A), "m04")]
    pool.round()  # m01, m02 UNLOADING; m03, m04 READY
    await request(placer, "m01")
    assert not pool.over_capacity, pool.over_capacity
    idle(holds)


async def test_a_model_unloading_by_someone_else_is_not_loading_there():
    """Capacity 2: m03 and m04 READY, m01 UNLOADING (an operator's unload through the repository
    API). A request for m01 must find it a place like any other model, not reload it on top."""
    pool, placer, holds, _ = await make(1, capacity=2, unload_s=30, load_timeout_s=0.5)
    pool.set_loaded(A, "m03", "m04")
    pool.set_loaded(A, "m01", state="UNLOADING")
    for m in ("m03", "m04"):
        pool.used(A, m, 600)
    with contextlib.suppress(ModelNotReady):  # (no room while it unloads: a 503 is fine)
        await request(placer, "m01")
    assert not pool.over_capacity, pool.over_capacity
    await asyncio.sleep(0.3)
    idle(holds)


async def test_eviction_takes_the_least_recently_used_by_last_inference():
    pool, placer, holds, events = await make(1, capacity=3, min_residency_s=60)
    pool.set_loaded(A, "m01", "m02", "m03")
    # Load order says m01, name says m01: Triton's last_inference says m02.
    pool.used(A, "m01", 100)
    pool.used(A, "m02", 300)
    pool.used(A, "m03", 200)
    await request(placer, "m04")
    assert pool.calls == [("unload", str(A), "m02"), ("load", str(A), "m04")]
    assert events.unloads == ["evict"]
    assert pool.state[str(A)] == {"m01": "READY", "m03": "READY", "m04": "READY"}
    # Next: m03 (200 s), not m04 (just loaded: within min_residency_s).
    await request(placer, "m05")
    assert pool.unloads()[-1] == (str(A), "m03")
    idle(holds)


async def test_a_model_never_used_is_evicted_first():
    pool, placer, _, _ = await make(1, capacity=2, min_residency_s=60)
    pool.set_loaded(A, "m01", "m02")
    pool.used(A, "m01", 1000)  # m02: last_inference 0, loaded by someone long ago
    await request(placer, "m03")
    assert pool.unloads() == [(str(A), "m02")]


async def test_capacity_bytes_evicts_the_least_recently_used_until_the_model_fits():
    """capacity_bytes 300 (10 models): three of 100 held; m04 is known (from an earlier load) to
    take 200, so the two least recently used go before it loads — decided before either goes."""
    pool, placer, holds, events = await make(1, capacity=10, min_residency_s=60, capacity_bytes=300)
    pool.capacity_bytes = 300
    pool.size.update({"m01": 100, "m02": 100, "m03": 100, "m04": 200})
    pool.set_loaded(A, "m01", "m02", "m03")
    pool.used(A, "m01", 300)
    pool.used(A, "m02", 100)
    pool.used(A, "m03", 200)
    placer.room.learn(Usage({"m04": (0, 200)}))
    await request(placer, "m04")
    assert pool.calls == [("unload", str(A), "m01"), ("unload", str(A), "m03"), ("load", str(A), "m04")]
    assert events.unloads == ["evict", "evict"]
    assert not pool.over_capacity, pool.over_capacity
    idle(holds)


async def test_a_first_load_that_reveals_its_size_is_followed_by_evictions():
    """capacity_bytes 250: m01 and m02 (100 each) held; m03 was never loaded, so its 200 bytes are
    unknown and it is loaded (150 bytes were free). Its statistics then show the endpoint at 400:
    the least recently used go until it is within 250 again, never m03 itself."""
    pool, placer, holds, _ = await make(1, capacity=10, min_residency_s=60, capacity_bytes=250)
    pool.size.update({"m01": 100, "m02": 100, "m03": 200})
    pool.set_loaded(A, "m01", "m02")
    pool.used(A, "m01", 300)
    pool.used(A, "m02", 200)
    await request(placer, "m03")
    assert pool.calls == [("load", str(A), "m03"), ("unload", str(A), "m01"), ("unload", str(A), "m02")]
    assert pool.state[str(A)] == {"m03": "READY"}
    assert placer.room.sizes["m03"] == 200
    # Known now: the next model of unknown size finds 50 bytes free and loads; m03 stays (fresh).
    pool.size["m05"] = 40
    await request(placer, "m05")
    assert pool.state[str(A)] == {"m03": "READY", "m05": "READY"}
    idle(holds)


@pytest.mark.parametrize("capacity_bytes", [0, 10_000])
async def test_an_endpoint_over_by_more_than_one_model_evicts_nothing(capacity_bytes: int):
    """Capacity 2, four models held there (loaded by someone else): one eviction would not make
    room, so none is sent — with or without a byte limit — and the request waits, then 503."""
    pool, placer, holds, _ = await make(1, capacity=2, min_residency_s=0, load_timeout_s=0.5,
                                        capacity_bytes=capacity_bytes)
    pool.set_loaded(A, "m01", "m02", "m03", "m04")
    for m in ("m01", "m02", "m03", "m04"):
        pool.used(A, m, 600)
    with pytest.raises(ModelNotReady):
        await request(placer, "m05")
    assert pool.calls == []
    idle(holds)


async def test_a_model_larger_than_capacity_bytes_takes_an_endpoint_of_its_own():
    pool, placer, holds, _ = await make(1, capacity=10, min_residency_s=0, capacity_bytes=100)
    pool.size.update({"m01": 30, "m02": 30, "m03": 500})
    pool.set_loaded(A, "m01", "m02")
    placer.room.learn(Usage({"m03": (0, 500)}))
    await request(placer, "m03")
    assert pool.calls[-1] == ("load", str(A), "m03")
    assert sorted(pool.unloads()) == [(str(A), "m01"), (str(A), "m02")]
    idle(holds)


async def test_capacity_bytes_never_exceeded_under_concurrent_churn():
    """12 models of 50–150 bytes over 3 endpoints of 300 bytes, sizes known: at every load no
    endpoint holds (READY + LOADING) more than 300."""
    pool, placer, holds, _ = await make(3, capacity=12, load_s=0.01, load_timeout_s=3, capacity_bytes=300)
    rng = random.Random(41)
    pool.capacity_bytes = 300
    pool.size.update({m: rng.choice((50, 100, 150)) for m in REPO[:12]})
    placer.room.learn(Usage({m: (0, n) for m, n in pool.size.items()}))
    sem = asyncio.Semaphore(8)
    answered = 0

    async def one(model: str) -> None:
        nonlocal answered
        async with sem:
            with contextlib.suppress(ModelNotReady):
                await request(placer, model)
                for addr in (A, B, C):
                    if pool.state.get(str(addr), {}).get(model) == "READY":
                        pool.used(addr, model, 0)
                answered += 1

    await asyncio.gather(*(one(rng.choice(REPO[:12])) for _ in range(200)))
    assert not pool.over_capacity, pool.over_capacity[:5]
    assert not pool.reloads, pool.reloads[:5]
    assert answered >= 160 and pool.unloads()
    idle(holds)


@pytest.mark.parametrize("protect", ["pinned", "in_flight", "not_owned", "waiting", "loaded_here_lately",
                                     "loading"])
async def test_eviction_passes_over_a_protected_model(protect: str):
    """m02 is the least recently used; protected, m03 (next) goes instead."""
    owns = (lambda m: m != "m02") if protect == "not_owned" else None
    extra: dict[str, Any] = {"pinned": ("m02",)} if protect == "pinned" else {}
    pool, placer, holds, _ = await make(1, capacity=3, min_residency_s=60, owns=owns, **extra)
    pool.set_loaded(A, "m01", "m03")
    pool.used(A, "m01", 100)
    pool.used(A, "m03", 200)
    waiter = None
    if protect == "loaded_here_lately":
        await request(placer, "m02")  # loaded by this placer just now; never used (last_inference 0)
        assert pool.loads() == [(str(A), "m02")]
    elif protect == "loading":
        pool.set_loaded(A, "m02", state="LOADING")  # someone else's load, under way
    else:
        pool.set_loaded(A, "m02")
        pool.used(A, "m02", 300)
    if protect == "in_flight":
        holds.enter("m02", ROUTE)
    elif protect == "waiting":
        waiter = asyncio.create_task(holds.wait("m02", "", ROUTE, 5))
        await asyncio.sleep(0)
    await request(placer, "m04")
    assert pool.unloads() == [(str(A), "m03")], pool.calls
    assert not pool.over_capacity
    if protect == "in_flight":
        holds.leave("m02", ROUTE)
    if waiter is not None:
        holds.wake("m02")
        await waiter
    idle(holds)


@pytest.mark.parametrize("residency, evicted", [(60, None), (20, "m02")])
async def test_min_residency_protects_what_was_used_lately(residency: float, evicted: str | None):
    """m02 used 30 s ago, m01 10 s ago: with min_residency_s 60 neither may go (the load waits and
    fails); with 20, m02 (the least recently used) goes."""
    pool, placer, holds, _ = await make(1, capacity=2, min_residency_s=residency, load_timeout_s=0.4)
    pool.set_loaded(A, "m01", "m02")
    pool.used(A, "m01", 10)
    pool.used(A, "m02", 30)
    if evicted is None:
        with pytest.raises(ModelNotReady):
            await placer.ensure("m03", "", ROUTE)
        assert pool.calls == []
    else:
        await placer.ensure("m03", "", ROUTE)
        assert pool.calls == [("unload", str(A), evicted), ("load", str(A), "m03")]
    await asyncio.sleep(0.3)
    idle(holds)


async def test_a_full_pool_of_protected_models_waits_then_fails():
    """Every place taken by a model in flight, pinned, someone else's, or used within
    min_residency_s: ensure() waits (for one to become free) and fails after load_timeout_s."""
    pool, placer, holds, events = await make(2, capacity=2, min_residency_s=60, load_timeout_s=0.6,
                                             pinned=("m01",), owns=lambda m: m != "m02")
    pool.set_loaded(A, "m01", "m02")
    pool.set_loaded(B, "m03", "m04")
    for addr, m in [(A, "m01"), (A, "m02"), (B, "m04")]:
        pool.used(addr, m, 600)
    pool.used(B, "m03", 5)
    holds.enter("m04", "other")
    start = time.monotonic()
    with pytest.raises(ModelNotReady) as info:
        await placer.ensure("m05", "", ROUTE)
    took = time.monotonic() - start
    assert 0.3 <= took < 2.5, took  # (it looked for room every 0.25 s meanwhile)
    assert info.value.retry_after is not None and info.value.retry_after >= 1
    assert "m05" in info.value.message
    assert pool.calls == [] and events.unloads == []
    holds.leave("m04", "other")
    await asyncio.sleep(0.3)  # the placing task ends too, within its own deadline
    assert placer._placing == {}
    idle(holds)


async def test_a_hold_refused_for_want_of_room_is_counted_as_no_room():
    pool, placer, holds, events = await make(1, capacity=1, min_residency_s=60, load_timeout_s=0.6)
    pool.set_loaded(A, "m01")
    pool.used(A, "m01", 1)  # within min_residency_s: not evictable
    with pytest.raises(ModelNotReady):
        await placer.ensure("m02", "", ROUTE)
    assert events.refusals == [(ROUTE, "no_room")]
    idle(holds)


@pytest.mark.parametrize("error", [BadUpstreamResponse("model statistics: not JSON"),
                                   Refused(UpstreamError("stats refused", http_status=403), kind=Refused.BUSY)])
async def test_unreadable_statistics_never_evict_blind(error: Exception):
    """No last_inference to judge by: nothing is evicted; the request waits for room, then fails."""
    pool, placer, holds, _ = await make(1, capacity=1, load_timeout_s=0.4)
    pool.set_loaded(A, "m01")
    pool.stats_error = error
    with pytest.raises(ModelNotReady):
        await placer.ensure("m02", "", ROUTE)
    assert pool.calls == [] and pool.stats_calls >= 1
    await asyncio.sleep(0.3)
    idle(holds)


async def test_a_waiting_load_goes_once_a_place_frees():
    pool, placer, holds, _ = await make(1, capacity=1, min_residency_s=60, load_timeout_s=3)
    pool.set_loaded(A, "m01")
    pool.used(A, "m01", 600)
    holds.enter("m01", "other")  # in flight: not evictable yet
    task = asyncio.create_task(placer.ensure("m02", "", ROUTE))
    await asyncio.sleep(0.4)
    assert not task.done() and pool.calls == []
    holds.leave("m01", "other")
    await asyncio.wait_for(task, 2)
    assert pool.calls == [("unload", str(A), "m01"), ("load", str(A), "m02")]
    idle(holds)


async def test_no_load_where_the_model_is_ready():
    pool, placer, holds, _ = await make(3, copies=1, max_copies=3)
    pool.set_loaded(HostPort.parse(order("m01", A, B, C)[1]), "m01")
    await placer.ensure("m01", "", ROUTE)  # ready somewhere already
    assert pool.calls == []
    # Two copies asked for: only the endpoint without it loads.
    assert await placer.place_here("m01", 2)
    assert pool.loads() == [(order("m01", A, B, C)[0], "m01")]
    assert not pool.reloads
    assert sorted(await placer.place_here("m01", 2)) == sorted(order("m01", A, B, C)[:2])
    assert len(pool.loads()) == 1
    idle(holds)


async def test_copies_asked_by_a_peer_are_bounded_by_max_copies():
    pool, placer, _, _ = await make(3, copies=1, max_copies=2)
    ready = await placer.place_here("m03", 99)
    assert sorted(ready) == sorted(order("m03", A, B, C)[:2])
    assert len(pool.loads()) == 2
    assert sorted(await placer.place_here("m03", 0)) == sorted(ready)  # (0: at least one) ready already
    assert len(pool.loads()) == 2


async def test_a_stale_index_does_not_make_the_placer_load_again():
    pool, placer, _, _ = await make(3)
    first = order("m06", A, B, C)[0]
    ep = next(e for e in pool.endpoints.values() if str(e.address) == first)
    stale = pool.entries(first)  # read by a health round that started before the load ended
    await request(placer, "m06")
    assert pool.loads() == [(first, "m06")]
    await asyncio.sleep(0.01)  # (the placing task's end is seen)
    ep.health.set_index(stale)  # ... and applied after it
    pool.routed = frozenset()  # (anything that moves the backend's generation: cached answers are re-derived)
    assert ep.health.ready_for("m06", "") == Ready.NO
    await request(placer, "m06")
    assert pool.loads() == [(first, "m06")], pool.calls
    assert not pool.reloads


async def test_an_unknown_model_never_evicts():
    pool, placer, holds, _ = await make(2, capacity=2)
    for addr in (A, B):
        pool.set_loaded(addr, "m01", "m02")
        pool.used(addr, "m01", 600)
        pool.used(addr, "m02", 600)
    # Full everywhere, all evictable: a name no index lists evicts nothing and loads nothing; the
    # request goes on and the server answers it (its own 404).
    await placer.ensure("no-such-model", "", ROUTE)
    assert pool.calls == []
    idle(holds)


async def test_an_unknown_model_asked_by_a_peer_where_there_is_no_room_is_left_to_the_server():
    """The decider asked by another replica for a name no index lists, every endpoint full: no
    eviction, no load, no endpoints — the asking replica's request goes on and the server answers
    it (its own 404), as through the decider itself; not a 503 "retry later"."""
    pool, placer, holds, _ = await make(2, capacity=2)
    for addr in (A, B):
        pool.set_loaded(addr, "m01", "m02")
        pool.used(addr, "m01", 600)
        pool.used(addr, "m02", 600)
    assert await placer.place_here("no-such-model", 1) == []
    assert pool.calls == []
    idle(holds)


async def test_an_unknown_model_is_loaded_where_there_is_room_and_the_refusal_relayed():
    pool, placer, holds, events = await make(2, capacity=3)
    pool.set_loaded(A, "m01", "m02")
    with pytest.raises(UpstreamError) as info:
        await placer.ensure("no-such-model", "", ROUTE)
    assert info.value.http_status == 400 and "failed to load 'no-such-model'" in info.value.message
    assert pool.unloads() == [] and len(pool.loads()) == 1
    assert events.loads == ["failed"]
    idle(holds)


async def test_a_load_refusal_reaches_every_waiter_and_is_remembered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement_mod, "_FAILED_S", 0.3)
    pool, placer, holds, events = await make(3, load_s=0.05)
    results = await asyncio.gather(*(placer.ensure("broken", "", ROUTE) for _ in range(10)), return_exceptions=True)
    assert all(isinstance(r, UpstreamError) for r in results), results
    assert {r.message for r in results} == {results[0].message}  # type: ignore[union-attr]
    assert results[0].http_status == 400 and results[0].grpc_code == "INVALID_ARGUMENT"  # type: ignore[union-attr]
    assert pool.loads() == [(order("broken", A, B, C)[0], "broken")]
    # Asked again at once: answered from memory, no second load.
    for _ in range(5):
        with pytest.raises(UpstreamError):
            await placer.ensure("broken", "", ROUTE)
    assert len(pool.loads()) == 1
    idle(holds)
    # Later, asked again for real (the repository may have it now).
    await asyncio.sleep(0.35)
    pool.refuse.clear()
    await placer.ensure("broken", "", ROUTE)
    assert len(pool.loads()) == 2 and events.loads == ["failed", "ok"]
    idle(holds)


async def test_no_live_endpoint_is_model_not_ready():
    pool, placer, holds, _ = await make(2)
    for ep in pool.endpoints.values():
        ep.health.set_live(False)
    with pytest.raises(ModelNotReady) as info:
        await placer.ensure("m01", "", ROUTE)
    assert info.value.retry_after == 2 and "no live endpoint" in info.value.message
    assert pool.calls == []
    idle(holds)


async def test_queue_bound_of_a_placement_pool():
    pool, placer, holds, events = await make(1, load_s=0.3, queue=3)
    results = await asyncio.gather(*(placer.ensure("m01", "", ROUTE) for _ in range(5)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, ModelNotReady)]
    assert len(refused) == 2 and all(r.retry_after == 2 for r in refused)
    assert sum(r is None for r in results) == 3
    assert len(pool.loads()) == 1
    assert events.refusals.count(("*", "queue_full")) == 2
    idle(holds)


async def test_maintain_loads_pinned_models_and_trims_idle_copies():
    pool, placer, holds, events = await make(3, copies=1, max_copies=2, copy_idle_s=30, pinned=("m07",))
    # An extra copy of m08, idle for 60 s, on its first two endpoints: the later one in its order goes.
    two = order("m08", A, B, C)[:2]
    for text in two:
        addr = HostPort.parse(text)
        pool.set_loaded(addr, "m08")
        pool.used(addr, "m08", 60)
    placer.maintain()
    for _ in range(50):
        await asyncio.sleep(0.02)
        if pool.loads("m07") and pool.unloads():
            break
    assert pool.loads("m07") == [(order("m07", A, B, C)[0], "m07")]
    assert pool.unloads() == [(two[1], "m08")]
    assert events.unloads == ["idle_copy"]
    await placer.stop()
    idle(holds)
