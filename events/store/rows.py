"""Row shapes crossing the store boundary (besides :mod:`events.records`).

* :class:`NewRow` — one event ready to insert (JSON already dumped, so the writer's
  transaction does no pydantic work).
* :class:`ImportRow` — input of :meth:`EventStore.append_records` (bulk import): a record plus
  the optional stream version it must land at and the original ``recorded_at``.
* :class:`StoredRow` — one row as read back, undecoded (export uses it to stay byte-exact).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from events.records import EventRecord, StoredEvent, from_row_json
from events.types import EventBase


def dump_data(data: dict[str, Any]) -> str:
    """The payload as stored: compact JSON, keys in model order, non-ASCII kept."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class NewRow:
    stream_id: str
    event_id: str
    type: str
    schema_version: int
    ts_us: int
    data: str
    version: int | None = None  # required landing version (bulk import), else None
    recorded_at_us: int | None = None  # None = stamped by the store at commit

    @classmethod
    def from_record(cls, record: EventRecord, *, version: int | None = None, recorded_at_us: int | None = None) -> "NewRow":
        return cls(
            stream_id=record.stream_id,
            event_id=str(record.event_id),
            type=record.type,
            schema_version=record.schema_version,
            ts_us=record.ts_us,
            data=dump_data(record.data),
            version=version,
            recorded_at_us=recorded_at_us,
        )


@dataclass(frozen=True, slots=True)
class ImportRow:
    """``version``: if set, the event must land at exactly this stream version (else the import
    raises ConcurrencyError); ``recorded_at_us``: keep this commit time instead of now."""

    record: EventRecord
    version: int | None = None
    recorded_at_us: int | None = None


@dataclass(frozen=True, slots=True)
class StoredRow:
    position: int
    stream_id: str
    version: int
    event_id: str
    type: str
    schema_version: int
    ts_us: int
    recorded_at_us: int
    data: str

    def decode(self) -> StoredEvent:
        """The typed, upcast event. Raises UnknownEventType, FutureSchemaVersion,
        MissingUpcaster or ValidationError (see :func:`events.records.from_record`)."""
        event: EventBase = from_row_json(
            self.type, self.schema_version, self.stream_id, self.event_id, self.ts_us, self.data
        )
        return StoredEvent(
            position=self.position,
            stream_id=self.stream_id,
            version=self.version,
            recorded_at=self.recorded_at_us / 1_000_000,
            event=event,
        )
