"""``db downgrade`` of a database whose recorded revision does not match its schema is refused
before anything is dropped (issue 22). PostgreSQL has no schema-text check (SQLite's is
:mod:`events.store.sqlite_schema`): an ``alembic_version`` edited back to an older revision made
``db downgrade base`` drop the log itself and strand the newer tables, then print "nothing was
changed"."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from events.store import migrate
from events.store.errors import SchemaRevisionError
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli


def _sql(url: str, *statements: str) -> list[tuple]:
    async def body() -> list[tuple]:
        engine = create_async_engine(url)
        out: list[tuple] = []
        try:
            async with engine.begin() as conn:
                for s in statements:
                    result = await conn.execute(sa.text(s))
                    if s.startswith("SELECT"):
                        out.extend(tuple(r) for r in result)
        finally:
            await engine.dispose()
        return out

    return asyncio.run(body())


def _tables(url: str) -> list[tuple]:
    return _sql(
        url,
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "ORDER BY 1, 2",
    )


@pytest.mark.parametrize("recorded", ["0001_events", "0002_read_models", "0003_hash_chain"])
@pytest.mark.parametrize("target", ["base", "0001_events"])
def test_a_downgrade_of_a_mismatched_revision_is_refused_before_anything_is_dropped(
    pg_url: str, recorded: str, target: str
) -> None:
    cli = Cli(pg_url)
    assert cli("db", "upgrade").exit_code == 0
    assert cli("events", "import", str(LOG_DIR / "case-12-arrival.jsonl")).exit_code == 0
    _sql(pg_url, f"UPDATE alembic_version SET version_num = '{recorded}'")
    before = _tables(pg_url)
    r = cli("db", "downgrade", target, "--yes")
    assert r.exit_code == 2, r.output
    assert f"records schema revision '{recorded}', but its schema is not that revision's" in r.output
    assert "refusing to downgrade (nothing was changed)" in r.output
    assert _tables(pg_url) == before
    assert _sql(pg_url, "SELECT count(*) FROM events") == [(26,)]


def test_a_matching_revision_still_downgrades_and_upgrades(pg_url: str) -> None:
    cli = Cli(pg_url)
    assert cli("db", "upgrade").exit_code == 0
    assert cli("events", "import", str(LOG_DIR / "case-12-arrival.jsonl")).exit_code == 0
    r = cli("db", "downgrade", "0003_hash_chain", "--yes")
    assert r.exit_code == 0 and "is at revision 0003_hash_chain" in r.output, r.output
    assert cli("db", "upgrade").exit_code == 0
    assert _sql(pg_url, "SELECT count(*) FROM events") == [(26,)]
    assert cli("verify").exit_code == 0


def test_the_shapes_of_every_revision_are_those_the_migrations_make_on_postgresql(pg_url: str) -> None:
    """:func:`migrate.shape_at` (read from SQLite) is what PostgreSQL holds at each revision."""
    for revision in ("0001_events", "0002_read_models", "0003_hash_chain", "0004_replica_leases"):
        asyncio.run(migrate.upgrade(pg_url, revision))

        async def read() -> dict:
            from events.store.backends import make_backend

            backend = make_backend(pg_url)
            try:
                return await backend.run_read(migrate.pg_shape)
            finally:
                await backend.dispose()

        assert asyncio.run(read()) == migrate.shape_at(revision), revision


def test_a_mismatched_upgrade_is_refused_too(pg_url: str) -> None:
    asyncio.run(migrate.upgrade(pg_url, "0003_hash_chain"))
    _sql(pg_url, "UPDATE alembic_version SET version_num = '0001_events'")
    with pytest.raises(SchemaRevisionError, match="refusing to upgrade"):
        asyncio.run(migrate.upgrade(pg_url))
