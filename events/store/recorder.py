"""Recorders: the SQL side of the store, as a small ladder (after the ``eventsourcing`` library).

* :class:`AggregateRecorder` — streams: one write transaction per batch of append calls
  (lock, plan in memory, one ``executemany`` insert), and reading one stream.
* :class:`ApplicationRecorder` — adds the global order: rows by position range, head position.
* :class:`SubscribableRecorder` — adds a commit signal so live readers wake up at once
  (other processes' commits are picked up by polling).

Positions are allocated by the writer as ``max(position) + 1, …`` *while holding the
database's write lock*: ``BEGIN IMMEDIATE`` on SQLite, ``pg_advisory_xact_lock`` on
PostgreSQL. Why the lock on PostgreSQL: with a sequence (``BIGSERIAL``), transaction A can take
position 10 and transaction B position 11, and B can commit first; a reader polling
``position > 9`` then sees 11, moves its cursor past 10 and never sees A's event. Under the
advisory lock, B cannot allocate until A has committed (or rolled back, freeing nothing:
positions stay gap-free), so allocation order equals commit order, and a reader that sees
``N + 1`` has already been able to see ``N``. The same lock makes the hash chain
(:mod:`events.chain`) follow position order: each row's hash is computed from the head row's
hash read under the lock. PostgreSQL makes a commit visible before it
releases the transaction's locks, and under READ COMMITTED B's ``max(position)`` (a new
statement after the lock) sees A's rows. The same lock makes the hash chain
(:mod:`events.chain`) follow position order: each batch chains from the head row's hash, read
under the lock.

No code path here updates or deletes an event row; the database's triggers refuse it anyway.
"""

from __future__ import annotations

import asyncio
import operator
import random
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.gc_pause import gc_paused
from events.store.backends import HEAD, Backend
from events.store.errors import ConcurrencyError, StoreError
from events.store.planning import AppendCall, BatchState, Existing, Settled, plan_calls
from events.store.rows import StoredRow
from events.store.schema import ROW_COLUMNS, events

_is_bulk = operator.itemgetter(3)  # AppendCall.bulk
_stream_of = operator.itemgetter(1)  # AppendCall.stream_id
_IN_CHUNK = 900  # bound on parameters per IN (...) list
_MAX_CACHED_STREAMS = 100_000
# The Core selects below as SQL for the backend's raw read (same columns, filters and order).
_SELECT_STREAM = f"SELECT {', '.join(ROW_COLUMNS)} FROM events WHERE stream_id = ? AND version >= ? ORDER BY version"
_STREAM_VERSION = "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = ?"
_MAX_POSITION = "SELECT coalesce(max(position), 0) FROM events"
Outcome = Settled | StoreError


class OptimisticConflict(Exception):
    """An optimistic batch hit a stored event id: roll back and plan it with the ids looked up."""


def _chunks(items: Sequence[str]) -> list[Sequence[str]]:
    return [items[i : i + _IN_CHUNK] for i in range(0, len(items), _IN_CHUNK)]


