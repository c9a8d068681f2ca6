"""Placement's config (issue 40): ``backends.<name>.placement``, a route's ``hold_s``,
``listen.peers`` and top-level ``peers`` — every key parsed, its default, and every bad value
refused with its key path, all problems of a file in one ConfigError (config/loader.py's rule)."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.config import HostPort, parse_config
from gateway.config.backends import Placement
from gateway.config.network import Peers
from gateway.errors import ConfigError

EPS = ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001"]
KEY = "backends.pool.placement"


def config(placement: Any = None, *, endpoints: list[Any] | None = None, routes: list[dict[str, Any]] | None = None,
           **top: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {"protocol": "grpc", "endpoints": endpoints or list(EPS)}
    if placement is not None:
        backend["placement"] = placement
    return {"backends": {"pool": backend}, "routes": routes or [{"model": "*", "backend": "pool"}], **top}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def placement_of(raw: dict[str, Any]) -> Placement:
    spec = parse_config(raw).backends["pool"].placement
    assert spec is not None
    return spec


def has(found: list[str], key: str, *words: str) -> bool:
    """A problem names ``key`` (exactly, then a colon) and says each of ``words``."""
    return any(p.startswith(key + ":") and all(w in p for w in words) for p in found)


# -- placement: values and defaults ----------------------------------------------------------------


def test_placement_defaults():
    spec = placement_of(config({"capacity_models": 3}))
    assert spec == Placement(capacity_models=3)
    assert (spec.capacity_bytes, spec.copies, spec.max_copies) == (0, 1, 1)
    assert (spec.scale_up_per_copy, spec.scale_up_after_s, spec.copy_idle_s) == (4.0, 5.0, 300.0)
    assert (spec.min_residency_s, spec.pinned, spec.queue, spec.load_timeout_s) == (60.0, (), 64, 120.0)
    assert spec.grpc_port == 0


def test_no_placement_section_is_no_placement():
    assert parse_config(config()).backends["pool"].placement is None
    raw = config()
    raw["backends"]["pool"]["placement"] = None  # `placement:` with nothing after it
    assert parse_config(raw).backends["pool"].placement is None


def test_every_placement_key():
    spec = placement_of(config({
        "capacity_models": 20, "capacity_bytes": 8 << 30, "copies": 2, "max_copies": 3,
        "scale_up_per_copy": 2.5, "scale_up_after_s": 0, "copy_idle_s": 30, "min_residency_s": 0,
        "pinned": ["resnet50", "bert"], "queue": 1, "load_timeout_s": 3600,
    }))
    assert spec == Placement(capacity_models=20, capacity_bytes=8 << 30, copies=2, max_copies=3,
                             scale_up_per_copy=2.5, scale_up_after_s=0, copy_idle_s=30, min_residency_s=0,
                             pinned=("resnet50", "bert"), queue=1, load_timeout_s=3600)


@pytest.mark.parametrize("given, want", [({}, 1), ({"copies": 2}, 2), ({"copies": 2, "max_copies": 0}, 2),
                                         ({"copies": 3, "max_copies": 3}, 3), ({"max_copies": 3}, 3)])
def test_max_copies_defaults_to_copies(given: dict[str, int], want: int):
    assert placement_of(config({"capacity_models": 3, **given})).max_copies == want


def test_placement_in_the_dataclass_directly():
    assert Placement(capacity_models=1, copies=2).max_copies == 2
    with pytest.raises(ValueError, match="max_copies must be >= copies"):
        Placement(capacity_models=1, copies=2, max_copies=1)


# -- placement: problems ---------------------------------------------------------------------------


@pytest.mark.parametrize("raw, key, words", [
    ({}, f"{KEY}.capacity_models", ("required",)),
    ({"copies": 1}, f"{KEY}.capacity_models", ("required",)),
    ({"capacity_models": "3"}, f"{KEY}.capacity_models", ("integer",)),
    ({"capacity_models": 2.5}, f"{KEY}.capacity_models", ("integer",)),
    ({"capacity_models": True}, f"{KEY}.capacity_models", ("integer",)),
    ({"capacity_models": None}, f"{KEY}.capacity_models", ("integer",)),
    ({"capacity_models": 3, "capacity_bytes": 1.5}, f"{KEY}.capacity_bytes", ("integer",)),
    ({"capacity_models": 3, "copies": "two"}, f"{KEY}.copies", ("integer",)),
    ({"capacity_models": 3, "max_copies": [2]}, f"{KEY}.max_copies", ("integer",)),
    ({"capacity_models": 3, "queue": 1.0}, f"{KEY}.queue", ("integer",)),
    ({"capacity_models": 3, "scale_up_per_copy": "4"}, f"{KEY}.scale_up_per_copy", ("number",)),
    ({"capacity_models": 3, "scale_up_after_s": False}, f"{KEY}.scale_up_after_s", ("number",)),
    ({"capacity_models": 3, "copy_idle_s": {}}, f"{KEY}.copy_idle_s", ("number",)),
    ({"capacity_models": 3, "min_residency_s": "1m"}, f"{KEY}.min_residency_s", ("number",)),
    ({"capacity_models": 3, "load_timeout_s": "120s"}, f"{KEY}.load_timeout_s", ("number",)),
    ({"capacity_models": 3, "pinned": "resnet50"}, f"{KEY}.pinned", ("list",)),
    ({"capacity_models": 3, "pinned": [""]}, f"{KEY}.pinned", ("list",)),
    ({"capacity_models": 3, "pinned": [1]}, f"{KEY}.pinned", ("list",)),
    ({"capacity_models": 3, "pinned": None}, f"{KEY}.pinned", ("list",)),
    ({"capacity_models": 3, "capacity": 3}, f"{KEY}.capacity", ("unknown key", "capacity_models")),
    ({"capacity_models": 3, "Copies": 1}, f"{KEY}.Copies", ("unknown key",)),
    # Ranges: the dataclass's check, under the section's key, naming the field.
    ({"capacity_models": 0}, KEY, ("capacity_models must be >= 1",)),
    ({"capacity_models": -1}, KEY, ("capacity_models",)),
    ({"capacity_models": 3, "capacity_bytes": -1}, KEY, ("capacity_bytes must be >= 0",)),
    ({"capacity_models": 3, "copies": 0}, KEY, ("copies must be >= 1",)),
    ({"capacity_models": 3, "copies": 2, "max_copies": 1}, KEY, ("max_copies must be >= copies",)),
    ({"capacity_models": 3, "scale_up_per_copy": 0}, KEY, ("scale_up_per_copy",)),
    ({"capacity_models": 3, "scale_up_after_s": -1}, KEY, ("scale_up_after_s",)),
    ({"capacity_models": 3, "copy_idle_s": 0}, KEY, ("copy_idle_s",)),
    ({"capacity_models": 3, "min_residency_s": -0.5}, KEY, ("min_residency_s must be >= 0",)),
    ({"capacity_models": 3, "queue": 0}, KEY, ("queue must be >= 1",)),
    ({"capacity_models": 3, "load_timeout_s": 0}, KEY, ("load_timeout_s",)),
    ({"capacity_models": 3, "load_timeout_s": 3600.5}, KEY, ("load_timeout_s",)),
    ({"capacity_models": 3, "pinned": ["a", "a"]}, KEY, ("pinned must list distinct",)),
    ({"capacity_models": 3, "grpc_port": "8001"}, f"{KEY}.grpc_port", ("integer",)),
    ({"capacity_models": 3, "grpc_port": 65536}, KEY, ("grpc_port must be a TCP port",)),
    ({"capacity_models": 3, "grpc_port": -1}, KEY, ("grpc_port",)),
])
def test_each_bad_placement_value_names_its_key(raw: dict[str, Any], key: str, words: tuple[str, ...]):
    found = problems(config(raw))
    assert has(found, key, *words), found


@pytest.mark.parametrize("raw", ["capacity_models: 3", 3, ["capacity_models", 3], True])
def test_placement_must_be_a_mapping(raw: Any):
    found = problems(config(raw))
    assert has(found, KEY, "mapping"), found


def test_every_placement_problem_in_one_error():
    """Every key's problem at once, not the first only — with problems elsewhere in the file too."""
    raw = config({"copies": "x", "queue": 1.5, "load_timeout_s": "soon", "pinned": "m", "typo": 1},
                 routes=[{"model": "*", "backend": "pool", "hold_s": "long"}], listen={"peers": "nohost"},
                 peers=["nohost"])
    found = problems(raw)
    for key in (f"{KEY}.capacity_models", f"{KEY}.copies", f"{KEY}.queue", f"{KEY}.load_timeout_s", f"{KEY}.pinned",
                f"{KEY}.typo", "routes[0].hold_s", "listen.peers", "peers[0]"):
        assert has(found, key), (key, found)


