"""Alembic migrations on both backends, and the store's schema-revision check."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from events.store import EventStore, SchemaRevisionError, migrate
from events.store.backends import make_backend
from tests.store.helpers import turns


async def _tables(url: str) -> set[str]:
    backend = make_backend(url)
    try:
        return set(await backend.run_read(lambda conn: sa.inspect(conn).get_table_names()))
    finally:
        await backend.dispose()


async def test_upgrade_from_empty(db_url: str) -> None:
    assert await migrate.current_revision(db_url) is None
    assert await migrate.upgrade(db_url) == migrate.head_revision()
    assert {"events", "alembic_version"} <= await _tables(db_url)
    assert await migrate.upgrade(db_url) == migrate.head_revision()  # idempotent


async def test_downgrade_upgrade_round_trip(db_url: str) -> None:
    await migrate.upgrade(db_url)
    assert await migrate.downgrade(db_url, "base") is None
    assert "events" not in await _tables(db_url)
    assert await migrate.upgrade(db_url, migrate.head_revision()) == migrate.head_revision()
    store = await EventStore.open(db_url)  # usable again, triggers back in place
    try:
        assert await store.append("S1", turns("S1", 2)) == [1, 2]
    finally:
        await store.close()


async def test_store_refuses_missing_schema(db_url: str) -> None:
    with pytest.raises(SchemaRevisionError, match="duplex-ledger db upgrade --db"):
        await EventStore.open(db_url)


async def test_store_refuses_older_schema(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    await migrate.upgrade(db_url)
    # Pretend the code knows a newer head: the database is then older than the code.
    monkeypatch.setattr(migrate, "head_revision", lambda: "9999_future")
    with pytest.raises(SchemaRevisionError, match=r"older than this code.*duplex-ledger db upgrade --db"):
        await EventStore.open(db_url)


async def test_store_refuses_newer_schema(db_url: str) -> None:
    await migrate.upgrade(db_url)
    backend = make_backend(db_url)
    try:
        await backend.run_write(
            lambda conn: conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_newer'"))
        )
    finally:
        await backend.dispose()
    with pytest.raises(SchemaRevisionError, match="newer than this code"):
        await EventStore.open(db_url)


async def test_unknown_revision_is_reported(sqlite_url: str) -> None:
    with pytest.raises(SchemaRevisionError, match="nope"):
        await migrate.upgrade(sqlite_url, "nope")


def test_a_fresh_sqlite_ledger_holds_exactly_the_known_triggers(tmp_path):
    """The trigger texts check_revision compares with are the ones the migrations create."""
    import sqlite3

    from events.store.migrate import SQLITE_TRIGGERS
    from tests.cli.conftest import Cli

    path = tmp_path / "fresh.db"
    assert Cli(f"sqlite+aiosqlite:///{path}")("db", "upgrade").exit_code == 0
    with sqlite3.connect(path) as conn:
        found = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall())
    assert found == SQLITE_TRIGGERS


@pytest.mark.parametrize("start", ["fresh", "0001_events", "0002_read_models", "0003_hash_chain"])
def test_a_sqlite_ledger_holds_exactly_the_known_schema(tmp_path, start: str) -> None:
    """SQLITE_SCHEMA (what foreign/missing objects are judged against) is what the migrations
    create, for a fresh file and for files upgraded from every older revision."""
    import asyncio

    from events.store.probe import read_sqlite
    from events.store.sqlite_schema import SQLITE_SCHEMA, schema_drift

    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    if start != "fresh":
        asyncio.run(migrate.upgrade(url, start))
    asyncio.run(migrate.upgrade(url))
    drift = read_sqlite(url, lambda conn, _url: schema_drift(conn))
    assert (drift.foreign, drift.missing) == ([], [])
    named = read_sqlite(url, lambda conn, _url: conn.exec_driver_sql("SELECT count(*) FROM sqlite_master "
                        "WHERE sql IS NOT NULL").scalar())  # fmt: skip
    assert named == len(SQLITE_SCHEMA)


def test_a_planted_trigger_is_never_run_the_file_is_refused(tmp_path):
    """A copied file with a trigger the ledger did not create (or a ledger trigger rewritten)
    is refused before anything is written (exit 2, the trigger named), and left as it was."""
    import sqlite3

    from tests.cli.conftest import Cli

    path = tmp_path / "copy.db"
    cli = Cli(f"sqlite+aiosqlite:///{path}")
    assert cli("db", "upgrade").exit_code == 0
    plants = [
        "CREATE TRIGGER planted AFTER INSERT ON rm_audit_findings BEGIN DELETE FROM rm_audit_findings; END",
        "DROP TRIGGER events_no_update",
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT 1; END",
    ]
    with sqlite3.connect(path) as conn:
        for sql in plants:
            conn.execute(sql)
    before = path.read_bytes()
    for command in ("audit", "tables", "verify", "rebuild"):
        r = cli(command)
        # verify names it as tampering (exit 1, issue 22); nothing of the file runs either way
        assert r.exit_code == (1 if command == "verify" else 2) and "planted on rm_audit_findings" in r.output
        assert "events_no_update on events" in r.output
    assert path.read_bytes() == before
