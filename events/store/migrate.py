"""Schema migrations (Alembic, scripts shipped in the ``migrations`` package).

``alembic.ini`` is not needed: :func:`alembic_config` builds the configuration in code. Each
operation opens the URL's write engine and hands its connection to ``migrations/env.py``.
Adding a read-model table later = one new file in ``migrations/versions`` whose
``down_revision`` is the current head; :func:`head_revision` and the store's revision check
follow automatically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection

import migrations
from events.store.backends import make_backend
from events.store.errors import SchemaRevisionError
from events.store.url import missing_sqlite_file, redact, require_existing, resolve_url

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


async def _with_connection(url: str | None, fn: Any, *args: Any) -> Any:
    """Run ``fn(sync_conn, url, *args)`` in one write transaction (transactional DDL)."""
    url = resolve_url(url)
    backend = make_backend(url)
    try:
        return await backend.run_write(fn, url, *args)
    finally:
        await backend.dispose()


def _command(sync_conn: Connection, url: str, name: str, revision: str) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = sync_conn
    try:
        getattr(command, name)(cfg, revision)
    except CommandError as exc:
        raise SchemaRevisionError(f"{name} to {revision!r} failed on {redact(url)}: {exc}") from None


async def upgrade(url: str | None = None, revision: str = "head") -> str | None:
    """Create or upgrade the schema to ``revision``; returns the revision now current.

    Raises SchemaRevisionError for an unknown revision."""
    await _with_connection(url, _command, "upgrade", revision)
    return await current_revision(url)


async def downgrade(url: str | None = None, revision: str = "base") -> str | None:
    """Downgrade to ``revision`` ("base" drops every ledger table, events included: the data
    is gone). Returns the revision now current (None at base). Raises LedgerNotFound for a
    SQLite file that does not exist (nothing is created)."""
    require_existing(resolve_url(url))
    await _with_connection(url, _command, "downgrade", revision)
    return await current_revision(url)


def _current(sync_conn: Connection, _url: str) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


async def current_revision(url: str | None = None) -> str | None:
    """The database's revision: None for an empty database, and for a SQLite file that does
    not exist (which is not created by asking)."""
    if missing_sqlite_file(resolve_url(url)) is not None:
        return None
    return await _with_connection(url, _current)


def check_revision(sync_conn: Connection, url: str) -> None:
    """Raise SchemaRevisionError unless the database is exactly at :func:`head_revision`.

    The message says what to run: ``duplex-ledger db upgrade --db URL`` for a missing or
    older schema; for a newer one, a newer duplex-ledger (or a downgrade run by it)."""
    current = _current(sync_conn, url)
    head = head_revision()
    if current == head:
        return
    shown = redact(url)
    fix = f"run `duplex-ledger db upgrade --db {shown}`"
    if current is None:
        raise SchemaRevisionError(f"{shown} has no duplex-ledger schema (this code needs revision {head}); {fix}")
    script = ScriptDirectory.from_config(alembic_config(url))
    try:
        script.get_revision(current)
    except CommandError:
        known = False
    else:
        known = True
    if not known:
        raise SchemaRevisionError(
            f"{shown} is at schema revision {current!r}, newer than this code (which knows up to {head}); "
            "upgrade duplex-ledger, or have the newer version run `duplex-ledger db downgrade` to "
            f"{head}. (`duplex-ledger db upgrade --db {shown}` cannot help here.)"
        )
    raise SchemaRevisionError(f"{shown} is at schema revision {current!r}, older than this code's {head}; {fix}")
