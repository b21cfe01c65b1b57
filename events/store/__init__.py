"""Append-only event store (SQLite default, PostgreSQL) — see :class:`EventStore`."""

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
from events.store.store import EventStore, ImportResult
from events.store.url import DEFAULT_URL, ENV_VAR, default_url

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