def test_copies_more_than_the_static_endpoints_refused():
    found = problems(config({"capacity_models": 3, "copies": 4}))
    assert has(found, "backends.pool", "placement.copies is more than the backend's endpoints"), found
    found = problems(config({"capacity_models": 3, "copies": 2}, endpoints=["10.0.0.1:8001"]))
    assert has(found, "backends.pool", "placement.copies"), found
    # As many as there are: fine.
    assert placement_of(config({"capacity_models": 3, "copies": 3})).copies == 3


def test_grpc_port_is_for_an_http_backend():
    raw = config({"capacity_models": 3, "grpc_port": 8001})
    found = problems(raw)
    assert has(found, "backends.pool", "placement.grpc_port is for an http backend"), found
    raw["backends"]["pool"]["protocol"] = "http"
    assert placement_of(raw).grpc_port == 8001


def test_copies_with_dns_endpoints_are_not_counted_at_load():
    """A DNS name may resolve to any number of pods: the count is not known when the file loads."""
    raw = config({"capacity_models": 3, "copies": 4}, endpoints=[{"dns": "triton.models.svc:8001"}])
    assert placement_of(raw).copies == 4
    raw = config({"capacity_models": 3, "copies": 4}, endpoints=["10.0.0.1:8001", {"dns": "triton.models.svc:8001"}])
    assert placement_of(raw).copies == 4


