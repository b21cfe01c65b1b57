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
