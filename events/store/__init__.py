"""Append-only event store (SQLite default, PostgreSQL) — see :class:`EventStore`."""

from typing import TYPE_CHECKING, Any

from events.store.errors import (
    AppendFailed,
    ConcurrencyError,
    EventIdConflict,
    InvalidRow,
    LedgerNotFound,
    NotALedger,
    ReadOnlyStore,
    SchemaRevisionError,
    StoreClosed,
    StoreError,
)
from events.store.rows import ImportRow, StoredRow
from events.store.url import DEFAULT_URL, ENV_VAR, default_url

if TYPE_CHECKING:
    from events.store.store import EventStore, ImportResult


def __getattr__(name: str) -> Any:
    """``EventStore`` and ``ImportResult`` are imported on first use: a process that only
    decodes rows (a rebuild worker, spawned) then never loads the store's SQLAlchemy engine
    and Alembic migrations (~0.5 s of CPU per worker; issue 15)."""
    if name in ("EventStore", "ImportResult"):
        from events.store import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AppendFailed",
    "ConcurrencyError",
    "DEFAULT_URL",
    "ENV_VAR",
    "EventIdConflict",
    "EventStore",
    "ImportResult",
    "ImportRow",
    "InvalidRow",
    "LedgerNotFound",
    "NotALedger",
    "ReadOnlyStore",
    "SchemaRevisionError",
    "StoreClosed",
    "StoreError",
    "StoredRow",
    "default_url",
]