# -- hold_s ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [(0, 0.0), (0.5, 0.5), (30, 30.0), (3600, 3600.0)])
def test_hold_s(value: float, want: float):
    raw = config(routes=[{"model": "m", "backend": "pool", "hold_s": value}])
    assert parse_config(raw).routes[0].hold_s == want


def test_hold_s_default_and_any_backend():
    raw = config(routes=[{"model": "m", "backend": "pool"}, {"model": "*", "backend": "pool", "hold_s": 5}])
    cfg = parse_config(raw)
    assert cfg.routes[0].hold_s == 0.0
    assert cfg.routes[1].hold_s == 5.0  # without placement: any backend may hold


@pytest.mark.parametrize("value, key, words", [
    (-1, "routes[0]", ("hold_s must be between 0 and 3600",)),
    (3600.001, "routes[0]", ("hold_s must be between 0 and 3600",)),
    (1e9, "routes[0]", ("hold_s",)),
    ("5s", "routes[0].hold_s", ("number",)),
    (True, "routes[0].hold_s", ("number",)),
    (None, "routes[0].hold_s", ("number",)),
    ([1], "routes[0].hold_s", ("number",)),
])
def test_bad_hold_s_names_its_key(value: Any, key: str, words: tuple[str, ...]):
    found = problems(config(routes=[{"model": "m", "backend": "pool", "hold_s": value}]))
    assert has(found, key, *words), found


def test_hold_s_of_every_route_reported():
    found = problems(config(routes=[{"model": "a", "backend": "pool", "hold_s": "x"},
                                    {"model": "b", "backend": "pool", "hold_s": -5}]))
    assert has(found, "routes[0].hold_s") and has(found, "routes[1]", "hold_s"), found


# -- listen.peers ----------------------------------------------------------------------------------


