"""Python functions around the front end's coroutines, for libraries that look at what they
are given (this module is not compiled; setup.py compiles the front end modules on the hot path).

Starlette's ``Route`` serves an endpoint as a request handler only when ``inspect.isfunction``
says it is a function, else it calls it as a raw ASGI app; a mypyc-compiled function (or a
functools.partial of one) is a callable object, not a function. The exception handler is
wrapped the same way, so what Starlette is given never depends on whether the front end was
compiled.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["endpoint_function", "handler_function"]

R = TypeVar("R")
A = TypeVar("A")
B = TypeVar("B")


def endpoint_function(run: Callable[[A], Awaitable[R]]) -> Callable[[A], Awaitable[R]]:
    """``run(request)`` as a Python coroutine function."""
    async def endpoint(request: A) -> R:
        return await run(request)

    return endpoint


def handler_function(handle: Callable[[A, B], Awaitable[R]]) -> Callable[[A, B], Awaitable[R]]:
    """``handle(request, exc)`` as a Python coroutine function."""
    async def handler(request: A, exc: B) -> R:
        return await handle(request, exc)

    return handler
