"""Processes racing to create one SQLite ledger (deterministic reductions of the races).

A schema check reads one snapshot: a migration committed by another process between two of
its statements must not make it see a revision and a table list from different times. CI
(stop 19) failed once this way: of four concurrent ``db upgrade`` runs, one read the tables
and revision (none yet) before another run's migration committed and the schema objects
after it, and refused the ledger as holding foreign tables.

A process that created the file and then failed removes it again, but never once another
process has appended events to it."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from events.store import migrate
from events.store.probe import read_sqlite


def _commit_elsewhere(path: Path, sql: str) -> None:
    writer = sqlite3.connect(path, timeout=0.5)
    try:
        writer.execute(sql)
        writer.commit()
    finally:
        writer.close()


def test_read_sqlite_sees_one_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    url = f"sqlite+aiosqlite:///{path}"
    asyncio.run(migrate.upgrade(url))

    def two_reads(conn: sa.Connection, _url: str) -> tuple[int, int]:
        count = "SELECT count(*) FROM sqlite_master"
        before = conn.exec_driver_sql(count).scalar_one()
        _commit_elsewhere(path, "CREATE TABLE written_meanwhile (x)")
        return before, conn.exec_driver_sql(count).scalar_one()

    before, after = read_sqlite(url, two_reads)
    assert before == after
    # and the read left no transaction open: the next read sees the commit
    assert (
        read_sqlite(url, lambda conn, _u: conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar_one())
        == before + 1
    )


def test_ledger_state_across_a_concurrent_first_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The revision is read (none: a new WAL file, as a racing ``db upgrade`` finds it), then
    another process's whole migration to head commits before the table list is read: the
    check still answers 'no ledger yet' instead of refusing the head's tables as foreign."""
    path = tmp_path / "ledger.db"
    url = f"sqlite+aiosqlite:///{path}"
    _commit_elsewhere(path, "PRAGMA journal_mode=WAL")
    expected_at = migrate.sqlite_schema_at

    def migrate_then_expect(revision):  # type: ignore[no-untyped-def]
        # after the tables and revision were read, before the schema objects are
        monkeypatch.setattr(migrate, "sqlite_schema_at", expected_at)  # once: the migration checks too
        asyncio.run(migrate._with_connection(url, migrate._command, "upgrade", "head"))
        return expected_at(revision)

    monkeypatch.setattr(migrate, "sqlite_schema_at", migrate_then_expect)
    assert read_sqlite(url, migrate.ledger_state) is None
    monkeypatch.undo()
    assert read_sqlite(url, migrate.ledger_state) == migrate.head_revision()


@pytest.mark.parametrize("others_appended", [False, True])
def test_a_failed_first_upgrade_never_removes_another_process_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others_appended: bool
) -> None:
    """``db upgrade`` (or ``events import``) on a missing file removes the file it created when
    it fails; if another process opened the new file meanwhile and appended, the file stays."""
    from events.store import EventStore
    from events.types import SessionOpened

    path = tmp_path / "new" / "ledger.db"
    url = f"sqlite+aiosqlite:///{path}"
    real = migrate._with_connection

    async def migrate_then_fail(*args):  # type: ignore[no-untyped-def]
        await real(*args)
        if others_appended:
            store = await EventStore.open(url)
            try:
                await store.append("S", [SessionOpened(session_id="S", ts=1.0)], expected_version=0)
            finally:
                await store.close()
        raise RuntimeError("the first upgrade's connection failed after the other process's write")

    monkeypatch.setattr(migrate, "_with_connection", migrate_then_fail)
    with pytest.raises(RuntimeError):
        asyncio.run(migrate.upgrade(url))
    assert path.exists() is others_appended
    assert (tmp_path / "new").exists() is others_appended
    if others_appended:
        count = read_sqlite(url, lambda conn, _u: conn.exec_driver_sql("SELECT count(*) FROM events").scalar_one())
        assert count == 1
