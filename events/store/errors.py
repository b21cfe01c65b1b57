"""Typed errors raised by the event store. None of them is a raw driver error."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class ConcurrencyError(StoreError):
    """Optimistic concurrency failed: ``stream_id`` was at version ``actual`` when the caller
    expected ``expected`` (0 = "the stream must not exist yet"). Nothing was appended.
    ``event_id``: the imported row that did not fit (bulk import), else None."""

    def __init__(self, stream_id: str, expected: int, actual: int, event_id: str | None = None) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        self.event_id = event_id
        super().__init__(f"stream {stream_id!r}: expected version {expected}, but it is at version {actual}")


class EventIdConflict(StoreError):
    """Some event ids of a call are already stored but the call is not an exact re-append of
    them: only part of the batch exists, or a stored copy differs in content (stream, type,
    schema_version, ts or data; see :func:`events.store.planning.same_content`).
    Nothing was appended. ``event_ids`` lists the ids at fault (strings)."""

    def __init__(self, stream_id: str, event_ids: list[str], reason: str) -> None:
        self.stream_id = stream_id
        self.event_ids = event_ids
        super().__init__(
            f"stream {stream_id!r}: {reason}: {', '.join(event_ids[:5])}"
            + (f" (+{len(event_ids) - 5} more)" if len(event_ids) > 5 else "")
        )


class SchemaRevisionError(StoreError):
    """The database schema revision differs from the code's (older, newer or missing)."""


class NotALedger(SchemaRevisionError):
    """The database (a SQLite file: another application's, a text file, a directory) is not a
    duplex-ledger database. It was opened read-only and left as it was."""


class ReadOnlyStore(StoreError):
    """An append on a store opened with ``read_only=True``."""


class InvalidRow(StoreError, ValueError):
    """A row the store would not read back identically (DOMAIN §5.7 D12): a ``ts`` outside
    1970 … 9999, a NUL in the stream id. Refused before the group commit; nothing written."""


class AppendFailed(StoreError):
    """The database refused this call's rows (the driver's reason is the message and the
    ``__cause__``). The calls committed with it in the same group commit were retried without
    it and are unaffected; nothing of this call was written."""


class LedgerNotFound(SchemaRevisionError):
    """A SQLite ledger file that does not exist was opened without ``create``. Nothing was
    created (no file, no folder): a mistyped path must not leave an empty ledger behind."""


class StoreClosed(StoreError):
    """The store was closed; no further appends are accepted."""


class ForeignSchemaObject(SchemaRevisionError):
    """A SQLite ledger file holds a trigger, view or index the ledger did not create (or one
    whose text was changed, or ``sqlite_stat*`` rows ANALYZE would not write): opening it
    would run code from the file. ``objects`` names each. Nothing was changed."""

    def __init__(self, message: str, objects: list[str] | None = None) -> None:
        super().__init__(message)
        self.objects = list(objects or [])


class MissingSchemaObject(SchemaRevisionError):
    """The ledger lacks one of its own schema objects (a guard trigger dropped; on PostgreSQL
    also one disabled): its append-only guard was taken off. Every command but ``verify``
    (which reports it as tampering) refuses it; nothing was changed."""
