"""Waiting on what a test observes, not on the clock: a fixed ``sleep`` before an assertion
fails on a loaded 2-core machine (CI stop 19), a bounded poll does not."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0, poll_s: float = 0.01
) -> None:
    """Return once ``check()`` (sync or async) is true; AssertionError after ``timeout_s``
    seconds (monotonic clock) without it."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {getattr(check, '__name__', check)}")
        await asyncio.sleep(poll_s)
