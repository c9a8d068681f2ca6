"""Loaded into a gateway process by tests that put this directory on its PYTHONPATH
(tests/integration/test_gc_cycles.py): counts the garbage only the cyclic collector would free.

A file ``collect`` appearing in ``$OIP_TEST_GC_PROBE`` is answered with ``garbage.json`` there: the
objects one collection found unreachable since the previous request (``gc.DEBUG_SAVEALL`` keeps
them to be counted), by type. A thread polls for the request, so it is answered while the event
loop waits. The first request switches the automatic collector off, so nothing is collected
unseen between two requests.
"""
from __future__ import annotations

import collections
import gc
import json
import os
import threading
import time


def _serve(directory: str) -> None:
    request = os.path.join(directory, "collect")
    while True:
        time.sleep(0.02)
        if not os.path.exists(request):
            continue
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        errors = [repr(o)[:300] for o in gc.garbage if isinstance(o, BaseException)][:5]
        gc.garbage.clear()
        gc.set_debug(0)
        tmp = os.path.join(directory, "garbage.json.tmp")
        with open(tmp, "w") as fh:
            json.dump({"count": sum(kinds.values()), "kinds": dict(kinds.most_common(40)), "errors": errors}, fh)
        os.replace(tmp, os.path.join(directory, "garbage.json"))
        os.unlink(request)


_dir = os.environ.get("OIP_TEST_GC_PROBE")
if _dir:
    threading.Thread(target=_serve, args=(_dir,), daemon=True, name="gc-probe").start()
