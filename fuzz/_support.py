"""What every harness shares: the bug exception, instrumentation, the atheris entry point."""
from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["FuzzBug", "check", "instrumented", "run", "same_value"]


class FuzzBug(AssertionError):
    """A harness's differential or contract check failed (libFuzzer reports it as a crash)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise FuzzBug(message)


def same_value(a: Any, b: Any) -> bool:
    """Equality that takes NaN as equal to NaN (parameters may carry NaN through JSON)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@contextlib.contextmanager
def instrumented(enabled: bool, include: Sequence[str], exclude: Sequence[str] = ()) -> Iterator[None]:
    """Instrument the modules imported in the block (coverage for libFuzzer) when ``enabled``
    (the harness runs as ``__main__`` under atheris); a no-op under pytest.

    atheris 3.0 leaks the result of every traced ``==`` between a numpy array and a scalar
    (about the array's size per call): modules doing that per input go in ``exclude``."""
    if not enabled:
        yield
        return
    import atheris

    with atheris.instrument_imports(include=list(include), exclude=list(exclude)):
        yield


def run(one_input: Callable[[bytes], None], argv: Sequence[str] | None = None) -> None:
    """Hand ``one_input`` to libFuzzer with ``argv`` (default ``sys.argv``): -runs=N,
    -max_total_time=S, -dict=FILE, corpus directories… (libFuzzer's own flags)."""
    import atheris

    atheris.Setup(list(sys.argv if argv is None else argv), one_input)
    atheris.Fuzz()
