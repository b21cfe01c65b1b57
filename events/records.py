"""The boundary between typed events and stored rows.

:class:`EventRecord` is what a store persists for one event (envelope columns + JSON payload);
:class:`StoredEvent` is what readers get back: the typed event plus its global ``position``,
its per-stream ``version`` and ``recorded_at`` (wall-clock seconds when the store committed
it — distinct from the event's own ``ts``, CASE-10).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

from events.model_rows import model_from_row
from events.structs import decode_payload
from events.types import EventBase, event_class, ts_to_us, us_to_ts
from events.upcasting import upcast


@dataclass(frozen=True, slots=True)
class EventRecord:
    stream_id: str
    event_id: UUID
    type: str
    schema_version: int
    ts_us: int
    data: dict[str, Any]


class StoredEvent(NamedTuple):
    """An event with its place in the log. A NamedTuple (immutable; a million of them are
    built per rebuild, ~3x cheaper than a frozen dataclass)."""

    position: int
    stream_id: str
    version: int
    recorded_at: float
    event: EventBase

    @property
    def ts(self) -> float:
        return self.event.ts


def to_record(event: EventBase) -> EventRecord:
    return EventRecord(
        stream_id=event.session_id,
        event_id=event.event_id,
        type=event.type,  # type: ignore[attr-defined]
        schema_version=event.schema_version,
        ts_us=ts_to_us(event.ts),
        data=event.payload(),
    )


def from_record(
    type_name: str,
    schema_version: int,
    stream_id: str,
    event_id: UUID | str,
    ts_us: int,
    data: dict[str, Any],
) -> EventBase:
    """Rebuild the current typed event from a stored row, upcasting old versions.

    Raises UnknownEventType, FutureSchemaVersion, MissingUpcaster or ValidationError.
    """
    cls = event_class(type_name)
    payload = upcast(type_name, schema_version, cls.SCHEMA_VERSION, data)
    return cls.model_validate(
        {**payload, "type": type_name, "event_id": event_id, "session_id": stream_id, "ts": us_to_ts(ts_us)},
        strict=False,  # a committed row reads back as it always did; the door was strict (issue 22)
    )


def from_row_json(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> EventBase:
    """:func:`from_record` for a stored row whose payload is still JSON text. A current-version
    row is built from its read-side twin without a second validation where that provably
    gives the validated model (:func:`events.model_rows.model_from_row`), else validated
    straight from JSON by pydantic-core (:func:`validate_row_json`); older rows go through the
    upcasters."""
    return model_from_row(type_name, schema_version, stream_id, str(event_id), ts_us, data_json) or validate_row_json(
        type_name, schema_version, stream_id, event_id, ts_us, data_json
    )


def validate_row_json(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> EventBase:
    """:func:`from_row_json` always through pydantic validation (the reference path; raises
    UnknownEventType, FutureSchemaVersion, MissingUpcaster, ValidationError, or ValueError for
    a payload key overriding the envelope)."""
    cls = event_class(type_name)
    if schema_version != cls.SCHEMA_VERSION:
        return from_record(type_name, schema_version, stream_id, event_id, ts_us, json.loads(data_json))
    body = data_json.strip()
    rest = "}" if body == "{}" else "," + body[1:]
    ts = us_to_ts(ts_us)
    envelope = '{"type":%s,"session_id":%s,"event_id":%s,"ts":%r' % (  # noqa: UP031 - the hot path's fastest form
        json.dumps(type_name),
        json.dumps(stream_id),
        json.dumps(str(event_id)),
        ts,
    )
    event = cls.model_validate_json(envelope + rest, strict=False)  # committed: read back as ever
    want = (type_name, stream_id, str(event_id), ts)
    got = (event.type, event.session_id, str(event.event_id), event.ts)
    if got != want:  # a payload key repeated an envelope field (JSON: the last one wins)
        name, value, expected = next(
            d for d in zip(("type", "session_id", "event_id", "ts"), got, want) if d[1] != d[2]
        )
        raise ValueError(
            f"{type_name} row {event_id}: payload field {name!r} ({value!r}) overrides the "
            f"row's envelope ({expected!r})"
        )
    return event


def struct_from_row_json(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> Any:
    """Like :func:`from_row_json`, but a current-version row decodes into its read-side twin
    (:mod:`events.structs`: same fields and attribute access as the model, ~15x cheaper).
    The projection read path. A row the twin refuses, and any older row, takes the pydantic
    path, so the errors raised are the model's own."""
    return decode_payload(type_name, schema_version, stream_id, event_id, ts_us, data_json) or from_row_json(
        type_name, schema_version, stream_id, event_id, ts_us, data_json
    )