class AggregateRecorder:
    """Appends batches of calls in one transaction; reads a stream.

    Keeps a cache of stream versions that is valid only while the head position equals the
    head after this recorder's last commit: the log is append-only (enforced by triggers),
    so an unchanged head proves nobody else wrote in between.
    """

    def __init__(self, backend: Backend, *, retry_deadline_s: float = 60.0) -> None:
        self.backend = backend
        self.retry_deadline_s = retry_deadline_s
        self._versions: dict[str, int] = {}
        self._versions_head: int | None = None

    # --- writing -----------------------------------------------------------------------
    async def write_batch(self, calls: Sequence[AppendCall]) -> list[Outcome]:
        """Run ``calls`` in one durable transaction; one outcome per call (the value its
        caller gets, :data:`~events.store.planning.Settled`, or the StoreError that call alone
        failed with). Lock contention (``database is locked``,
        deadlock) is retried here for up to ``retry_deadline_s`` and never reaches a caller
        before that; any other database error propagates (nothing committed)."""
        deadline, delay = time.monotonic() + self.retry_deadline_s, 0.005
        while True:
            try:
                try:
                    return await self.backend.run_write(self.write_in, calls, True)
                except OptimisticConflict:
                    return await self.backend.run_write(self.write_in, calls, False)
            except Exception as exc:
                self._check_retry(exc, deadline)
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)

    def write_batch_blocking(self, calls: Sequence[AppendCall]) -> list[Outcome]:
        """:meth:`write_batch` run on the backend's own writer thread (SQLite:
        ``backend.write_now``), waiting between retries with ``time.sleep``."""
        deadline, delay = time.monotonic() + self.retry_deadline_s, 0.005
        while True:
            try:
                try:
                    return self.backend.write_now(self.write_in, calls, True)
                except OptimisticConflict:
                    return self.backend.write_now(self.write_in, calls, False)
            except Exception as exc:
                self._check_retry(exc, deadline)
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)

    def _check_retry(self, exc: Exception, deadline: float) -> None:
        """After a failed attempt: re-raise ``exc`` unless it is lock contention and the
        deadline (``time.monotonic()``) has not passed."""
        self._forget_versions()
        if not self.backend.is_transient(exc) or time.monotonic() > deadline:
            raise exc

    def write_in(self, conn: Connection, calls: Sequence[AppendCall], optimistic: bool = False) -> list[Outcome]:
        """Lock, plan and insert ``calls`` inside the open transaction on the sync ``conn``
        (commit is the caller's job). Tests holding a transaction open call it directly.
        One outcome per call: the value its caller gets (:data:`Settled`) or its StoreError.

        ``optimistic`` (no bulk call in the batch): plan without looking up the event ids,
        since a new event's id is not stored yet — one query less per batch. A call refused
        for its version (a retry after a lost acknowledgement carries a stale one) makes the
        batch look the ids up and plan again; an insert refused by the database (a stored id
        re-sent with a matching version) raises :class:`OptimisticConflict`, after which the
        caller rolls back and runs the batch again with ``optimistic=False``."""
        self.backend.lock_for_append(conn)
        optimistic = optimistic and not any(map(_is_bulk, calls))
        now_us = time.time_ns() // 1000
        state, outcomes = self._plan(conn, calls, now_us, lookup=not optimistic)
        if optimistic and ConcurrencyError in map(type, outcomes):  # C-level scans: per row
            self._forget_versions()  # planned in place: the stored versions are read again
            state, outcomes = self._plan(conn, calls, now_us, lookup=True)
            optimistic = False
        if state.inserts:
            try:
                self.backend.insert_rows(conn, state.inserts)
            except Exception as exc:
                if optimistic and isinstance(exc, (sa.exc.IntegrityError, sqlite3.IntegrityError)):
                    raise OptimisticConflict("an event id of the batch is already stored") from exc
                raise
        self._versions_head = state.head  # the cache now holds the versions this commit leaves
        return outcomes

    def _plan(
        self, conn: Connection, calls: Sequence[AppendCall], now_us: int, *, lookup: bool
    ) -> tuple[BatchState, list[Outcome]]:
        state = self._load_state(conn, calls, lookup=lookup)
        return state, plan_calls(state, calls, now_us)

    def _load_state(self, conn: Connection, calls: Sequence[AppendCall], *, lookup: bool = True) -> BatchState:
        """The batch's state, planned in place on the version cache: the cache is marked stale
        (``_versions_head = None``) until :meth:`write_in` has inserted the batch, so a batch
        that fails (or is rolled back) leaves a cache the next batch clears. The streams are
        the calls' own (a plain call's rows are all of its stream), a bulk call's its rows'."""
        backend = self.backend
        head, head_hash = backend.select_tip(conn)
        versions = self._versions
        if head != self._versions_head or len(versions) > _MAX_CACHED_STREAMS:
            versions.clear()
        self._versions_head = None
        # the streams not cached (a bulk call's None: its rows' streams); one pass over the
        # calls, none at all when every stream is cached (the live path's batches)
        missing: set[str | None] = {s for s in map(_stream_of, calls) if s not in versions}
        if None in missing:
            missing.discard(None)
            missing.update(r.stream_id for c in calls if c.bulk for r in c.rows if r.stream_id not in versions)
        if missing:
            for chunk in _chunks(sorted(missing)):  # type: ignore[arg-type]
                versions.update(backend.select_versions(conn, chunk))
        state = BatchState(head=head, head_hash=head_hash, versions=versions)  # type: ignore[arg-type]
        if lookup:
            for chunk in _chunks([r.event_id for c in calls for r in c.rows]):
                for eid, *stored in backend.select_existing(conn, chunk):
                    state.existing[eid] = Existing(*stored)
        return state

    def _forget_versions(self) -> None:
        self._versions.clear()
        self._versions_head = None

    async def close(self) -> None:
        await self.backend.dispose()

    # --- reading -----------------------------------------------------------------------
    async def select_stream(self, stream_id: str, *, from_version: int = 1) -> list[StoredRow]:
        """Rows of one stream with ``version >= from_version``, in version order."""
        fetched: Sequence[Any] | None = await self._read_raw(_SELECT_STREAM, (stream_id, from_version))
        if fetched is None:
            q = (
                sa.select(*events.c)
                .where(events.c.stream_id == stream_id, events.c.version >= from_version)
                .order_by(events.c.version)
            )
            async with self.backend.reader.connect() as conn:
                fetched = (await conn.execute(q)).all()
        return list(map(StoredRow._make, fetched))

    async def _read_raw(self, sql: str, parameters: tuple[Any, ...]) -> list[Any] | None:
        """``sql``'s rows through the backend's one-hop raw read (SQLite), or None where the
        backend has none (PostgreSQL) or the driver raised: the caller then runs its Core
        select, which returns or raises exactly what it did before the raw path existed (a
        text that is not UTF-8: SQLAlchemy's OperationalError)."""
        raw = self.backend.read_raw
        if raw is None:
            return None
        try:
            return await raw(sql, parameters)
        except sqlite3.Error:
            return None


