"""Read-only access to a SQLite ledger file: look before anything writes (issue 11, point 6).

A read command (``events export``, ``audit``, ``tables``, ``db current`` …) must leave any
file byte-identical, another application's included: no journal-mode switch, no rewritten
0-byte file. So the file is opened through a ``file:…?mode=ro`` URI (the path escaped as a
file URI, so ``#``, ``?`` and ``%`` in it are not parsed) and nothing sets a pragma that
persists; the ``-wal``/``-shm`` files SQLite creates for such a read are removed after it when
SQLite itself would have (:mod:`events.store.sidecars`). What cannot be opened as a database (a directory, a text file) is
:class:`~events.store.errors.NotALedger`; a missing file is
:class:`~events.store.errors.LedgerNotFound` (nothing created).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from events.store.errors import LedgerNotFound, NotALedger
from events.store.sidecars import no_new_sidecars
from events.store.url import readonly_file_uri, redact, remove_sqlite_file, require_existing, sqlite_path

T = TypeVar("T")


def check_openable(url: str) -> Path:
    """The ledger file of a SQLite ``url``, after checking it exists and is not a directory.
    Raises LedgerNotFound, NotALedger."""
    require_existing(url)
    path = sqlite_path(url)
    if path.is_dir():
        raise NotALedger(f"{redact(url)}: {str(path)!r} is a directory, not a duplex-ledger database")
    return path


def not_a_database(url: str, exc: BaseException) -> NotALedger | None:
    """NotALedger when ``exc`` says the file is not a SQLite database at all, else None."""
    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.DatabaseError) and "not a database" in str(orig):
        return NotALedger(f"{redact(url)}: not a duplex-ledger database (not even an SQLite file: {orig})")
    return None


def read_sqlite(url: str, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sync_connection, url, *args)`` on a read-only connection to the SQLite file,
    inside one read transaction: every statement ``fn`` runs sees the same snapshot, so a
    migration another process commits meanwhile cannot show a revision from before it and a
    table list from after it (CI, stop 19: four concurrent ``db upgrade`` runs). The
    transaction is rolled back (it wrote nothing). Raises LedgerNotFound, NotALedger, or what
    ``fn`` raises."""
    path = check_openable(url)
    with no_new_sidecars(path):  # the -wal/-shm this read brings (events.store.sidecars)
        return _read_sqlite(path, url, fn, *args)


def _read_sqlite(path: Path, url: str, fn: Callable[..., T], *args: Any) -> T:
    engine = create_engine(
        "sqlite+pysqlite://",
        # the driver's own implicit BEGIN comes only before DML: every SELECT would be its own snapshot
        creator=lambda: sqlite3.connect(readonly_file_uri(path), uri=True, isolation_level=None),
        poolclass=pool.NullPool,
    )
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")  # deferred: the snapshot is taken at the first read
            return fn(conn, url, *args)  # closing the connection rolls the transaction back
    except DBAPIError as exc:
        refused = not_a_database(url, exc)
        if refused is None:
            raise
        raise refused from exc
    finally:
        engine.dispose()


def _holds_events(conn: Any, _url: str) -> bool:
    if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'").first() is None:
        return False
    return conn.exec_driver_sql("SELECT 1 FROM events LIMIT 1").first() is not None


def undo_creation(url: str, created: Path) -> bool:
    """Remove a SQLite ledger this process created (``created``: the file, or the topmost
    folder made for it, :func:`events.store.url.missing_ancestor`) after its first write
    failed, unless the file now holds events: another process may have opened the new file
    meanwhile (``create=True``) and appended to it, and its events are never deleted. A file
    that cannot be read is kept too. Returns True when it was removed."""
    try:
        keep = read_sqlite(url, _holds_events)
    except LedgerNotFound:
        keep = False
    except Exception:  # unreadable: keep it rather than guess
        keep = sqlite_path(url).exists()
    if not keep:
        remove_sqlite_file(created)
    return not keep


def readonly_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An aiosqlite engine whose every connection opens the file read-only."""
    uri = readonly_file_uri(sqlite_path(url))
    return create_async_engine("sqlite+aiosqlite://", async_creator=lambda: aiosqlite.connect(uri, uri=True), **kwargs)
