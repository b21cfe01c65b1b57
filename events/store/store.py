"""The event store: the async API the rest of the ledger uses.

    store = await EventStore.open("sqlite+aiosqlite:///ledger.db", create=True)
    positions = await store.append("S1", [SessionOpened(session_id="S1", ts=...)], expected_version=0)
    async for stored in store.read_all(from_position=1): ...
    await store.close()

Positions start at 1, are gap-free and follow commit order; stream versions start at 1.
``from_position`` / ``until_position`` bounds are inclusive (0 and 1 both mean "from the
start").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from events.records import StoredEvent
from events.store.backends import Synchronous, check_synchronous, make_backend
from events.store.errors import StoreClosed
from events.store.migrate import check_revision, upgrade
from events.store.planning import AppendCall, CallResult
from events.store.probe import read_sqlite
from events.store.recorder import SubscribableRecorder
from events.store.rows import ImportRow, NewRow, StoredRow, decode_rows
from events.store.url import backend_of, resolve_url
from events.store.writer import GroupCommitWriter, ThreadGroupCommit
from events.types import EventBase

T = TypeVar("T")
_checked = NewRow.checked
_new_tuple = tuple.__new__  # AppendCall built without its generated __new__'s frame


@dataclass(frozen=True, slots=True)
class ImportResult:
    """``positions``: one per input row (original position for rows already stored);
    ``appended``: rows written now; ``skipped``: rows that were already stored."""

    positions: list[int]
    appended: int

    @property
    def skipped(self) -> int:
        return len(self.positions) - self.appended


class EventStore:
    """Append-only, totally ordered event log on SQLite or PostgreSQL (see module doc)."""

    def __init__(self, url: str, recorder: SubscribableRecorder, *, max_batch_rows: int = 4000) -> None:
        self.url = url
        self.recorder = recorder
        thread = recorder.backend.writer_thread
        if thread is not None:
            thread.max_group_size = max_batch_rows
        self._writer: GroupCommitWriter | ThreadGroupCommit
        if thread is None:
            self._writer = GroupCommitWriter(recorder.write_batch, max_batch_rows=max_batch_rows)
            self._submit: Callable[[AppendCall, int], Awaitable[Any]] = _unsized(self._writer.submit)
        else:
            self._writer = ThreadGroupCommit(thread, recorder.write_batch_blocking, recorder.committed.fire)
            self._submit = self._writer.submit_sized

    @classmethod
    async def open(
        cls,
        url: str | None = None,
        *,
        create: bool = False,
        read_only: bool = False,
        synchronous: Synchronous | None = None,
        busy_timeout_ms: int = 30_000,
        max_batch_rows: int = 4000,
        tolerate_missing: bool = False,
    ) -> EventStore:
        """Open the log at ``url`` (default: ``$DUPLEX_LEDGER_DB_URL`` or ``./duplex-ledger.db``).

        ``create=True`` first upgrades the schema to the code's revision (creating the SQLite
        file and its folder when missing; any number of processes may do so at once, on
        PostgreSQL too). Without it, a SQLite file is first inspected read-only, so a file that
        is not a ledger at this code's revision is refused byte-identical. ``read_only=True``
        (not with ``create``): readers open a SQLite file through a ``mode=ro`` URI and appends
        raise ReadOnlyStore. ``synchronous`` (SQLite only): FULL (an acknowledged append
        survives power loss) or NORMAL (the commits since the last WAL checkpoint may be lost on
        power loss or an OS crash, never on a process crash); None (default): the URL's
        ``?synchronous=FULL|NORMAL``, else FULL. Raises LedgerNotFound (without creating anything) for a SQLite file
        that does not exist when ``create`` is false; NotALedger for another application's
        database, a directory or a non-database file; SchemaRevisionError when the schema is
        missing, older or newer than the code (the message says what to run); ValueError for
        an empty or unsupported URL; ForeignSchemaObject for a SQLite file holding a trigger,
        view or index the ledger did not create; MissingSchemaObject for a ledger lacking one of
        its own (a guard trigger dropped or, on PostgreSQL, disabled) unless
        ``tolerate_missing`` (``verify``, which reports it as tampering).
        """
        url = resolve_url(url)
        check_synchronous(synchronous)
        if create and read_only:
            raise ValueError("EventStore.open: create and read_only exclude each other")
        sqlite = backend_of(url) == "sqlite"
        if create:
            await upgrade(url)
        if sqlite:
            read_sqlite(url, check_revision, tolerate_missing)
        backend = make_backend(url, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, read_only=read_only)
        if not sqlite:
            try:
                await backend.run_read(check_revision, url, tolerate_missing)
            except BaseException:
                await backend.dispose()
                raise
        return cls(url, SubscribableRecorder(backend), max_batch_rows=max_batch_rows)

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- writing -----------------------------------------------------------------------
    def append(
        self, stream_id: str, events: Sequence[EventBase], expected_version: int | None = None
    ) -> Awaitable[list[int]]:
        """Append ``events`` (all with ``session_id == stream_id``) to the end of the stream.

        ``expected_version``: None = no check; 0 = the stream must not exist yet; N = the
        stream must be at version N. Returns the positions, one per event, once durable.
        Re-appending exactly the same events (same ids, same content) returns their original
        positions and writes nothing. Raises ConcurrencyError(stream_id, expected, actual);
        EventIdConflict when only some ids are stored or a stored copy differs (stream, type,
        schema_version, ts or data); InvalidRow (a ValueError) for a value the store could not
        read back (DOMAIN §5.7 D12); ValueError for an empty batch, a foreign ``session_id`` or
        a repeated event id; AppendFailed when the database refused this call (the other calls
        of its group commit are unaffected); ReadOnlyStore on a read-only store.

        Not a coroutine function (issue 23 step 6: one coroutine level less per append): the
        rows are built and checked at the call, and the group commit's own future (SQLite; a
        coroutine on PostgreSQL) is handed back; every error above is still raised where the
        result is awaited. ``asyncio.ensure_future`` (not ``create_task``) makes it a task.
        """
        try:
            if not events:
                raise ValueError(f"append to {stream_id!r}: no events given")
            if expected_version is not None and expected_version < 0:
                raise ValueError(f"expected_version must be >= 0 or None, got {expected_version}")
            if type(events) is list and len(events) == 1:  # the live path: no comprehension, no scan
                row = _checked(events[0])
                if row[0] != stream_id:
                    raise ValueError(f"event {row[1]} has session_id {row[0]!r}, not the stream {stream_id!r}")
                rows = [row]
            else:
                rows = [_checked(e) for e in events]
                for row in rows:
                    if row.stream_id != stream_id:
                        raise ValueError(
                            f"event {row.event_id} has session_id {row.stream_id!r}, not the stream {stream_id!r}"
                        )
                if len(rows) > 1:
                    _check_unique_ids(rows)
            return self._submit(_new_tuple(AppendCall, (rows, stream_id, expected_version, False)), len(rows))
        except Exception as exc:  # raised where the append is awaited, as from a coroutine
            return _raising(exc)

    async def append_records(self, rows: Iterable[ImportRow]) -> ImportResult:
        """Bulk append across many streams, in one transaction (all rows or none).

        Each row goes to the end of its stream in input order; a row whose event id is
        already stored with the same content is skipped (idempotent re-import). A row with
        ``version`` set must land at exactly that version, else ConcurrencyError (naming the
        row's ``event_id``) and nothing is appended. Raises EventIdConflict if a stored copy
        of an id differs (another stream, other content), InvalidRow / ValueError for a value
        the store could not read back or an id repeated in the input.
        """
        new_rows = [NewRow.from_import(r).check() for r in rows]
        if not new_rows:
            return ImportResult([], 0)
        _check_unique_ids(new_rows)
        result = await self._writer.submit(AppendCall(new_rows, bulk=True))
        assert isinstance(result, CallResult)  # a bulk call's Settled value
        return ImportResult(result.positions, result.appended)

    # --- reading -----------------------------------------------------------------------
    async def read_stream(self, stream_id: str, *, from_version: int = 1) -> list[StoredEvent]:
        """Events of one stream with ``version >= from_version``, decoded (upcast), in order.
        An unknown stream gives ``[]``."""
        return decode_rows(await self.recorder.select_stream(stream_id, from_version=from_version))

    async def read_row_batches(
        self,
        from_position: int = 0,
        *,
        until_position: int | None = None,
        stream_id: str | None = None,
        batch_size: int = 1000,
    ) -> AsyncIterator[list[StoredRow]]:
        """Undecoded rows in position order, as lists of up to ``batch_size`` (each batch a
        short read, so a long export never blocks writers)."""
        cursor = from_position
        while True:
            batch = await self.recorder.select_rows(
                cursor, until_position=until_position, limit=batch_size, stream_id=stream_id
            )
            if batch:
                yield batch
            if len(batch) < batch_size:
                return
            cursor = batch[-1].position + 1

    async def read_rows(
        self,
        from_position: int = 0,
        *,
        until_position: int | None = None,
        stream_id: str | None = None,
        batch_size: int = 1000,
    ) -> AsyncIterator[StoredRow]:
        """Undecoded rows in position order (see :meth:`read_row_batches`)."""
        async for batch in self.read_row_batches(
            from_position, until_position=until_position, stream_id=stream_id, batch_size=batch_size
        ):
            for row in batch:
                yield row

    async def read_batches(
        self,
        from_position: int = 0,
        *,
        until_position: int | None = None,
        batch_size: int = 1000,
    ) -> AsyncIterator[list[StoredEvent]]:
        """Decoded events with ``from_position <= position <= until_position`` in commit order,
        as lists of up to ``batch_size``, each event as its struct (:mod:`events.structs`). Raises what decoding raises
        (UnknownEventType, FutureSchemaVersion, ValidationError…)."""
        async for batch in self.read_row_batches(from_position, until_position=until_position, batch_size=batch_size):
            yield decode_rows(batch)

    async def read_all(
        self,
        from_position: int = 0,
        *,
        until_position: int | None = None,
        batch_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]:
        """Decoded events one by one (see :meth:`read_batches`)."""
        async for batch in self.read_batches(from_position, until_position=until_position, batch_size=batch_size):
            for stored in batch:
                yield stored

    async def subscribe_rows(
        self, from_position: int = 0, *, poll_interval: float = 0.25, batch_size: int = 1000
    ) -> AsyncIterator[StoredRow]:
        """Like :meth:`subscribe`, undecoded."""
        cursor = max(from_position, 1)
        while True:
            signal = self.recorder.committed.current()
            batch = await self.recorder.select_rows(cursor, limit=batch_size)
            for row in batch:
                yield row
                cursor = row.position + 1
            if len(batch) < batch_size:
                try:
                    await asyncio.wait_for(signal.wait(), poll_interval)
                except TimeoutError:
                    pass

    async def subscribe(
        self, from_position: int = 0, *, poll_interval: float = 0.25, batch_size: int = 1000
    ) -> AsyncIterator[StoredEvent]:
        """Catch up from ``from_position`` (inclusive), then follow the log forever.

        Commits through this store wake the iterator at once; commits by other processes are
        seen within ``poll_interval`` seconds. Never skips or repeats a position. Stop it by
        cancelling the consuming task or calling ``aclose()`` on the iterator.
        """
        async for row in self.subscribe_rows(from_position, poll_interval=poll_interval, batch_size=batch_size):
            yield row.decode()

    async def stream_version(self, stream_id: str) -> int:
        """The stream's last version, i.e. how many events it holds (0 for an unknown stream)."""
        return await self.recorder.stream_version(stream_id)

    async def head_position(self) -> int:
        """The last committed position (0 for an empty log)."""
        return await self.recorder.max_position()

    @property
    def backend_name(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.recorder.backend.name

    async def run_read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(sync_connection, *args)`` on a read connection (the read models' and the
        checkpoint's tables; the events are read through the methods above)."""
        return await self.recorder.backend.run_read(fn, *args)

    async def run_write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(sync_connection, *args)`` in one write transaction of the read models'
        tables. The events table refuses updates and deletes whatever ``fn`` tries."""
        return await self.recorder.backend.run_write(fn, *args)

    async def close(self) -> None:
        """Let queued appends commit, then release every connection. Idempotent."""
        self._submit = _refuse_closed
        await self._writer.close()
        await self.recorder.close()


def _check_unique_ids(rows: Sequence[NewRow]) -> None:
    seen: set[str] = set()
    for row in rows:
        if row.event_id in seen:
            raise ValueError(f"event id {row.event_id} appears twice in one append")
        seen.add(row.event_id)


def _unsized(submit: Callable[[AppendCall], Awaitable[Any]]) -> Callable[[AppendCall, int], Awaitable[Any]]:
    """``submit(call)`` as the ``(call, size)`` hand-off :meth:`EventStore.append` calls."""

    def submit_sized(call: AppendCall, _size: int) -> Awaitable[Any]:
        return submit(call)

    return submit_sized


def _refuse_closed(call: AppendCall, size: int) -> Awaitable[Any]:
    """The hand-off of a closed store (raised where the append is awaited)."""
    raise StoreClosed("the event store is closed")


async def _raising(exc: BaseException) -> list[int]:
    """An awaitable that raises ``exc`` (a refused :meth:`EventStore.append`: its error where
    it is awaited, not where it is called)."""
    raise exc