class ApplicationRecorder(AggregateRecorder):
    """Adds reads in global (commit) order."""

    async def select_rows(
        self, from_position: int, *, until_position: int | None = None, limit: int = 1000, stream_id: str | None = None
    ) -> list[StoredRow]:
        """Up to ``limit`` rows with ``from_position <= position <= until_position`` (no upper
        bound when None), optionally of one stream, in position order."""
        raw = self.backend.select_rows_raw
        if raw is not None:
            fetched = await raw(from_position, until_position, limit, stream_id)
            with gc_paused():  # a batch of rows that all live on (events.gc_pause)
                return list(map(StoredRow._make, fetched))
        q = sa.select(*events.c).where(events.c.position >= from_position)
        if until_position is not None:
            q = q.where(events.c.position <= until_position)
        if stream_id is not None:
            q = q.where(events.c.stream_id == stream_id)
        q = q.order_by(events.c.position).limit(limit)
        async with self.backend.reader.connect() as conn:
            return list(map(StoredRow._make, (await conn.execute(q)).all()))

    async def stream_version(self, stream_id: str) -> int:
        """The last version of ``stream_id`` (0 when it has no events)."""
        fetched = await self._read_raw(_STREAM_VERSION, (stream_id,))
        if fetched is not None:
            return int(fetched[0][0])
        q = sa.select(sa.func.coalesce(sa.func.max(events.c.version), 0)).where(events.c.stream_id == stream_id)
        async with self.backend.reader.connect() as conn:
            return int((await conn.execute(q)).scalar_one())

    async def max_position(self) -> int:
        """The head position (0 for an empty log)."""
        fetched = await self._read_raw(_MAX_POSITION, ())
        if fetched is not None:
            return int(fetched[0][0])
        async with self.backend.reader.connect() as conn:
            return int((await conn.execute(HEAD)).scalar_one())


class CommitSignal:
    """Wakes live readers in this process after each commit."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        """Take this *before* reading, then wait on it: a commit in between is not missed."""
        return self._event

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()


class SubscribableRecorder(ApplicationRecorder):
    """Adds :attr:`committed`, fired after every batch this recorder commits."""

    def __init__(self, backend: Backend, **kw: float) -> None:
        super().__init__(backend, **kw)
        self.committed = CommitSignal()

    async def write_batch(self, calls: Sequence[AppendCall]) -> list[Outcome]:
        outcomes = await super().write_batch(calls)
        self.committed.fire()
        return outcomes
