"""The boundary between typed events and stored rows.

:class:`EventRecord` is what a store persists for one event (envelope columns + JSON payload);
:class:`StoredEvent` is what readers get back: the event as its struct (:mod:`events.structs`,
the one runtime shape every reader sees) plus its global ``position``, its per-stream
``version`` and ``recorded_at`` (wall-clock seconds when the store committed it — distinct
from the event's own ``ts``, CASE-10).

:func:`decode_row` is the read path of one stored row; :func:`validate_row_json` and
:func:`from_record` are the pydantic validation of one (the reference, the fallback for rows
msgspec refuses, and the upcasters' way in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

from events.structs import decode_payload, struct_of
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
    built per rebuild, ~3x cheaper than a frozen dataclass). ``event``: the event's struct
    (:mod:`events.structs`), whether it was read back or handed on live."""

    position: int
    stream_id: str
    version: int
    recorded_at: float
    event: Any  # the event's struct: attribute access as on its model (events.structs)

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


def validate_row_json(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> EventBase:
    """The model of a stored row whose payload is still JSON text, through pydantic validation
    (the reference path; raises UnknownEventType, FutureSchemaVersion, MissingUpcaster,
    ValidationError, or ValueError for a payload key overriding the envelope)."""
    cls = event_class(type_name)
    if type(data_json) is not str:  # BLOB, or TEXT that is not UTF-8: only an edit leaves it
        raise ValueError(f"{type_name} row {event_id}: data holds {data_json!r:.80}, not JSON text: the row was edited")
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


def decode_row(type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str) -> Any:
    """The struct of a stored row (the read path of every reader): a current-version row
    decodes straight into it (:func:`events.structs.decode_payload`, ~15x cheaper than
    validation). A row msgspec refuses, and any older row, is validated by its model
    (:func:`validate_row_json`, upcasters included), so the errors raised are the model's own
    (UnknownEventType, FutureSchemaVersion, MissingUpcaster, ValidationError, ValueError); a
    row the model accepts is then handed on as its struct (:func:`events.structs.struct_of`)."""
    return decode_payload(type_name, schema_version, stream_id, event_id, ts_us, data_json) or struct_of(
        validate_row_json(type_name, schema_version, stream_id, event_id, ts_us, data_json)
    )
