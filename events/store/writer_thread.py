"""One dedicated thread that runs blocking calls for the event loop, one at a time, in order.

:meth:`WriterThread.call` hands ``fn(*args)`` to the thread through a ``queue.SimpleQueue``
and awaits an asyncio future that the thread resolves with one ``call_soon_threadsafe``.
That is the whole hop: no ``concurrent.futures`` work item, no chained future, no executor
bookkeeping (``run_in_executor`` cost two extra loop callbacks and a lock per write; the
SQLite group commit pays the hop once per transaction, issue 15).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class WriterThread:
    """A started-on-demand daemon thread running submitted calls in submission order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _main(self) -> None:
        inbox = self._inbox
        while True:
            item = inbox.get()
            if item is None:
                return
            loop, future, fn, args = item
            try:
                result = (True, fn(*args))
            except BaseException as exc:  # handed to the awaiting caller
                result = (False, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, *result)
            except RuntimeError:  # the loop is closed: nobody awaits the result any more
                pass

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result or exception. A cancelled caller does not
        stop a call already running (a transaction in flight completes or rolls back)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._inbox.put((loop, future, fn, args))
        return await future

    async def stop(self) -> None:
        """Let queued calls finish, then end the thread."""
        if self._thread is not None:
            self._inbox.put(None)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
