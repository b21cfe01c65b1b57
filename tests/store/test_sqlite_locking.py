"""SQLite specifics: BEGIN IMMEDIATE, WAL, synchronous, many writers on one file."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from events.store import EventStore
from events.store.url import sqlite_path
from tests.store.helpers import turns


async def test_write_transactions_take_the_write_lock_at_begin(sqlite_url: str) -> None:
    """Fails if the writer's BEGIN IMMEDIATE is removed: a deferred BEGIN takes no lock, so
    the other connection's BEGIN IMMEDIATE would succeed."""
    store = await EventStore.open(sqlite_url, create=True)
    engine = store.recorder.backend.make_write_engine()
    other = sqlite3.connect(sqlite_path(sqlite_url), timeout=0, isolation_level=None)
    try:
        with engine.connect() as conn, conn.begin():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # free again after the transaction
        other.execute("ROLLBACK")
    finally:
        other.close()
        engine.dispose()
        await store.close()


def test_why_deferred_begin_is_not_enough(tmp_path) -> None:
    """The failure BEGIN IMMEDIATE prevents: read-then-write transactions started with a
    deferred BEGIN get SQLITE_BUSY at once, busy timeout or not (WAL snapshot is stale)."""
    path = tmp_path / "x.db"
    a = sqlite3.connect(path, timeout=5, isolation_level=None)
    b = sqlite3.connect(path, timeout=5, isolation_level=None)
    a.execute("PRAGMA journal_mode=WAL")
    a.execute("CREATE TABLE t (n INTEGER)")
    a.execute("BEGIN")
    b.execute("BEGIN")
    a.execute("SELECT max(n) FROM t").fetchall()
    b.execute("SELECT max(n) FROM t").fetchall()
    a.execute("INSERT INTO t VALUES (1)")
    a.execute("COMMIT")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        b.execute("INSERT INTO t VALUES (1)")
    a.close()
    b.close()


async def test_two_stores_on_one_file_32_writers_no_lock_errors(sqlite_url: str) -> None:
    """Two stores (two writer connections) doing read-then-write transactions concurrently:
    zero `database is locked` reaches a caller, zero events lost."""
    first = await EventStore.open(sqlite_url, create=True)
    second = await EventStore.open(sqlite_url)

    async def session(store: EventStore, name: str) -> None:
        for k in range(20):
            await store.append(name, turns(name, 1, start=k), expected_version=k)

    try:
        await asyncio.gather(
            *(session(first, f"A{i}") for i in range(16)), *(session(second, f"B{i}") for i in range(16))
        )
        assert await first.head_position() == 32 * 20
        assert [s.position async for s in first.read_all()] == list(range(1, 641))
        for name in ("A0", "B15"):
            assert [s.version for s in await second.read_stream(name)] == list(range(1, 21))
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize(("level", "code"), [("FULL", 2), ("NORMAL", 1)])
async def test_pragmas(sqlite_url: str, level: str, code: int) -> None:
    store = await EventStore.open(sqlite_url, create=True, synchronous=level)
    try:
        got = await store.recorder.backend.run_write(
            lambda conn: (
                conn.exec_driver_sql("PRAGMA synchronous").scalar(),
                conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                conn.exec_driver_sql("PRAGMA busy_timeout").scalar(),
            )
        )
        assert got == (code, "wal", 30000)
    finally:
        await store.close()


async def test_bad_synchronous_and_urls_are_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="FULL or NORMAL"):
        await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/x.db", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsupported database URL"):
        await EventStore.open("mysql://x/y")
    with pytest.raises(ValueError, match="needs a SQLite file"):
        await EventStore.open("sqlite+aiosqlite://")
