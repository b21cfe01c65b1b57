"""Start an awaitable at once, in the caller's step, and finish it in a task (issue 15).

Python 3.12's ``asyncio.eager_task_factory`` runs a new task's first step synchronously; this
project runs on 3.11, so :func:`start_eagerly` does the same for one awaitable: the session
makes its Stage0 engine call (vLLM's ``add_request`` happens in the first step of a
``generate`` iterator's first ``__anext__``) inside ``commit()``'s own step instead of one
event-loop pass later, when the turn task would first run — on a loaded 2-core machine that
pass was the whole of the added commit → ``add_request`` latency (bench_live_overhead).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def start_eagerly(awaitable: Awaitable[T]) -> asyncio.Future[T]:
    """Run ``awaitable``'s first step now (in a copy of the current context, like a task's)
    and return a future of its result: done already when the first step finished it, else a
    task that continues it from where it suspended. An exception of the first step is set on
    the returned future, not raised. Cancelling the returned task throws CancelledError into
    ``awaitable`` where it waits, as for any task. What the first step runs sees the caller's
    task as ``asyncio.current_task()``: use it for code that does not care (an engine call)."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    steps = awaitable.__await__()
    try:
        yielded = context.run(steps.send, None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side, as a task would
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(exc)
        return failed
    return loop.create_task(_finish(_Resumed(steps, yielded)), context=context)


def run_eagerly(awaitable: Awaitable[Any]) -> asyncio.Task[Any] | None:
    """Run ``awaitable``'s first step now, in the caller's context: None when that step
    finished it (its result dropped; its exception raised here, as an await would), else a
    task that continues it from where it suspended. For a call that almost never waits (a
    socket send while the transport is writable): no future is made when it does not."""
    steps = awaitable.__await__()
    try:
        yielded = steps.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_finish(_Resumed(steps, yielded)))


async def _finish(resumed: _Resumed[T]) -> T:
    return await resumed


class _Resumed(Generic[T]):
    """``awaitable`` after its first step, which yielded ``yielded`` (the future it waits on,
    or None for a bare yield): awaiting this drives it on from there."""

    def __init__(self, awaitable: Generator[Any, Any, T], yielded: Any) -> None:
        self.awaitable = awaitable
        self.yielded = yielded

    def __await__(self) -> Generator[Any, Any, T]:
        return _drive(self.awaitable, self.yielded)


def _drive(awaitable: Generator[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            awaitable.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - thrown in by the task (CancelledError): passed on
            try:
                yielded = awaitable.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = awaitable.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
