"""What a SQLite ledger file at the head revision holds in ``sqlite_master``, and what a file
holds besides or lacks (issue 12: a copied file is untrusted input).

A ledger file runs nothing of its own: any trigger, view or index it holds that the ledger's
migrations did not create, or whose text was changed, is *foreign* — a view or an index on an
expression can call SQL functions whenever a command reads or writes, a trigger runs on every
write — and the file is refused before anything runs
(:class:`~events.store.errors.ForeignSchemaObject`). A ledger object the file lacks (a guard
trigger dropped, say) is *missing*: the append-only guard was taken off, which ``verify``
reports as tampering and every other command refuses.

Texts are compared with runs of whitespace collapsed (SQLite keeps a statement's text as it
was written; SQLAlchemy writes ``CREATE TABLE`` over several lines). The autoindexes of
UNIQUE and PRIMARY KEY constraints (``sqlite_autoindex_<table>_<n>``, no text) belong to their
table, whose text fixes them; ``sqlite_stat*`` tables are SQLite's own (``ANALYZE``), accepted
only in the shape ANALYZE writes (:func:`events.store.integrity.stat_problems`: a ledger
table, one of its indexes, counts only), so the query planner never reads anything else.
``tests/store/test_migrations.py`` checks that a fresh ledger and one migrated from older
revisions hold exactly :data:`SQLITE_SCHEMA`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.store.integrity import stat_problems

SQLITE_TRIGGERS: dict[str, str] = {
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: UPDATE refused'); END",
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: DELETE refused'); END",
    "events_no_replace": "CREATE TRIGGER events_no_replace BEFORE INSERT ON events "
    "WHEN EXISTS (SELECT 1 FROM events WHERE position = NEW.position) "
    "OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id) "
    "OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version) "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: an insert may not replace a stored row'); END",
}
"""The triggers, as SQLite stores their text (exactly: a trigger is compared byte for byte)."""

_TABLES: dict[str, str] = {
    "alembic_version": "CREATE TABLE alembic_version ( version_num VARCHAR(32) NOT NULL, "
    "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num) )",
    "events": "CREATE TABLE events ( position INTEGER NOT NULL, stream_id TEXT NOT NULL, version BIGINT NOT NULL, "
    "event_id TEXT NOT NULL, type TEXT NOT NULL, schema_version INTEGER NOT NULL, ts_us BIGINT NOT NULL, "
    "recorded_at_us BIGINT NOT NULL, data TEXT NOT NULL, hash BLOB, PRIMARY KEY (position), "
    "CONSTRAINT uq_events_stream_version UNIQUE (stream_id, version), CONSTRAINT uq_events_event_id UNIQUE (event_id) )",
    "projection_checkpoints": "CREATE TABLE projection_checkpoints ( name TEXT NOT NULL, position BIGINT NOT NULL, "
    "fold_version INTEGER NOT NULL, state BLOB NOT NULL, updated_at_us BIGINT NOT NULL, PRIMARY KEY (name) )",
    "rm_request_resources": "CREATE TABLE rm_request_resources ( session_id TEXT NOT NULL, stage_id INTEGER NOT NULL, "
    "request_id TEXT NOT NULL, state TEXT NOT NULL, fence_incarnation INTEGER, fence_epoch INTEGER, "
    "fence_turn_id INTEGER, since_position BIGINT NOT NULL, since_ts_us BIGINT NOT NULL, "
    "PRIMARY KEY (session_id, stage_id, request_id) )",
    "rm_audit_findings": "CREATE TABLE rm_audit_findings ( finding_no INTEGER NOT NULL, severity TEXT NOT NULL, "
    "kind TEXT NOT NULL, session_id TEXT NOT NULL, stage_id INTEGER, request_id TEXT, "
    "first_position BIGINT NOT NULL, first_ts_us BIGINT NOT NULL, last_position BIGINT NOT NULL, "
    "last_ts_us BIGINT NOT NULL, evidence_positions TEXT NOT NULL, detail TEXT NOT NULL, PRIMARY KEY (finding_no) )",
    "rm_turn_tables": "CREATE TABLE rm_turn_tables ( session_id TEXT NOT NULL, response_id TEXT NOT NULL, "
    "request_id TEXT NOT NULL, turn_id INTEGER NOT NULL, finished_reason TEXT NOT NULL, "
    "arrival_ts_us BIGINT NOT NULL, finalize_ts_us BIGINT NOT NULL, finalize_position BIGINT NOT NULL, "
    "tables_json TEXT NOT NULL, PRIMARY KEY (session_id, response_id) )",
    "replica_leases": "CREATE TABLE replica_leases ( replica_id TEXT NOT NULL, incarnation BIGINT NOT NULL, "
    "engine_pool TEXT, host TEXT NOT NULL, pid BIGINT NOT NULL, lease_us BIGINT NOT NULL, "
    "acquired_at_us BIGINT NOT NULL, renewed_at_us BIGINT NOT NULL, expires_at_us BIGINT NOT NULL, "
    "released_at_us BIGINT, reaped_at_us BIGINT, reaped_by TEXT, PRIMARY KEY (replica_id) )",
}

_INDEXES: dict[str, str] = {
    "ix_rm_turn_tables_position": "CREATE INDEX ix_rm_turn_tables_position ON rm_turn_tables (finalize_position)",
    "ix_events_lifecycle": "CREATE INDEX ix_events_lifecycle ON events (position) "
    "WHERE type IN ('SessionOpened', 'SessionTakenOver', 'SessionClosed')",
}

SQLITE_SCHEMA: dict[tuple[str, str], str] = {
    **{("table", name): sql for name, sql in _TABLES.items()},
    **{("index", name): sql for name, sql in _INDEXES.items()},
    **{("trigger", name): sql for name, sql in SQLITE_TRIGGERS.items()},
}
"""(type, name) -> text of every named object of a head-revision ledger file (no views)."""


@dataclass(frozen=True, slots=True)
class SchemaDrift:
    """How a file's schema differs from :data:`SQLITE_SCHEMA`: ``foreign`` objects (added, or
    text changed) and ``missing`` ones, each as ``"<type> <name> on <table>"``, sorted."""

    foreign: list[str]
    missing: list[str]


def _same(found: str | None, expected: str) -> bool:
    return found is not None and " ".join(found.split()) == " ".join(expected.split())


def schema_drift(sync_conn: Connection, schema: dict[tuple[str, str], str] | None = None) -> SchemaDrift:
    """Compare the file's ``sqlite_master`` with ``schema`` (default :data:`SQLITE_SCHEMA`, the
    head's; an older revision's comes from :func:`events.store.migrate.sqlite_schema_at`). A
    sync read function."""
    schema = SQLITE_SCHEMA if schema is None else schema
    found = sync_conn.execute(sa.text("SELECT type, name, tbl_name, sql FROM sqlite_master")).all()
    foreign, seen = [], set()
    for kind, name, table, sql in found:
        seen.add((kind, name))
        expected = schema.get((kind, name))
        if kind == "trigger" and expected is not None and sql == expected:
            continue
        if kind != "trigger" and expected is not None and _same(sql, expected):
            continue
        if kind == "index" and sql is None and name.startswith("sqlite_autoindex_") and ("table", table) in schema:
            continue  # a constraint's index: its table's text fixes it
        if kind == "table" and name.startswith("sqlite_stat"):
            continue  # SQLite's own, in ANALYZE's shape only: checked below
        shown = f"{kind} {name}" if kind == "table" else f"{kind} {name} on {table}"
        foreign.append(shown + (" (text changed)" if expected is not None else ""))
    if any(kind == "table" and name.startswith("sqlite_stat") for kind, name in seen):
        foreign += stat_problems(_Driver(sync_conn))
    missing = [f"{kind} {name}" for kind, name in schema if (kind, name) not in seen]
    return SchemaDrift(sorted(foreign), sorted(missing))


class _Driver:
    """A SQLAlchemy connection as the ``execute(sql, params)`` that
    :mod:`events.store.integrity` reads through."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        return self.conn.exec_driver_sql(sql, params) if params else self.conn.exec_driver_sql(sql)
