"""PostgreSQL: a neutered guard function is tampering (hostile-test finding M9). The triggers
stay enabled, but ``CREATE OR REPLACE FUNCTION events_append_only() … RETURN OLD`` (or a
trigger re-pointed at another function) lets the owner delete or edit events: ``verify`` and
``digest`` name the function and exit 1; other commands refuse the database (exit 2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from events.store.migrate import PG_GUARD_FUNCTIONS, _normalized
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli

MIGRATION = Path(__file__).parents[2] / "migrations" / "versions" / "0001_events.py"


def _sql(url: str, *statements: str) -> None:
    async def body() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                for s in statements:
                    await conn.execute(sa.text(s))
        finally:
            await engine.dispose()

    asyncio.run(body())


def test_the_guard_bodies_are_the_migrations() -> None:
    text = _normalized(MIGRATION.read_text(encoding="utf-8").replace('"\n    "', ""))
    for function, body in PG_GUARD_FUNCTIONS.items():
        assert f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ {_normalized(body)} $$" in text


NEUTER = "CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {ret}; END $$"
TRICKS: dict[str, tuple[tuple[str, ...], str]] = {
    "return-old": ((NEUTER.format(name="events_append_only", ret="RETURN OLD"),), "function events_append_only()"),
    "return-null": ((NEUTER.format(name="events_append_only", ret="RETURN NULL"),), "function events_append_only()"),
    "re-pointed": (
        (
            NEUTER.format(name="lenient", ret="RETURN OLD"),
            "DROP TRIGGER events_no_update_delete ON events",
            "CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION lenient()",
        ),
        "trigger events_no_update_delete (calls lenient()",
    ),
}


@pytest.mark.parametrize("trick", list(TRICKS))
def test_a_neutered_guard_function_is_tampering(pg_url: str, trick: str) -> None:
    cli = Cli(pg_url)
    cli("db", "upgrade")
    assert cli("events", "import", str(LOG_DIR / "case-12-arrival.jsonl")).exit_code == 0
    assert cli("verify").exit_code == 0
    statements, named = TRICKS[trick]
    _sql(pg_url, *statements, "DELETE FROM events WHERE position > 20")  # the tail cut: the guard let it
    r = cli("verify")
    assert r.exit_code == 1 and "TAMPERED" in r.output and named in r.output, r.output
    r = cli("digest")
    assert r.exit_code == 1 and named in r.output
    for args in (("audit",), ("tables",), ("metrics",)):
        r = cli(*args)
        assert r.exit_code == 2 and named in r.output, (args, r.output)