def test_listen_peers():
    assert parse_config(config()).listen.peers is None  # off unless asked for
    assert parse_config(config(listen={"peers": "127.0.0.1:9400"})).listen.peers == HostPort("127.0.0.1", 9400)
    assert parse_config(config(listen={"peers": "[::1]:0"})).listen.peers == HostPort("::1", 0)
    assert parse_config(config(listen={"peers": None})).listen.peers is None
    assert parse_config(config(listen={"peers": False})).listen.peers is None
    # Setting it leaves the other listeners at their defaults.
    cfg = parse_config(config(listen={"peers": "0.0.0.0:9400"}))
    assert cfg.listen.http == HostPort("0.0.0.0", 8000) and cfg.listen.grpc == HostPort("0.0.0.0", 8001)


@pytest.mark.parametrize("value", ["nohost", "h:99999", "h:port", ":9400", 9400, ["h:1"], True])
def test_bad_listen_peers_names_its_key(value: Any):
    found = problems(config(listen={"peers": value}))
    assert has(found, "listen.peers"), found


def test_listen_peer_is_not_a_key():
    found = problems(config(listen={"peer": "127.0.0.1:9400"}))
    assert has(found, "listen.peer", "unknown key", "peers"), found


# -- top-level peers ---------------------------------------------------------------------------------


def test_peers_static_and_dns():
    cfg = parse_config(config(peers=["10.1.0.1:9400", {"dns": "oip-gateway-peers.ns.svc:9400"}, "[fd00::1]:9400"]))
    assert cfg.peers == Peers(addresses=(HostPort("10.1.0.1", 9400), HostPort("fd00::1", 9400)),
                              dns=(HostPort("oip-gateway-peers.ns.svc", 9400),))
    assert parse_config(config()).peers is None
    assert parse_config(config(peers=None)).peers is None
    only_dns = parse_config(config(peers=[{"dns": "gw.ns.svc:9400"}])).peers
    assert only_dns == Peers(addresses=(), dns=(HostPort("gw.ns.svc", 9400),))


@pytest.mark.parametrize("value, key, words", [
    ([], "peers", ("non-empty list",)),
    ("10.1.0.1:9400", "peers", ("non-empty list",)),
    ({"dns": "gw:9400"}, "peers", ("non-empty list",)),
    (["nohost"], "peers[0]", ()),
    (["10.1.0.1:9400", "h:70000"], "peers[1]", ()),
    ([9400], "peers[0]", ()),
    ([None], "peers[0]", ()),
    ([{}], "peers[0].dns", ()),
    ([{"dns": "gw"}], "peers[0].dns", ()),
    ([{"dns": None}], "peers[0].dns", ()),
    ([{"dns": "gw:9400", "port": 1}], "peers[0].port", ("unknown key",)),
    ([{"address": "10.1.0.1:9400"}], "peers[0].address", ("unknown key",)),
])
def test_bad_peers_name_their_key(value: Any, key: str, words: tuple[str, ...]):
    found = problems(config(peers=value))
    assert has(found, key, *words), found


def test_every_bad_peer_reported():
    found = problems(config(peers=["a", {"dns": "b"}, "ok:1", 7]))
    assert has(found, "peers[0]") and has(found, "peers[1].dns") and has(found, "peers[3]"), found
    assert not has(found, "peers[2]"), found


# -- unknown keys --------------------------------------------------------------------------------------


def test_unknown_keys_refused_everywhere():
    raw = config({"capacity_models": 3, "evict": "lru"}, routes=[{"model": "*", "backend": "pool", "hold": 5}],
                 listen={"peers": "127.0.0.1:0", "peer_port": 1}, peer=["a:1"])
    found = problems(raw)
    for key in (f"{KEY}.evict", "routes[0].hold", "listen.peer_port", "peer"):
        assert has(found, key, "unknown key"), (key, found)


def test_the_input_is_not_changed():
    raw = config({"capacity_models": 3, "pinned": ["a"]}, peers=["10.1.0.1:9400"])
    before = copy.deepcopy(raw)
    parse_config(raw)
    assert raw == before
