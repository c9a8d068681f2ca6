"""The cyclic garbage collector, set for a server (process-wide, by the serving process).

A gateway's objects are of two kinds: those built at start-up or by a reload (modules,
config, routes, backends — tens of thousands, for the life of the process) and those of one
request (frames, futures, tasks, buffers' views — gone when the request ends). CPython's
defaults serve neither well under load:

* The youngest generation is collected every 700 net allocations of tracked objects. At 64
  concurrent large requests each in-flight request holds a few dozen (its tasks, coroutines,
  futures, timer handles), so the count is past 700 most of the time: a collection every ~40
  requests, each walking the ~2,000 live young objects (~0.45 ms), every survivor then walked
  again in the older generations. Measured on a 1 MiB pass-through at c=64 (gc.callbacks):
  ~20 µs of collections per request, 2.6 % of the gateway's CPU. The threshold here
  (:data:`YOUNG`) sits above what thousands of concurrent requests hold alive, so the
  collector runs for garbage in cycles, not for objects that are about to be freed anyway.
* A full collection walks every object, the start-up ones included: 13–25 ms each.
  :func:`settle` freezes what exists once start-up (or a reload) is done (``gc.freeze``):
  later collections skip it. A reload first unfreezes, so what it replaced is collected.
* Start-up itself builds those objects, and CPython's thresholds walk them again and again as
  they pile up: at 300 endpoints × 10,000 routes, six full collections of 25–127 ms (~0.4 s of
  start-up) before the listeners opened, one of 101 ms inside the first health round's summary.
  :func:`hold` switches the collector off until :func:`settle` collects once and freezes.
* Some long-lived state is built later, by a model's first request: its inference handlers and
  its metric children, ~15 tracked objects a model. Under a light load spread over 10,000
  models they kept the youngest generation full — a collection every ~4 s walking ~20,000 of
  them, 5–14 ms each, every one a survivor (gc callbacks, 300 × 10,000). :func:`grown` counts
  such state and freezes again once :data:`GROWN` of it was built since the last freeze. A
  freeze is O(1) (the generations' lists are spliced onto the permanent one); what it also
  takes — a request's objects of the moment — is still freed by reference counting, and only
  garbage in cycles among them waits for the next reload's :func:`settle`, which unfreezes:
  :data:`FREEZES` bounds how often that can happen between two settles.

Garbage in cycles is still collected, only later: up to :data:`YOUNG` objects of it. The
gateway avoids making any per request (the body pump's idle timer is a class for that reason:
backends/h1/clock.py); what large buffers a cycle might hold is given back by the allocator's idle
trim, which collects first (malloc.py).

``OIP_GATEWAY_GC_TUNING=0`` keeps CPython's defaults.
"""
from __future__ import annotations

import gc
import os

__all__ = ["FREEZES", "GROWN", "YOUNG", "grown", "hold", "resume", "settle"]

YOUNG = 20_000
GROWN = 512  # models' lazily built state between two freezes (~7,500 objects: a third of YOUNG)
FREEZES = 64  # freezes by grown() between two settles (64 × 512 models: more than any config routes)

_held = False  # hold() switched the collector off; settle() switches it on again
_grown = 0  # lazily built state since the last freeze
_freezes = 0  # left to grown() until the next settle (0: not settled with the tuning on)


def _tuning() -> bool:
    return os.environ.get("OIP_GATEWAY_GC_TUNING", "1") != "0"


def hold() -> None:
    """Before start-up: no collection until :func:`settle` (start-up's garbage waits for the
    one collection there)."""
    global _held
    if _tuning() and gc.isenabled():
        gc.disable()
        _held = True


def resume() -> None:
    """The collector on again if :func:`hold` switched it off (start-up ended or failed)."""
    global _held
    if _held:
        gc.enable()
        _held = False


def settle() -> bool:
    """After start-up or a reload: collect what is garbage, freeze the rest, and raise the
    youngest generation's threshold. Returns whether the tuning is on."""
    global _grown, _freezes
    if not _tuning():
        return False
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    _grown, _freezes = 0, FREEZES
    resume()
    young, middle, old = gc.get_threshold()
    if young and young < YOUNG:  # (0: the collector was switched off on purpose; left so)
        gc.set_threshold(YOUNG, middle, old)
    return True


def grown() -> None:
    """A model's long-lived state was built (its first request): frozen with the rest once
    :data:`GROWN` of it has been since the last freeze (at most :data:`FREEZES` times between two
    settles; never before the first settle, nor with the tuning off)."""
    global _grown, _freezes
    _grown += 1
    if _grown >= GROWN and _freezes > 0:
        _grown = 0
        _freezes -= 1
        gc.freeze()
