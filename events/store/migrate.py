"""Schema migrations (Alembic, scripts shipped in the ``migrations`` package).

``alembic.ini`` is not needed: :func:`alembic_config` builds the configuration in code. Each
operation opens the URL's write engine and hands its connection to ``migrations/env.py``.
Adding a read-model table later = one new file in ``migrations/versions`` whose
``down_revision`` is the current head; :func:`head_revision` and the store's revision check
follow automatically.

On PostgreSQL every migration runs under a transaction-scoped advisory lock, so any number of
processes may upgrade (or ``EventStore.open(create=True)``) a fresh database at once. A SQLite
file is inspected read-only before anything writes to it: another application's database is
refused untouched (:class:`NotALedger`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import text
from sqlalchemy.engine import Connection

import migrations
from events.store.backends import make_backend
from events.store.errors import ForeignSchemaObject, MissingSchemaObject, NotALedger, SchemaRevisionError
from events.store.probe import read_sqlite, undo_creation
from events.store.sqlite_schema import SQLITE_SCHEMA, schema_drift
from events.store.sqlite_schema import SQLITE_TRIGGERS as SQLITE_TRIGGERS  # re-exported
from events.store.url import (
    backend_of,
    missing_ancestor,
    missing_sqlite_file,
    redact,
    require_existing,
    resolve_url,
)

SCRIPT_LOCATION = str(Path(migrations.__file__).resolve().parent)


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config pointing at the packaged scripts and ``url`` (default URL if None)."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", resolve_url(url).replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest revision the code knows (single head)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "migrations/versions is empty"
    return head


# Arbitrary constant key of the advisory lock serialising migrations on PostgreSQL ("dlgm").
MIGRATION_LOCK_KEY = 0x646C676D


async def _with_connection(url: str | None, fn: Any, *args: Any) -> Any:
    """Run ``fn(sync_conn, url, *args)`` in one write transaction (transactional DDL)."""
    url = resolve_url(url)
    backend = make_backend(url)
    try:
        return await backend.run_write(fn, url, *args)
    finally:
        await backend.dispose()


async def _read(url: str, fn: Any) -> Any:
    """Run ``fn(sync_conn, url)`` on a read connection, all of it on one snapshot (a migration
    committed meanwhile is seen whole or not at all); a SQLite file is opened read-only (left
    byte-identical, :mod:`events.store.probe`), PostgreSQL reads at REPEATABLE READ."""
    if backend_of(url) == "sqlite":
        return read_sqlite(url, fn)
    backend = make_backend(url)
    try:
        return await backend.run_read(_repeatable_read, fn, url)
    finally:
        await backend.dispose()


def _repeatable_read(sync_conn: Connection, fn: Any, url: str) -> Any:
    return fn(sync_conn.execution_options(isolation_level="REPEATABLE READ"), url)


def revision_known(revision: str) -> bool:
    """True when ``revision`` (an id, ``head``, ``base`` …) names a revision of this code."""
    try:
        ScriptDirectory.from_config(alembic_config()).get_revisions(revision)
    except (CommandError, KeyError, ValueError):
        return False
    return True


def _command(sync_conn: Connection, url: str, name: str, revision: str) -> None:
    if sync_conn.dialect.name == "postgresql":
        # N processes opening a fresh database at once: one migrates, the others wait here and
        # then find it at head (without the lock: IntegrityError on pg_type, issue 11).
        sync_conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
    current = ledger_state(sync_conn, url)  # refuses another application's database before any DDL
    if sync_conn.dialect.name == "postgresql":
        refuse_shape_mismatch(sync_conn, url, current, name)
    cfg = alembic_config(url)
    cfg.attributes["connection"] = sync_conn
    try:
        getattr(command, name)(cfg, revision)
    except CommandError as exc:
        raise SchemaRevisionError(f"{name} to {revision!r} failed on {redact(url)}: {exc}") from None


def _unknown_target(url: str, revision: str) -> SchemaRevisionError:
    return SchemaRevisionError(
        f"{redact(url)}: unknown schema revision {revision!r} (this code knows "
        f"base … {head_revision()}); nothing was changed"
    )


async def upgrade(url: str | None = None, revision: str = "head") -> str | None:
    """Create or upgrade the schema to ``revision``; returns the revision now current.

    Raises SchemaRevisionError for an unknown revision (checked before anything is created:
    no file is left behind), NotALedger for a database that holds another application's
    tables (left untouched). A SQLite file this call created is removed again when the
    upgrade fails, unless another process has appended events to it meanwhile."""
    url = resolve_url(url)
    if not revision_known(revision):
        raise _unknown_target(url, revision)
    missing = missing_sqlite_file(url)
    created = None if missing is None else missing_ancestor(missing)
    if missing is None and backend_of(url) == "sqlite":
        read_sqlite(url, ledger_state)  # a foreign or damaged file: refused, byte-identical
    try:
        await _with_connection(url, _command, "upgrade", revision)
    except BaseException:
        if created is not None:
            undo_creation(url, created)
        raise
    return await current_revision(url)


async def downgrade(url: str | None = None, revision: str = "base") -> str | None:
    """Downgrade to ``revision`` ("base" drops every ledger table, events included: the data
    is gone). Returns the revision now current (None at base). Raises LedgerNotFound for a
    SQLite file that does not exist (nothing is created), NotALedger for a database that is
    not a ledger, SchemaRevisionError for an unknown revision (nothing changed)."""
    url = resolve_url(url)
    require_existing(url)
    if not revision_known(revision):
        raise _unknown_target(url, revision)
    if backend_of(url) == "sqlite":
        read_sqlite(url, ledger_state)
    await _with_connection(url, _command, "downgrade", revision)
    try:
        return await current_revision(url)
    except SchemaRevisionError as exc:  # the downgrade itself committed: say so, not "nothing was changed"
        said = str(exc).replace("; nothing was changed", "").replace(" (nothing was changed)", "")
        raise SchemaRevisionError(
            f"the downgrade to {revision!r} was committed, but the database's state is now unexpected: {said}"
        ) from None


def ledger_state(sync_conn: Connection, url: str, tolerate_missing: bool = False) -> str | None:
    """The database's schema revision (None: no ledger schema yet, e.g. an empty file), after
    checking that its schema objects are exactly those of that revision (:func:`refuse_drift`:
    at EVERY revision, before any migration runs — a trigger planted in an older file would run
    during the upgrade's backfill).

    Raises NotALedger when the database holds tables but no ledger (another application's
    database), SchemaRevisionError when it holds the ledger's ``events`` table but no
    revision record (``alembic_version`` dropped: upgrading would try to create it again),
    ForeignSchemaObject / MissingSchemaObject (see :func:`refuse_drift`)."""
    tables = set(sa.inspect(sync_conn).get_table_names())
    revision = MigrationContext.configure(sync_conn).get_current_revision() if "alembic_version" in tables else None
    shown = redact(url)
    if "events" not in tables and (tables - {"alembic_version"} or (revision and not revision_known(revision))):
        raise NotALedger(
            f"{shown}: not a duplex-ledger database (it holds other tables: "
            f"{', '.join(sorted(tables)[:8])}); nothing was changed"
        )
    if "events" in tables and revision is None:
        raise SchemaRevisionError(
            f"{shown} holds a ledger's events table but no schema revision (its alembic_version table is missing "
            "or empty); refusing to migrate it. Restore alembic_version from a backup, or export the events "
            "with an older copy and import them into a new ledger"
        )
    refuse_drift(sync_conn, url, revision, tolerate_missing)
    return revision


@functools.cache
def sqlite_schema_at(revision: str | None) -> dict[tuple[str, str], str]:
    """(type, name) -> text of every named object a SQLite ledger file at ``revision`` holds
    (None: a file with no ledger yet, which may hold only an empty ``alembic_version``). The
    head's is :data:`~events.store.sqlite_schema.SQLITE_SCHEMA`; an older revision's is read
    from a scratch in-memory database migrated to it (once per process). Raises
    SchemaRevisionError for a revision this code does not know."""
    if revision is None:
        return {key: sql for key, sql in SQLITE_SCHEMA.items() if key == ("table", "alembic_version")}
    if revision == head_revision():
        return SQLITE_SCHEMA
    if not revision_known(revision):
        raise SchemaRevisionError(f"unknown schema revision {revision!r}")
    with _scratch_at(revision) as conn:
        rows = conn.execute(text("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")).all()
    return {(kind, name): sql for kind, name, sql in rows}


@contextlib.contextmanager
def _scratch_at(revision: str) -> Iterator[Connection]:
    """A connection to an in-memory SQLite database migrated to ``revision`` (dropped after)."""
    engine = sa.create_engine("sqlite+pysqlite://", poolclass=sa.pool.StaticPool)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", SCRIPT_LOCATION)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            yield conn
    finally:
        engine.dispose()


@functools.cache
def shape_at(revision: str | None) -> dict[str, tuple[str, ...]]:
    """The ledger's tables at ``revision`` with their columns (sorted), and its named indexes
    as ``"index <name>"`` keys with no columns: what a database at that revision holds on
    either backend (read from :func:`sqlite_schema_at`'s scratch database)."""
    if revision is None:
        return {"alembic_version": ("version_num",)}
    shape: dict[str, tuple[str, ...]] = {}
    with _scratch_at(revision) as conn:
        inspector = sa.inspect(conn)
        for table in inspector.get_table_names():
            shape[table] = tuple(sorted(c["name"] for c in inspector.get_columns(table)))
            for index in inspector.get_indexes(table):
                if index["name"]:
                    shape[f"index {index['name']}"] = ()
    return shape


def _known_ledger_objects() -> set[str]:
    """Every table and named index some revision of this code creates."""
    script = ScriptDirectory.from_config(alembic_config())
    return {key for rev in script.walk_revisions() for key in shape_at(rev.revision)}


def pg_shape(sync_conn: Connection) -> dict[str, tuple[str, ...]]:
    """:func:`shape_at`'s view of a PostgreSQL database: its ledger tables (those some revision
    creates) with their columns, and its named ledger indexes."""
    known = _known_ledger_objects()
    columns = sync_conn.execute(
        sa.text("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()")
    ).all()
    shape: dict[str, list[str]] = {}
    for table, column in columns:
        if table in known:
            shape.setdefault(table, []).append(column)
    out = {table: tuple(sorted(cols)) for table, cols in shape.items()}
    for (index,) in sync_conn.execute(
        sa.text("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    ).all():
        if f"index {index}" in known:
            out[f"index {index}"] = ()
    return out


def refuse_shape_mismatch(sync_conn: Connection, url: str, revision: str | None, name: str) -> None:
    """PostgreSQL, before a migration runs: raise SchemaRevisionError unless the database's
    ledger tables, their columns and its named indexes are exactly those of the revision its
    ``alembic_version`` records (:func:`shape_at`). A recorded revision that does not match
    the schema (edited, or left behind by a failed manual change) would make a downgrade drop
    tables its revisions never created — the log included — and strand the rest; nothing is
    dropped or created. A revision this code does not know is not checked (its shape is
    unknown; the revision check refuses it)."""
    if revision is not None and not revision_known(revision):
        return
    expected, found = dict(shape_at(revision)), pg_shape(sync_conn)
    if revision is None:  # a fresh database may or may not hold an (empty) alembic_version yet
        expected.pop("alembic_version", None)
        found.pop("alembic_version", None)
    if expected == found:
        return
    extra = sorted(k for k in found if k not in expected)
    lacking = sorted(k for k in expected if k not in found)
    changed = sorted(k for k in expected if k in found and expected[k] != found[k])
    parts = [
        *(f"{k} is not part of it" for k in extra),
        *(f"{k} is missing" for k in lacking),
        *(f"table {k} has columns {', '.join(found[k])}, not {', '.join(expected[k])}" for k in changed),
    ]
    raise SchemaRevisionError(
        f"{redact(url)} records schema revision {revision or 'base'!r}, but its schema is not that revision's "
        f"({'; '.join(parts)}); refusing to {name} (nothing was changed). Restore alembic_version to the "
        "revision its tables are at, or restore the database from a backup"
    )


def refuse_drift(sync_conn: Connection, url: str, revision: str | None, tolerate_missing: bool = False) -> None:
    """Raise ForeignSchemaObject when a SQLite file holds a trigger, view, index or table that
    the ledger's migrations up to ``revision`` did not create (or whose text differs), naming
    them; MissingSchemaObject when it lacks one of that revision's objects (PostgreSQL: a guard
    trigger missing or disabled), unless ``tolerate_missing`` (``verify`` reports it as
    tampering). A revision newer than this code is not checked (its objects are unknown)."""
    if revision is not None and not revision_known(revision):
        return
    shown = redact(url)
    if sync_conn.dialect.name == "sqlite":
        drift = schema_drift(sync_conn, sqlite_schema_at(revision))
        foreign, missing = drift.foreign, ([] if revision is None else drift.missing)
    else:
        foreign, missing = [], ([] if revision is None else missing_guards(sync_conn))
    if foreign:
        raise ForeignSchemaObject(
            f"{shown} holds schema object(s) the ledger did not create: {', '.join(foreign)}; a ledger "
            "file runs nothing of its own, so it is not opened or migrated (nothing was changed). Drop them "
            "(`sqlite3 FILE 'DROP TRIGGER name'`, `DROP VIEW`, `DROP INDEX`, `DROP TABLE`), or run "
            "`duplex-ledger verify` on a copy without them",
            foreign,
        )
    if missing and not tolerate_missing:
        raise MissingSchemaObject(
            f"{shown} lacks the ledger's {', '.join(missing)}: its append-only guard was taken off, so "
            "it is not opened or migrated (nothing was changed). Run `duplex-ledger verify` (it reports this as "
            "tampering and checks the log); if the log is intact, recreate it (SQLite: its statement in "
            "events/store/sqlite_schema.py; PostgreSQL: `ALTER TABLE events ENABLE TRIGGER name` as the "
            "owner) or restore the ledger from a backup"
        )


async def current_revision(url: str | None = None) -> str | None:
    """The database's revision: None for an empty database, and for a SQLite file that does
    not exist (which is not created by asking). A SQLite file is only read (byte-identical).
    Raises NotALedger for a database that is not a ledger."""
    url = resolve_url(url)
    if missing_sqlite_file(url) is not None:
        return None
    return await _read(url, ledger_state)


def revision_status(revision: str | None) -> str:
    """``"current"``, ``"older"`` (``db upgrade`` helps; None included) or ``"newer"``
    (the database is ahead of this code: only a newer duplex-ledger helps)."""
    if revision == head_revision():
        return "current"
    return "older" if revision is None or revision_known(revision) else "newer"


PG_TRIGGERS: tuple[str, ...] = ("events_no_truncate", "events_no_update_delete")
"""The append-only guard of a PostgreSQL ledger (revision 0001), each present and enabled."""
PG_GUARD_FUNCTIONS: dict[str, str] = {
    "events_append_only": "BEGIN RAISE EXCEPTION 'events is append-only: % refused', TG_OP; END",
}
"""The functions :data:`PG_TRIGGERS` execute, with their bodies as migration 0001 creates them
(``CREATE OR REPLACE FUNCTION … RETURN OLD`` neuters the guard while the triggers stay
enabled; tests/store/test_guard_functions.py checks this text against the migration's)."""


def foreign_triggers(sync_conn: Connection) -> list[str]:
    """SQLite: every trigger, view or index the ledger did not create, or whose text is not the
    ledger's (``"<type> <name> on <table>"``, :func:`events.store.sqlite_schema.schema_drift`). A
    ledger file is untrusted input and runs nothing of its own: a planted trigger would run on
    the read models' writes, a view or an expression index calls SQL functions when read."""
    return schema_drift(sync_conn).foreign


def missing_guards(sync_conn: Connection) -> list[str]:
    """The ledger's schema objects the database lacks (SQLite: any of
    :data:`~events.store.sqlite_schema.SQLITE_SCHEMA`, e.g. ``trigger events_no_update``
    dropped) or has disabled (PostgreSQL: :data:`PG_TRIGGERS`, ``ALTER TABLE … DISABLE
    TRIGGER``), or whose guard function's body was replaced or whose trigger calls another
    function (:data:`PG_GUARD_FUNCTIONS`, compared to ``pg_proc.prosrc`` with whitespace
    collapsed). Empty for an intact ledger. A sync read function."""
    if sync_conn.dialect.name == "sqlite":
        return schema_drift(sync_conn).missing
    rows = sync_conn.execute(
        sa.text(
            "SELECT t.tgname, t.tgenabled::text, p.proname, p.prosrc FROM pg_trigger t "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'events'::regclass AND NOT t.tgisinternal"
        )
    ).all()
    state = {name: (enabled, function, body) for name, enabled, function, body in rows}
    # tgenabled: O fires (origin), A always; D disabled, R only under session_replication_role
    # = replica (``ENABLE REPLICA TRIGGER``): off for the application's sessions either way.
    out = [
        f"trigger {name}" + (" (disabled)" if name in state else "")
        for name in PG_TRIGGERS
        if name not in state or state[name][0] not in ("O", "A")
    ]
    for name in PG_TRIGGERS:
        if name not in state:
            continue
        _, function, body = state[name]
        if function not in PG_GUARD_FUNCTIONS:
            out.append(f"trigger {name} (calls {function}(), not the guard)")
        elif _normalized(body) != _normalized(PG_GUARD_FUNCTIONS[function]):
            line = f"function {function}() (its body was replaced; the guard no longer refuses)"
            if line not in out:
                out.append(line)
    return out


def _normalized(body: str) -> str:
    """A PL/pgSQL body with its whitespace runs collapsed (what ``prosrc`` keeps is the text
    between the ``$$`` quotes, as written)."""
    return " ".join(body.split())


def check_revision(sync_conn: Connection, url: str, tolerate_missing: bool = False) -> None:
    """Raise SchemaRevisionError unless the database is exactly at :func:`head_revision`
    (NotALedger for another application's database, see :func:`ledger_state`), holds no
    foreign schema object (:class:`ForeignSchemaObject`, SQLite) and lacks none of the
    ledger's (:class:`MissingSchemaObject`, unless ``tolerate_missing``: ``verify`` opens such
    a database to report it as tampered, :func:`missing_guards`).

    The message says what to run: ``duplex-ledger db upgrade --db URL`` for a missing or
    older schema; for a newer one, a newer duplex-ledger (or a downgrade run by it)."""
    current = ledger_state(sync_conn, url, tolerate_missing)
    head = head_revision()
    status = revision_status(current)
    if status == "current":
        return
    shown = redact(url)
    fix = f"run `duplex-ledger db upgrade --db {shown}`"
    if current is None:
        raise SchemaRevisionError(f"{shown} has no duplex-ledger schema (this code needs revision {head}); {fix}")
    if status == "newer":
        raise SchemaRevisionError(
            f"{shown} is at schema revision {current!r}, newer than this code (which knows up to {head}): "
            "this duplex-ledger is older than the database; upgrade duplex-ledger, or have the newer version "
            f"run `duplex-ledger db downgrade {head}`"
        )
    raise SchemaRevisionError(f"{shown} is at schema revision {current!r}, older than this code's {head}; {fix}")
