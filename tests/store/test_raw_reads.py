"""The session open's point reads (``read_stream``, ``stream_version``, ``head_position``) on
SQLite go through one hop to a thread owning a plain sqlite3 read connection (issue 23: an open
cost ~0.3 ms of event-loop CPU through SQLAlchemy's async engine). They return exactly what the
Core select returns, on both backends, fail as it does on an edited row, and see every commit
acknowledged before they started."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from events.store import EventStore
from events.store.errors import ReadOnlyStore
from tests.store.helpers import begun, turns


async def _reads(store: EventStore) -> tuple[Any, ...]:
    """Every read the raw path serves, over a fresh stream, whole streams and a tail."""
    return (
        await store.recorder.select_stream("S-fresh"),
        await store.recorder.select_stream("S1"),
        await store.recorder.select_stream("S1", from_version=3),
        await store.recorder.select_stream("S2"),
        await store.read_stream("S1", from_version=2),
        await store.stream_version("S-fresh"),
        await store.stream_version("S1"),
        await store.stream_version("S2"),
        await store.head_position(),
    )


async def test_the_raw_reads_return_what_the_core_select_returns(store: EventStore) -> None:
    await store.append("S1", turns("S1", 5), expected_version=0)
    await store.append("S2", [begun("S2", "r1")], expected_version=0)
    await store.append("S1", turns("S1", 2, start=5), expected_version=5)
    backend = store.recorder.backend
    assert (backend.read_raw is None) == (backend.name == "postgresql")
    fast = await _reads(store)
    backend.read_raw = None  # the Core selects through SQLAlchemy's async engine
    core = await _reads(store)
    assert fast == core
    assert [type(v) for row in fast[1] for v in row] == [type(v) for row in core[1] for v in row]
    assert (len(fast[1]), len(fast[2]), fast[6], fast[7], fast[8]) == (7, 5, 7, 1, 8)


async def _edit(store: EventStore, statement: str) -> None:
    async with store.recorder.backend.reader.begin() as conn:
        await conn.execute(sa.text("DROP TRIGGER events_no_update"))
        await conn.execute(sa.text(statement))


async def _failure(store: EventStore, stream_id: str) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as caught:
        await store.read_stream(stream_id)
    return caught.type, str(caught.value)


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE events SET data = CAST(X'7bff7d' AS TEXT) WHERE position = 2",  # not UTF-8
        "UPDATE events SET version = 'v2' WHERE position = 2",  # retyped: named as an edit
    ],
)
async def test_an_edited_row_fails_as_the_core_read_fails(sqlite_url: str, edit: str) -> None:
    async with await EventStore.open(sqlite_url, create=True) as store:
        await store.append("S1", turns("S1", 3), expected_version=0)
        await _edit(store, edit)
        fast = await _failure(store, "S1")
        store.recorder.backend.read_raw = None
        assert await _failure(store, "S1") == fast
    assert fast[0] in (ValueError, sa.exc.OperationalError)
    assert issubclass(fast[0], DBAPIError) == ("X'" in edit)


async def test_a_read_sees_every_commit_acknowledged_before_it(sqlite_url: str) -> None:
    """The read connection stays open between reads: each autocommit statement takes a new WAL
    snapshot, so another connection's (here: another store's) acknowledged commit is seen."""
    async with await EventStore.open(sqlite_url, create=True) as reader:
        async with await EventStore.open(sqlite_url) as writer:
            for n in range(1, 6):
                await writer.append("S1", turns("S1", 1, start=n), expected_version=n - 1)
                assert await reader.stream_version("S1") == n
                assert [e.version for e in await reader.read_stream("S1")] == list(range(1, n + 1))
                assert await reader.head_position() == 2 * n - 1
                await reader.append("S2", turns("S2", 1, start=n), expected_version=n - 1)
                assert await writer.stream_version("S2") == n
                assert await reader.stream_version("S2") == n


async def test_a_read_only_store_reads_through_a_read_only_connection(sqlite_url: str) -> None:
    async with await EventStore.open(sqlite_url, create=True) as store:
        await store.append("S1", turns("S1", 2), expected_version=0)
    async with await EventStore.open(sqlite_url, read_only=True) as ro:
        assert [e.version for e in await ro.read_stream("S1")] == [1, 2]
        raw = ro.recorder.backend.read_raw
        assert raw is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await raw("DELETE FROM replica_leases", ())
        with pytest.raises(ReadOnlyStore):
            await ro.append("S1", turns("S1", 1, start=2), expected_version=2)


async def test_close_releases_the_read_connection(sqlite_url: str) -> None:
    store = await EventStore.open(sqlite_url, create=True)
    await store.read_stream("S1")
    backend: Any = store.recorder.backend
    assert backend._read_conn is not None
    await store.close()
    assert backend._read_conn is None and backend._read_thread._thread is None


async def test_the_read_connection_is_the_stores_file_after_a_chdir(tmp_path, monkeypatch) -> None:
    """A relative URL names the file in the working directory at the open: the read thread's
    connection, opened at the first read, must not create (and read) another file there after a
    ``chdir`` (hostile retest: a stray empty ``rel.db`` in the new directory); nor recreate a
    ledger file deleted under the store."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    async with await EventStore.open("sqlite+aiosqlite:///rel.db", create=True) as store:
        await store.append("S1", turns("S1", 2), expected_version=0)
        monkeypatch.chdir(tmp_path / "b")
        raw = store.recorder.backend.read_raw
        assert raw is not None
        assert await raw("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = ?", ("S1",)) == [(2,)]
        assert await store.stream_version("S1") == 2
        assert list((tmp_path / "b").iterdir()) == []
    async with await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/gone.db", create=True) as store:
        (tmp_path / "gone.db").unlink()
        raw = store.recorder.backend.read_raw
        assert raw is not None
        with pytest.raises(sqlite3.OperationalError, match="unable to open"):
            await raw("SELECT 1", ())
        assert not (tmp_path / "gone.db").exists()


async def test_a_read_after_close_leaves_no_read_thread_nor_connection(sqlite_url: str) -> None:
    """A read on a closed store reads as before (the Core select) but starts no reader thread
    and opens no sqlite3 connection that nothing will close (hostile retest: 30 reads after
    close left 30 threads and 60 file descriptors)."""
    store = await EventStore.open(sqlite_url, create=True)
    await store.append("S1", turns("S1", 2), expected_version=0)
    await store.close()
    assert [e.version for e in await store.read_stream("S1")] == [1, 2]
    assert await store.stream_version("S1") == 2
    backend: Any = store.recorder.backend
    assert backend._read_conn is None and not backend._read_thread.started
    await store.close()
