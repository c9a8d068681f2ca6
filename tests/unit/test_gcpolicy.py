"""The collector's settings (gateway/gcpolicy.py). They are process-wide, so each case runs in
a fresh interpreter: nothing here changes the test process's collector."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import gc, json, sys
from gateway.gcpolicy import settle
if len(sys.argv) > 1:
    gc.set_threshold(int(sys.argv[1]), 10, 10)

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a

cycle()  # garbage in a cycle from before start-up is done
on = settle()
first = {"on": on, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
         "nodes": sum(isinstance(o, Node) for o in gc.get_objects())}
keep = [Node() for _ in range(3)]
for n in keep:
    n.me = n  # three objects in cycles, frozen by the next settle, then dropped
settle()
frozen_nodes = sum(isinstance(o, Node) for o in gc.get_objects())  # (frozen objects are not listed)
del keep, n
settle()  # as after a reload: what was frozen and has become garbage is collected
gone = [o for o in gc.get_objects() if isinstance(o, Node)]
print(json.dumps({"first": first, "frozen_nodes": frozen_nodes, "after": len(gone),
                  "freeze_count": gc.get_freeze_count()}))
"""


def probe(*args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=dict(os.environ, **(env or {})),
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_settle_collects_freezes_and_raises_the_young_threshold():
    from gateway.gcpolicy import YOUNG

    got = probe()
    first = got["first"]
    assert first["on"] is True
    assert first["nodes"] == 0  # the cycle from before was collected, not frozen
    assert first["frozen"] > 1000  # start-up's objects (modules, functions) are out of the way
    assert first["threshold"][0] == YOUNG > 700


def test_what_was_frozen_is_collected_by_the_next_settle():
    got = probe()
    assert got["frozen_nodes"] == 0  # frozen: not among the objects the collector walks
    assert got["after"] == 0  # dropped after being frozen, collected at the next settle
    assert got["freeze_count"] > 1000


def test_off_switch_and_a_collector_switched_off_on_purpose():
    off = probe(env={"OIP_GATEWAY_GC_TUNING": "0"})["first"]
    assert off["on"] is False and off["frozen"] == 0 and off["threshold"][0] == 700
    disabled = probe("0")["first"]
    assert disabled["threshold"][0] == 0  # a threshold of 0 (collection off) is left so
    higher = probe("50000")["first"]
    assert higher["threshold"][0] == 50000  # a higher one chosen by the operator is kept


GROWN_PROBE = r"""
import gc, json, sys
from gateway import gcpolicy

class State:
    pass

kept = []

def build(n):
    for _ in range(n):
        kept.append([State() for _ in range(3)])  # long-lived, as a model's handlers
        gcpolicy.grown()

build(gcpolicy.GROWN)  # before any settle: nothing frozen
before = gc.get_freeze_count()
on = gcpolicy.settle()
after_settle = gc.get_freeze_count()
build(gcpolicy.GROWN - 1)
almost = gc.get_freeze_count()
young_before = gc.get_count()[0]
build(1)
frozen_once = gc.get_freeze_count()
young_after = gc.get_count()[0]
freezes = 1
for _ in range(gcpolicy.FREEZES + 5):
    count = gc.get_freeze_count()
    build(gcpolicy.GROWN)
    freezes += gc.get_freeze_count() != count
print(json.dumps({"before": before, "on": on, "after_settle": after_settle, "almost": almost,
                  "frozen_once": frozen_once, "young_before": young_before, "young_after": young_after,
                  "freezes": freezes}))
"""


def test_state_grown_after_start_up_is_frozen_in_batches_a_bounded_number_of_times():
    from gateway.gcpolicy import FREEZES, GROWN

    def run(env: dict[str, str] | None = None) -> dict:
        out = subprocess.run([sys.executable, "-c", GROWN_PROBE], env=dict(os.environ, **(env or {})),
                             capture_output=True, text=True, check=True, timeout=60)
        return json.loads(out.stdout)

    got = run()
    assert got["before"] == 0  # nothing frozen before start-up is settled
    assert got["on"] and got["after_settle"] > 0
    assert got["almost"] == got["after_settle"]  # GROWN - 1 models' state: not yet
    assert got["frozen_once"] >= got["almost"] + 3 * GROWN  # the batch, out of the young generation
    assert got["young_before"] >= 3 * (GROWN - 1) and got["young_after"] < 10
    assert got["freezes"] == FREEZES  # then no more until the next settle
    off = run({"OIP_GATEWAY_GC_TUNING": "0"})
    assert off["frozen_once"] == 0 and off["freezes"] == 1  # (the probe counts its first batch)
