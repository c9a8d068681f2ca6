"""Rendezvous hashing (gateway/routing/rendezvous.py): the one order every replica computes for a
model over a pool's endpoints (and for a pool over the gateway's peers). It must be the same in
every process (not Python's salted ``hash``), move only what must move when a node comes or goes,
spread keys evenly, and never depend on the order the nodes are given in."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from hashlib import blake2b
from pathlib import Path

import pytest

from gateway.routing import rendezvous
from gateway.routing.rendezvous import rank, weight

ROOT = Path(__file__).resolve().parents[2]
NODES = [f"10.0.0.{i}:8001" for i in range(1, 11)]
KEYS = [f"model-{i:04d}" for i in range(1000)]


def _first_choices(keys: list[str], nodes: list[str]) -> dict[str, str]:
    return {k: rank(k, nodes)[0] for k in keys}


# -- the same everywhere -------------------------------------------------------------------------


def test_weight_is_blake2b_of_key_nul_node_big_endian():
    """The contract (docs/placement.md): blake2b of ``model + "\\0" + endpoint``, 64 bits, highest
    first — what any other implementation (a replica of another version) must compute too."""
    for key, node in [("m", "10.0.0.1:8001"), ("", ""), ("ü-model", "[::1]:9400"), ("a\0b", "c")]:
        want = int.from_bytes(blake2b(f"{key}\0{node}".encode(), digest_size=8).digest(), "big")
        assert weight(key, node) == want
        assert 0 <= weight(key, node) < 1 << 64


def test_same_rank_on_every_call():
    for key in KEYS[:50]:
        first = rank(key, NODES)
        assert sorted(first) == sorted(NODES)
        for _ in range(3):
            assert rank(key, NODES) == first
            assert rank(key, iter(NODES)) == first  # any iterable, consumed once


def test_same_rank_in_another_process_with_another_hash_seed():
    """Python's ``hash`` of a str differs between processes (PYTHONHASHSEED); the ranks and
    weights must not. A child with a different seed computes them and we compare."""
    keys = KEYS[:200]
    code = (
        "import json, sys\n"
        "from gateway.routing.rendezvous import rank, weight\n"
        "keys, nodes = json.load(sys.stdin)\n"
        "print(json.dumps({'hash': hash(keys[0]), 'ranks': [rank(k, nodes) for k in keys],"
        " 'weights': [weight(k, nodes[0]) for k in keys]}))\n"
    )
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps([keys, NODES]), capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60, check=True)
        outs.append(json.loads(done.stdout))
    assert outs[0]["hash"] != outs[1]["hash"]  # the salt really differs between the children
    for out in outs:
        assert out["ranks"] == [rank(k, NODES) for k in keys]
        assert out["weights"] == [weight(k, NODES[0]) for k in keys]


# -- what moves ------------------------------------------------------------------------------------


def test_adding_a_node_moves_only_the_keys_it_now_wins():
    before = _first_choices(KEYS, NODES)
    new = "10.0.0.99:8001"
    after = _first_choices(KEYS, [*NODES, new])
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved, "a new node among 11 wins some of 1000 keys"
    assert all(after[k] == new for k in moved)  # every key that moved went to the new node
    assert {k for k in KEYS if after[k] == new} == moved  # and every key it won moved
    # The rest of each key's order is unchanged: the new node is only inserted.
    for k in KEYS[:200]:
        assert [n for n in rank(k, [*NODES, new]) if n != new] == rank(k, NODES)


def test_removing_a_node_moves_only_its_keys():
    before = _first_choices(KEYS, NODES)
    gone = NODES[3]
    rest = [n for n in NODES if n != gone]
    after = _first_choices(KEYS, rest)
    for k in KEYS:
        if before[k] == gone:
            assert after[k] == rank(k, NODES)[1]  # its next choice takes it
        else:
            assert after[k] == before[k]
    for k in KEYS[:200]:
        assert rank(k, rest) == [n for n in rank(k, NODES) if n != gone]


# -- spread --------------------------------------------------------------------------------------


def test_keys_spread_roughly_evenly():
    counts = Counter(_first_choices(KEYS, NODES).values())
    assert set(counts) == set(NODES)
    assert all(50 <= n <= 160 for n in counts.values()), counts
    # Second choices spread too (a second copy does not pile up on one node).
    seconds = Counter(rank(k, NODES)[1] for k in KEYS)
    assert all(50 <= n <= 160 for n in seconds.values()), seconds


def test_similar_names_do_not_cluster():
    """Model names differ in a digit, endpoints in the last octet: no node takes them all."""
    counts = Counter(rank(f"resnet50_v{i}", NODES)[0] for i in range(200))
    assert max(counts.values()) <= 50, counts


# -- ties ------------------------------------------------------------------------------------------


def test_the_order_the_nodes_come_in_never_matters():
    nodes = NODES[:5]
    for key in KEYS[:20]:
        ranks = {tuple(rank(key, list(p))) for p in itertools.permutations(nodes)}
        assert len(ranks) == 1


def test_equal_weights_are_broken_by_name_whatever_the_input_order(monkeypatch: pytest.MonkeyPatch):
    """A 64-bit collision is all but impossible; if it happens every process must still break it
    the same way: by the node's name, not by where it came in the list."""
    monkeypatch.setattr(rendezvous, "weight", lambda key, node: 7)
    nodes = ["b:1", "a:1", "c:1", "a:2"]
    ranks = {tuple(rank("m", list(p))) for p in itertools.permutations(nodes)}
    assert ranks == {("c:1", "b:1", "a:2", "a:1")}


def test_partial_collision_keeps_the_weight_order(monkeypatch: pytest.MonkeyPatch):
    weights = {"a:1": 5, "b:1": 9, "c:1": 5, "d:1": 1}
    monkeypatch.setattr(rendezvous, "weight", lambda key, node: weights[node])
    for p in itertools.permutations(weights):
        assert rank("m", list(p)) == ["b:1", "c:1", "a:1", "d:1"]


def test_empty_and_single():
    assert rank("m", []) == []
    assert rank("m", ["only:1"]) == ["only:1"]
