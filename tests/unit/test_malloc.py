"""Allocator tuning applies on glibc and respects the opt-out and explicit settings."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from gateway.malloc import tune_malloc; print(tune_malloc(256 << 20))"


def run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_applies_on_glibc():
    assert run({}) == "True"


def test_opt_out_and_explicit_env_win():
    assert run({"OIP_GATEWAY_MALLOC_TUNING": "0"}) == "False"
    assert run({"MALLOC_MMAP_THRESHOLD_": "131072"}) == "False"


def test_no_trim_while_a_large_request_is_in_flight():
    """A large request taking longer than the quiet period is not quiet: the trim waits for it."""
    import asyncio
    import time

    from gateway.malloc import IdleTrimmer

    async def scenario() -> tuple[int, int]:
        state = {"busy": True}
        last = time.monotonic() - 10  # the last large request entered long ago...
        trimmer = IdleTrimmer(lambda: last, quiet_s=0.01, period_s=0.01, busy=lambda: state["busy"])
        calls: list[int] = []
        trimmer._trim = calls.append  # type: ignore[assignment]  # (record, not trim)
        task = asyncio.get_running_loop().create_task(trimmer.run())
        try:
            for _ in range(20):  # ...and is still in flight: 20 periods, no trim
                await asyncio.sleep(0.01)
            during = len(calls)
            state["busy"] = False
            deadline = time.monotonic() + 5
            while not calls and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return during, len(calls)
        finally:
            task.cancel()

    during, after = asyncio.run(scenario())
    assert during == 0 and after >= 1


def test_passes_go_on_while_memory_is_still_being_freed(monkeypatch):
    """Answers to the last large requests are written after they left admission control: the
    passes go on while one gives back, or RSS moved between two, 8 MiB or more; two calm ones end
    them."""
    import asyncio

    import gateway.malloc as malloc

    mib = 1 << 20
    # RSS read before and after each pass: three large trims, memory freed between the third and
    # fourth (a slow client done reading), then calm.
    readings = iter(v * mib for v in (1000, 700, 700, 400, 400, 300, 100, 100, 100, 100, 100, 100, 100, 100))
    monkeypatch.setattr(malloc, "_rss", lambda: next(readings))
    trimmer = malloc.IdleTrimmer(lambda: 1.0, quiet_s=0.001)
    trimmer._trim = lambda pad: 0  # type: ignore[assignment]
    asyncio.run(trimmer._passes(1.0))
    assert trimmer.trims == 6  # 3 giving back, 1 after RSS moved by itself, 2 calm


def test_a_trim_pass_first_lets_go_of_the_pooled_buffers():
    """Buffers kept for reuse outside the allocator (rawbody.release_buffers) are let go before
    the trim, so their pages can go back too."""
    import asyncio

    import gateway.malloc as malloc

    order: list[str] = []
    trimmer = malloc.IdleTrimmer(lambda: 1.0, quiet_s=0.001, release=lambda: order.append("release") or 0)
    trimmer._trim = lambda pad: order.append("trim") or 0  # type: ignore[assignment]
    asyncio.run(trimmer._once())
    assert order == ["release", "trim"]
