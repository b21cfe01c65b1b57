"""A ledger's schema objects are its own (issue 12): a guard trigger dropped (SQLite) or
disabled (PostgreSQL) is tampering that ``verify`` names (exit 1) and every other command
refuses (exit 2); a view, index or trigger the ledger did not create, or one of its own whose
text was changed, makes every command refuse the file before anything runs (exit 2, named),
the file left byte-identical. Generated over every ledger object and several kinds of
foreign object."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from events.store import EventStore
from events.store.errors import ForeignSchemaObject, MissingSchemaObject
from events.store.migrate import PG_TRIGGERS
from events.store.sqlite_schema import SQLITE_SCHEMA, SQLITE_TRIGGERS
from tests.cli.conftest import Cli

LOG = Path(__file__).parents[1] / "cases" / "logs" / "case-12-arrival.jsonl"  # 26 events
OTHER_COMMANDS = ("audit", "tables", "rebuild", "events", "metrics")


def command_args(command: str) -> tuple[str, ...]:
    return ("events", "export") if command == "events" else (command,)


def ledger(url: str) -> Cli:
    """The case-12 log with its read models built."""
    cli = Cli(url)
    for args in (("db", "upgrade"), ("events", "import", str(LOG)), ("rebuild",)):
        assert cli(*args).exit_code == 0, args
    assert cli("verify").exit_code == 0
    return cli


def sqlite_file(tmp_path: Path) -> tuple[Cli, Path]:
    path = tmp_path / "copy.db"
    return ledger(f"sqlite+aiosqlite:///{path}"), path


def execute(path: Path, *statements: str) -> None:
    """Run ``statements`` in one script and close the connection (its WAL checkpointed)."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(";\n".join(statements))
    finally:
        conn.close()


# ------------------------------------------------------------------ missing: tampered
@pytest.mark.parametrize("trigger", sorted(SQLITE_TRIGGERS))
def test_a_dropped_guard_trigger_is_reported_by_verify_and_refused_by_the_rest(tmp_path: Path, trigger: str) -> None:
    cli, path = sqlite_file(tmp_path)
    execute(path, f"DROP TRIGGER {trigger}")
    before = path.read_bytes()
    r = cli("verify")
    assert r.exit_code == 1 and f"TAMPERED: schema: ledger object(s) missing: trigger {trigger}" in r.stdout, r.output
    assert "intact" not in r.stdout
    r = cli("digest")  # no digest vouching for a ledger without its guard
    assert r.exit_code == 1 and f"missing: trigger {trigger}" in r.stdout and "sha256" not in r.stdout, r.output
    for command in OTHER_COMMANDS:
        r = cli(*command_args(command))
        assert r.exit_code == 2 and f"lacks the ledger's trigger {trigger}" in r.output, (command, r.output)
        assert "duplex-ledger verify" in r.output
    with pytest.raises(MissingSchemaObject, match=trigger):
        asyncio.run(EventStore.open(cli.url))
    assert path.read_bytes() == before


def test_every_named_ledger_object_dropped_is_named_missing(tmp_path: Path) -> None:
    """Indexes too: dropping the lifecycle index (or any named index) is reported."""
    cli, path = sqlite_file(tmp_path)
    named = sorted(name for kind, name in SQLITE_SCHEMA if kind == "index")
    assert named
    execute(path, *(f"DROP INDEX {name}" for name in named))
    r = cli("verify")
    assert r.exit_code == 1 and all(f"index {name}" in r.stdout for name in named), r.output


def test_a_dropped_trigger_and_an_edit_are_both_reported(tmp_path: Path) -> None:
    cli, path = sqlite_file(tmp_path)
    execute(
        path,
        "DROP TRIGGER events_no_update",
        "UPDATE events SET data = replace(data, '3200', '3201') WHERE position = 2",
    )
    r = cli("verify")
    assert r.exit_code == 1 and "trigger events_no_update" in r.stdout and "position 2" in r.stdout, r.output


