"""One dedicated thread that runs blocking calls for the event loop, one at a time, in order.

:meth:`WriterThread.call` hands ``fn(*args)`` to the thread through a ``queue.SimpleQueue``
and awaits an asyncio future that the thread resolves with one ``call_soon_threadsafe``.
That is the whole hop: no ``concurrent.futures`` work item, no chained future, no executor
bookkeeping (``run_in_executor`` cost two extra loop callbacks and a lock per write).

:meth:`WriterThread.group` is the group commit's hop (issue 15): items queued for the same
handler are taken together by the thread — everything queued while it was busy, up to a size
bound — handed to ``handler(items)`` in one call, and all their futures are resolved by ONE
loop callback. Batching, planning and committing thus run entirely on the thread; the loop
only queues an item and later runs one callback per batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")
Handler = Callable[[list[Any]], Sequence[Any]]
"""A group handler: one result per item, the item's value or the exception (an instance) its
caller gets raised."""
_STOP = object()
_get_running_loop = asyncio.get_running_loop


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _settle_all(futures: list[asyncio.Future[Any]], results: Sequence[Any], after: Callable[[], None] | None) -> None:
    for future, value in zip(futures, results):
        if not future.done():
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)
    if after is not None:
        after()


class _Grouped(NamedTuple):
    """One item queued for a handler (:meth:`WriterThread.group`); a NamedTuple built without
    a Python frame, one per append."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    handler: Handler
    item: Any
    size: int
    after: Callable[[], None] | None


_new_grouped = tuple.__new__


class WriterThread:
    """A started-on-demand daemon thread running submitted calls in submission order."""

    def __init__(self, name: str, *, max_group_size: int = 4000) -> None:
        self._name = name
        self.max_group_size = max_group_size
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _main(self) -> None:
        inbox = self._inbox
        pending = None
        while True:
            item = inbox.get() if pending is None else pending
            pending = None
            if item is _STOP:
                return
            if type(item) is _Grouped:
                pending = self._run_group(item)
                continue
            loop, future, fn, args = item
            try:
                result = (True, fn(*args))
            except BaseException as exc:  # handed to the awaiting caller
                result = (False, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, *result)
            except RuntimeError:  # the loop is closed: nobody awaits the result any more
                pass

    def _run_group(self, first: _Grouped) -> Any:
        """Take ``first`` and the items queued behind it for the same handler and loop (up to
        the size bound), run the handler once, settle them with one loop callback. Returns an
        item taken from the queue that belongs to something else (run next), or None.

        As :class:`~events.store.writer.GroupCommitWriter`, a call whose caller gave up before
        its batch began is not handled: the items, their futures and that check in one pass."""
        handler, loop, get_nowait, bound = first.handler, first.loop, self._inbox.get_nowait, self.max_group_size
        futures: list[asyncio.Future[Any]] = []
        items: list[Any] = []
        size, pending = first.size, None
        add_future, add_item = futures.append, items.append
        if not first.future.cancelled():
            add_future(first.future)
            add_item(first.item)
        while size < bound:
            try:
                nxt = get_nowait()
            except queue.Empty:
                break
            if type(nxt) is not _Grouped or nxt[2] is not handler or nxt[0] is not loop:
                pending = nxt
                break
            size += nxt[4]
            future = nxt[1]
            if not future.cancelled():
                add_future(future)
                add_item(nxt[3])
        if not items:
            return pending
        try:
            results = handler(items)
        except BaseException as exc:  # handed to every caller of the batch
            results = [exc] * len(items)
        try:
            loop.call_soon_threadsafe(_settle_all, futures, results, first.after)
        except RuntimeError:  # the loop is closed
            pass
        return pending

    @property
    def started(self) -> bool:
        """Whether the thread runs (started by a call, not yet stopped)."""
        return self._thread is not None

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result or exception. A cancelled caller does not
        stop a call already running (a transaction in flight completes or rolls back)."""
        self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._inbox.put((loop, future, fn, args))
        return await future

    def group(
        self, handler: Handler, item: Any, size: int = 1, after: Callable[[], None] | None = None
    ) -> asyncio.Future[Any]:
        """Queue ``item`` for ``handler``; the future of its own result (await it on the
        running loop). ``handler(items)`` runs on the thread with every item queued for it at
        the time (up to ``max_group_size`` in sizes) and returns one result per item
        (:data:`Handler`). ``after`` runs on the loop once the batch's futures are settled."""
        return self.grouper(handler, after)(item, size)

    def grouper(
        self, handler: Handler, after: Callable[[], None] | None = None
    ) -> Callable[[Any, int], asyncio.Future[Any]]:
        """:meth:`group` with ``handler`` and ``after`` bound: ``submit(item, size)``. A plain
        function, not a coroutine, and the only frame of the hand-off (issue 23 step 6)."""
        inbox_put, new_grouped, running_loop = self._inbox.put, _new_grouped, _get_running_loop

        def submit(item: Any, size: int) -> asyncio.Future[Any]:
            if self._thread is None:
                self._start()
            loop = running_loop()
            future = loop.create_future()
            inbox_put(new_grouped(_Grouped, (loop, future, handler, item, size, after)))
            return future

        return submit

    async def stop(self) -> None:
        """Let queued calls finish, then end the thread."""
        if self._thread is not None:
            self._inbox.put(_STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
