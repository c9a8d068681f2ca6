"""Run by tests/integration/test_request_walk.py in a process of its own: the modules one HTTP
JSON inference to a gRPC backend crosses on its way out (up to the gRPC call) and back (up to
the write of its answer), as Python frames show them.

Every ``gateway`` module is imported from its source here — a module compiled with mypyc runs
without frames, and the walk must see all of them. A task's frames begin where the event loop
resumed it, so the chain of a frame inside a task is the chain where the task was created
followed by the task's own frames (the loop's task factory, a public hook, notes the first).

Prints one JSON object: {"out": [modules, outermost first], "back": [modules], "status": int}.
"""
from __future__ import annotations

import asyncio
import http.client
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import weakref
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2] / "gateway"
# Where the gRPC call to the backend begins: grpc.aio's multi-callable, or the gateway's own channel.
GRPC_CALL = os.sep.join(("grpc", "aio", "_channel.py"))
NATIVE_CALL = os.sep.join(("backends", "h2channel.py"))


class SourceOnly(importlib.abc.MetaPathFinder):
    """``gateway`` and its modules from their ``.py`` files, never a compiled extension."""

    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "gateway" and not name.startswith("gateway."):
            return None
        base = ROOT.parent.joinpath(*name.split("."))
        if base.is_dir():
            return importlib.util.spec_from_file_location(name, base / "__init__.py",
                                                          submodule_search_locations=[str(base)])
        source = base.with_suffix(".py")
        return importlib.util.spec_from_file_location(name, source) if source.exists() else None


sys.meta_path.insert(0, SourceOnly())

import orjson  # noqa: E402

from gateway.config.network import HostPort  # noqa: E402
from gateway.demo.serve import demo_config, start_reference  # noqa: E402
from gateway.server import Gateway  # noqa: E402

LOOPBACK = HostPort("127.0.0.1", 0)
BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})
MODEL = "identity_FP32"  # routed to the demo's gRPC backend

created: weakref.WeakKeyDictionary[asyncio.Task[Any], list[str]] = weakref.WeakKeyDictionary()


def module_of(frame: FrameType) -> str | None:
    """The gateway module of a frame: of its object's class for a method (a base class's method
    working for a subclass is the subclass's component), else of its code."""
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(ROOT):
        return None
    code = frame.f_code
    if code.co_argcount and code.co_varnames[0] == "self":
        owner = sys.modules.get(type(frame.f_locals.get("self")).__module__)
        where = getattr(owner, "__file__", None)
        if where is not None and Path(where).is_relative_to(ROOT):
            path = Path(where)
    return str(path.relative_to(ROOT).with_suffix(""))


def origin(coro: Any) -> list[str]:
    """The gateway modules where a coroutine was made, outermost first
    (``sys.set_coroutine_origin_tracking_depth``)."""
    mods = []
    for filename, _line, _name in reversed(getattr(coro, "cr_origin", None) or ()):
        path = Path(filename)
        if path.is_relative_to(ROOT):
            mods.append(str(path.relative_to(ROOT).with_suffix("")))
    return mods


def chain(frame: FrameType | None) -> list[str]:
    """The gateway modules on the stack, outermost first (a task's creation chain before it)."""
    mods: list[str] = []
    while frame is not None:
        mod = module_of(frame)
        if mod is not None:
            mods.append(mod)
        frame = frame.f_back
    mods.reverse()
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    start = created.get(task, []) if task is not None else []
    return start + mods


def collapse(mods: list[str]) -> list[str]:
    out: list[str] = []
    for mod in mods:
        if not out or out[-1] != mod:
            out.append(mod)
    return out


class Walk:
    """``out``: the chain at the gRPC call. ``back``: every module on the chain of any call into
    the client's connection (frontend/h1*) after it — where the answer is written from."""

    def __init__(self) -> None:
        self.active = False
        self.out: list[str] | None = None
        self.back: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.active or event != "call":
            return
        if self.out is None:
            code = frame.f_code
            if (code.co_name == "__call__" and code.co_filename.endswith(GRPC_CALL)) or \
                    (code.co_name == "unary" and code.co_filename.endswith(NATIVE_CALL)):
                self.out = collapse(chain(frame.f_back))
            return
        mod = module_of(frame)
        if mod is not None and mod.startswith("frontend/h1"):
            self.back.update(chain(frame))


def post(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=BODY, headers={"content-type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


async def main() -> None:
    loop = asyncio.get_running_loop()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        # Where the coroutine was made, not where the task object was (a helper may do that).
        made = origin(coro)
        creator = asyncio.current_task(loop) if loop.is_running() else None
        created[task] = (created.get(creator, []) if creator is not None else []) + made
        return task

    sys.set_coroutine_origin_tracking_depth(64)
    loop.set_task_factory(factory)
    ref = await start_reference(LOOPBACK, LOOPBACK, 64 << 20)
    gw = Gateway(demo_config(ref.ports, http=LOOPBACK, grpc=LOOPBACK, metrics=LOOPBACK))
    walk = Walk()
    try:
        ports = await gw.start()
        assert ports.http is not None
        status = await asyncio.to_thread(post, ports.http)  # (warm: a connection to the backend)
        assert status == 200, status
        sys.setprofile(walk)
        walk.active = True
        status = await asyncio.to_thread(post, ports.http)
        walk.active = False
        sys.setprofile(None)
        print(orjson.dumps({"out": walk.out, "back": sorted(walk.back), "status": status}).decode())
    finally:
        sys.setprofile(None)
        await gw.stop()
        await ref.stop(grace=1.0)


if __name__ == "__main__":
    asyncio.run(main())