@pytest.mark.parametrize("how", ["DISABLE", "ENABLE REPLICA"])
@pytest.mark.parametrize("trigger", PG_TRIGGERS)
def test_a_disabled_guard_trigger_is_reported_on_postgresql(pg_url: str, trigger: str, how: str) -> None:
    cli = ledger(pg_url)

    async def owner(sql: str) -> None:
        engine = create_async_engine(pg_url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text(sql))
        finally:
            await engine.dispose()

    asyncio.run(owner(f"ALTER TABLE events {how} TRIGGER {trigger}"))
    r = cli("verify")
    assert r.exit_code == 1 and f"trigger {trigger} (disabled)" in r.stdout, r.output
    r = cli("audit")
    assert r.exit_code == 2 and f"trigger {trigger} (disabled)" in r.output, r.output
    asyncio.run(owner(f"ALTER TABLE events ENABLE TRIGGER {trigger}"))
    assert cli("verify").exit_code == 0


# ------------------------------------------------------------------ foreign: refused
FOREIGN = {
    "view": ("CREATE VIEW findings_v AS SELECT * FROM rm_audit_findings", "view findings_v on findings_v"),
    "view over events": ("CREATE VIEW ev AS SELECT upper(data) AS d FROM events", "view ev on ev"),
    "expression index": (
        "CREATE INDEX ix_evil ON rm_turn_tables (abs(turn_id), lower(request_id))",
        "index ix_evil on rm_turn_tables",
    ),
    "partial index on events": (
        "CREATE INDEX ix_evil2 ON events (position) WHERE length(data) > 0",
        "index ix_evil2 on events",
    ),
    "plain index": ("CREATE INDEX ix_extra ON events (ts_us)", "index ix_extra on events"),
    "ledger index rewritten": (
        "DROP INDEX ix_events_lifecycle; CREATE INDEX ix_events_lifecycle ON events (position) WHERE abs(1) = 1",
        "index ix_events_lifecycle on events (text changed)",
    ),
    "trigger on a read model": (
        "CREATE TRIGGER planted AFTER INSERT ON rm_audit_findings BEGIN DELETE FROM rm_audit_findings; END",
        "trigger planted on rm_audit_findings",
    ),
    "ledger trigger rewritten": (
        "DROP TRIGGER events_no_update; CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT 1; END",
        "trigger events_no_update on events (text changed)",
    ),
    "table": ("CREATE TABLE notes (x TEXT DEFAULT (hex(randomblob(4))))", "table notes"),
    "virtual table": ("CREATE VIRTUAL TABLE vt USING fts5(a)", "table vt"),
    "generated column added to a ledger table": (
        "ALTER TABLE rm_audit_findings ADD COLUMN g TEXT GENERATED ALWAYS AS (upper(detail)) VIRTUAL",
        "table rm_audit_findings (text changed)",
    ),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_foreign_schema_object_is_refused_by_every_command(tmp_path: Path, kind: str) -> None:
    cli, path = sqlite_file(tmp_path)
    ddl, named = FOREIGN[kind]
    execute(path, ddl)
    before = path.read_bytes()
    for command in ("verify", "digest"):  # tampering: named first, exit 1, nothing of the file run (issue 22)
        r = cli(*command_args(command))
        assert r.exit_code == 1 and r.stdout.startswith("TAMPERED: schema:"), (command, r.output)
        assert "did not create" in r.output and named in r.output, (command, r.output)
    for command in OTHER_COMMANDS:
        r = cli(*command_args(command))
        assert r.exit_code == 2 and "did not create" in r.output and named in r.output, (command, r.output)
    with pytest.raises(ForeignSchemaObject, match=named.split(" (")[0]):
        asyncio.run(EventStore.open(cli.url))
    assert path.read_bytes() == before


def test_sqlite_statistics_are_not_foreign(tmp_path: Path) -> None:
    """``ANALYZE`` (an operator tuning the file) adds SQLite's own tables: still a ledger."""
    cli, path = sqlite_file(tmp_path)
    execute(path, "ANALYZE")
    assert cli("verify").exit_code == 0


def test_the_guard_benchmark_measures_the_ledger_trigger(tmp_path: Path) -> None:
    """``bench_append --guard-variants``' baseline shape is the trigger the ledger holds, and
    it refuses every replacement trick (benchmarks/guard_variants.py)."""
    from benchmarks import guard_variants

    assert guard_variants.VARIANTS["exists3"][1] == SQLITE_TRIGGERS["events_no_replace"]
    assert guard_variants.check_refusals(tmp_path, "exists3") == []
    assert guard_variants.check_refusals(tmp_path, "plain-idx") == []
    assert guard_variants.check_refusals(tmp_path, "trigger floor")  # a trick gets through: it can fail
