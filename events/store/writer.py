"""Group commit: one writer task turns many concurrent append calls into few transactions.

Callers :meth:`GroupCommitWriter.submit` a call and await its future. The writer task takes
everything queued (up to ``max_batch_rows`` rows), runs it as one transaction through
``write_batch`` and resolves each future with that call's own outcome — only after the
transaction committed, so an append returns only once its events are durable. While one
transaction runs, new calls queue up and form the next batch.

Isolation: when the database refuses a whole batch (not a typed per-call error, which the
planner already confines to its call), each call of it is retried in a transaction of its
own, so only the call at fault fails — with :class:`AppendFailed` carrying the driver's
reason — and its neighbours commit (issue 11: one bad append must not fail a live session's
neighbours).

:class:`ThreadGroupCommit` keeps the same contract for a backend that owns a writer thread
(SQLite): batching, planning, committing and the isolation retries all run on that thread
(:meth:`WriterThread.group`), and one loop callback per batch resolves its callers (issue 15:
the loop-side writer task cost a task wake-up, a future and a queue hop per batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from events.store.errors import AppendFailed, StoreClosed, StoreError
from events.store.planning import AppendCall, Settled
from events.store.writer_thread import WriterThread

WriteBatch = Callable[[Sequence[AppendCall]], Awaitable[list[Any]]]
BlockingWriteBatch = Callable[[Sequence[AppendCall]], list[Any]]


class GroupCommitWriter:
    def __init__(self, write_batch: WriteBatch, *, max_batch_rows: int = 4000) -> None:
        self._write_batch = write_batch
        self._max_batch_rows = max_batch_rows
        self._queue: asyncio.Queue[tuple[AppendCall, asyncio.Future[Settled]] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def submit(self, call: AppendCall) -> Settled:
        """Queue ``call`` and wait until it is committed; its :data:`Settled` value. Raises the
        call's StoreError, the database error that failed its whole batch, or StoreClosed."""
        if self._closed:
            raise StoreClosed("the event store is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="duplex-ledger-writer")
        future: asyncio.Future[Settled] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((call, future))
        return await future

    async def _run(self) -> None:
        pending: tuple[AppendCall, asyncio.Future[Settled]] | None = None
        while True:
            item = pending or await self._queue.get()
            pending = None
            if item is None:
                return
            # Let callers woken by the previous commit queue their next calls first.
            await asyncio.sleep(0)
            batch = [item]
            rows = len(item[0].rows)
            while not self._queue.empty() and rows < self._max_batch_rows:
                nxt = self._queue.get_nowait()
                if nxt is None:
                    self._queue.put_nowait(None)  # stop after this batch
                    break
                batch.append(nxt)
                rows += len(nxt[0].rows)
            live = [(c, f) for c, f in batch if not f.cancelled()]
            if live:
                await self._commit(live)

    async def _commit(self, batch: list[tuple[AppendCall, asyncio.Future[Settled]]]) -> None:
        try:
            outcomes = await self._write_batch([c for c, _ in batch])
        except asyncio.CancelledError:
            for _, f in batch:
                if not f.done():
                    f.set_exception(StoreClosed("the event store was closed during the append"))
            raise
        except Exception as exc:  # the whole transaction failed: find the call at fault
            if len(batch) > 1:
                for one in batch:
                    await self._commit([one])
                return
            _, future = batch[0]
            if not future.done():
                future.set_exception(exc if isinstance(exc, StoreError) else append_failed(exc))
            return
        for (_, f), outcome in zip(batch, outcomes):
            if f.done():
                continue
            if isinstance(outcome, BaseException):
                f.set_exception(outcome)
            else:
                f.set_result(outcome)

    async def close(self) -> None:
        """Stop accepting calls, let queued ones commit, stop the task."""
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(None)
            await self._task
            self._task = None


def append_failed(exc: BaseException) -> AppendFailed:
    """A driver error as :class:`AppendFailed`: the first line of the driver's own message
    (SQLAlchemy's wrapper adds the SQL and parameters, which can be megabytes)."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__]
    failed = AppendFailed(f"the database refused the append: {type(exc).__name__}: {reason[0][:300]}")
    failed.__cause__ = exc
    return failed


def commit_isolated(write_batch: BlockingWriteBatch, calls: list[AppendCall]) -> list[Any]:
    """``write_batch(calls)``: per call its :data:`Settled` value or its exception (the
    protocol of :meth:`WriterThread.group`'s handlers); when the database refuses the whole
    batch, each call runs alone so that only the call at fault fails (module doc)."""
    try:
        return write_batch(calls)
    except Exception as exc:
        if len(calls) > 1:
            return [result for call in calls for result in commit_isolated(write_batch, [call])]
        return [exc if isinstance(exc, StoreError) else append_failed(exc)]


class ThreadGroupCommit:
    """:class:`GroupCommitWriter`'s contract, run on ``thread`` (module doc). ``after`` runs on
    the loop after each batch (the commit signal)."""

    def __init__(self, thread: WriterThread, write_batch: BlockingWriteBatch, after: Callable[[], None]) -> None:
        # one handler object: the thread groups the items queued for it
        self.submit_sized = thread.grouper(partial(commit_isolated, write_batch), after)
        """``submit_sized(call, len(call.rows))``: :meth:`submit` without its frame or the
        closed check (:meth:`EventStore.append` does that check; issue 23 step 6)."""
        self._closed = False

    def submit(self, call: AppendCall) -> Awaitable[Settled]:
        """Queue ``call``; awaiting the result waits until it is committed and gives its
        :data:`Settled` value (as :meth:`GroupCommitWriter.submit`). Raises StoreClosed at once
        when closed."""
        if self._closed:
            raise StoreClosed("the event store is closed")
        return self.submit_sized(call, len(call.rows))

    async def close(self) -> None:
        """Stop accepting calls; those queued commit before the thread's next work."""
        self._closed = True
