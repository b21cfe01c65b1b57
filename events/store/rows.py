"""Row shapes crossing the store boundary (besides :mod:`events.records`).

* :class:`NewRow` — one event ready to insert (JSON already dumped, so the writer's
  transaction does no pydantic work).
* :class:`ImportRow` — input of :meth:`EventStore.append_records` (bulk import): a record plus
  the optional stream version it must land at and the original ``recorded_at``.
* :class:`StoredRow` — one row as read back, undecoded (export uses it to stay byte-exact).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from math import floor as _floor
from typing import Any, NamedTuple
from uuid import UUID

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from pydantic_core import to_json as _to_json

from events.chain import Pieces, row_pieces
from events.gc_pause import gc_paused
from events.limits import (
    INT64_MAX,
    MAX_REQUEST_ID_BYTES,
    MAX_STREAM_ID_BYTES,
    MAX_TS_US,
    MIN_TS_US,
    check_value,
    id_length_error,
)
from events.records import EventRecord, StoredEvent, decode_row, to_record
from events.store.errors import InvalidRow
from events.types import EventBase, _EventId, ts_to_us

# ids this long in code points fit their byte limits whatever they hold (4 bytes a code point)
_SHORT_STREAM_ID = MAX_STREAM_ID_BYTES // 4
_SHORT_REQUEST_ID = MAX_REQUEST_ID_BYTES // 4
_new_tuple = tuple.__new__  # a NamedTuple built without its generated __new__'s Python frame
_I = struct.Struct(">I").pack
_I36 = _I(36)  # the length of a UUID's text
_QQ = struct.Struct(">qq").pack
_ENVELOPE = {"type", "event_id", "session_id", "ts", "schema_version"}
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


_length_prefixed: dict[str, bytes] = {}
"""Stream ids and type names -> their run in :func:`events.chain.row_pieces` (length, UTF-8):
the same few texts start every appended row's pieces."""
_MAX_PREFIXED = 10_000


def _prefixed(text: str) -> bytes:
    """``text``'s run in the chain pieces (its UTF-8 length as ``>I``, then its UTF-8), kept in
    :data:`_length_prefixed` (emptied once it holds :data:`_MAX_PREFIXED` texts). Raises
    UnicodeEncodeError for text that is not UTF-8 (a lone surrogate)."""
    utf8 = text.encode()
    run = _I(len(utf8)) + utf8
    if len(_length_prefixed) >= _MAX_PREFIXED:
        _length_prefixed.clear()
    _length_prefixed[text] = run
    return run


def dump_data(data: dict[str, Any]) -> str:
    """A raw payload dict as stored: compact JSON, keys in given order, non-ASCII kept. Used
    for rows kept at an old schema version (import); typed events use :func:`payload_json`.
    Raises ValueError for NaN/inf (DOMAIN §5.7 D12)."""
    return _dumps(data)


def payload_json(event: EventBase) -> str:
    """A typed event's payload (``event.payload()``) as stored: compact JSON written by
    pydantic directly (several times faster than dumping a dict). The model's serializer is
    called as ``model_dump_json`` calls it (all other options at their defaults), without the
    wrapper's Python frame (~1 µs an event)."""
    return event.__pydantic_serializer__.to_json(event, exclude=_ENVELOPE).decode()  # type: ignore[no-any-return]


def refuse_non_finite(event: EventBase, data_utf8: bytes, event_id: str) -> None:
    """Raise InvalidRow naming the field when ``event`` (built around validation:
    ``model_construct``, ``model_copy(update=…)``) holds a NaN or infinite number, or an
    integer beyond 64 bits, that its payload text ``data_utf8`` would carry (DOMAIN §5.7 D12:
    the store could not read it back). Cheap for every append: the payload is searched for the
    ``NaN``/``Infinity`` tokens the models write for them (``ser_json_inf_nan="constants"``),
    and only a payload holding one (a text that spells it, too) has its fields walked."""
    if b"NaN" not in data_utf8 and b"Infinity" not in data_utf8:
        return
    for name, value in event.__dict__.items():
        try:
            check_value(value.model_dump() if isinstance(value, BaseModel) else value, name)
        except ValueError as exc:
            raise InvalidRow(f"event {event_id}: cannot be stored: {exc}") from None


class NewRow(NamedTuple):
    """One event ready to insert. A NamedTuple, built once per appended event on the caller's
    side (a frozen dataclass's ``__init__`` cost ~1.2 µs of an append's ~8 µs: issue 23 step
    6); :meth:`checked` builds it without a Python frame."""

    stream_id: str
    event_id: str
    type: str
    schema_version: int
    ts_us: int
    data: str
    version: int | None = None  # required landing version (bulk import), else None
    recorded_at_us: int | None = None  # None = stamped by the store at commit
    # The hash chain's position-independent bytes (events.chain.row_pieces), set by check():
    # encoded on the caller's side, so the write lock only links them (issue 15).
    pieces: Pieces | None = None

    @classmethod
    def from_event(cls, event: EventBase) -> NewRow:
        """The row of a typed event. Raises InvalidRow for an event built around validation
        (``model_construct``) whose ts or payload cannot be stored (NaN, lone surrogates)."""
        try:
            row = cls(
                event.session_id,
                str(event.event_id),
                event.type,  # type: ignore[attr-defined]
                event.schema_version,
                ts_to_us(event.ts),
                payload_json(event),
            )
        except (ValueError, OverflowError, TypeError, PydanticSerializationError) as exc:
            raise InvalidRow(f"event {getattr(event, 'event_id', '?')}: cannot be stored: {exc}") from exc
        return row._refusing_non_finite(event)  # its InvalidRow as it is (not named twice)

    @classmethod
    def checked(cls, event: EventBase) -> NewRow:
        """``NewRow.from_event(event).check()`` in one step (the append's per-event work on the
        caller's side: one construction, :attr:`pieces` included). Raises what they raise.

        One Python frame for the common event (issue 23 step 6): the fresh id's text read from
        its slot, ``ts`` turned into µs as :func:`events.types.ts_to_us` does, and the NaN/inf
        refusal entered only for a payload spelling one of their tokens (a test checks each
        agrees with the function it stands for)."""
        # the fields read from the model's mapping (a model's attribute lookup walks its classes
        # first; getattr for a field it lacks, request_ids of most events, goes through
        # pydantic's __getattr__ and an AttributeError, ~2 µs an append)
        fields = event.__dict__
        try:
            try:
                uid, stream_id, type_ = fields["event_id"], fields["session_id"], fields["type"]
                schema_version, ts = fields["schema_version"], fields["ts"]
            except KeyError:  # built around validation without a field: its attributes, their errors
                uid, stream_id, type_ = event.event_id, event.session_id, event.type  # type: ignore[attr-defined]
                schema_version, ts = event.schema_version, event.ts
            # a UUID's text: a fresh id's own (formatted once, events.types.new_event_id), else
            # as pydantic writes it (the same as str(), in Rust: ~0.3 µs less)
            if type(uid) is _EventId:
                try:
                    event_id = uid._text
                except AttributeError:
                    event_id = str(uid)
                event_id_utf8 = event_id.encode()
            elif type(uid) is UUID:
                event_id_utf8 = _to_json(uid)[1:-1]
                event_id = event_id_utf8.decode()
            else:
                event_id_utf8, event_id = None, str(uid)
            whole = _floor(ts)  # events.types.ts_to_us, inline
            ts_us = whole * 1_000_000 + round((ts - whole) * 1_000_000)
            data_utf8 = event.__pydantic_serializer__.to_json(event, exclude=_ENVELOPE)  # as payload_json
            data = data_utf8.decode()
        except (ValueError, OverflowError, TypeError, PydanticSerializationError) as exc:
            raise InvalidRow(f"event {getattr(event, 'event_id', '?')}: cannot be stored: {exc}") from exc
        # refuse_non_finite's token search, entered only for a payload holding a capital N or
        # I (one memchr each, ~25 ns, against ~370 ns for the tokens' search in the bytes)
        if ("N" in data or "I" in data) and ("NaN" in data or "Infinity" in data):
            refuse_non_finite(event, data_utf8, event_id)
        # the common case, every id short by its length in code points, decided inline
        request_id = fields.get("request_id")
        if (
            type(stream_id) is not str
            or len(stream_id) > _SHORT_STREAM_ID
            or (request_id is not None and (type(request_id) is not str or len(request_id) > _SHORT_REQUEST_ID))
            or fields.get("request_ids") is not None
        ) and (too_long := id_length_error(stream_id, fields)) is not None:
            raise InvalidRow(f"event {event_id}: {too_long[0]}: {too_long[1]}")
        if not MIN_TS_US <= ts_us <= MAX_TS_US or "\x00" in stream_id:
            return cls(stream_id, event_id, type_, schema_version, ts_us, data).check()  # its own error
        try:  # the serializer's UTF-8 bytes are the hash's payload bytes: the text is built once
            if event_id_utf8 is None:
                pieces = row_pieces(stream_id, event_id, type_, schema_version, ts_us, data, data_utf8)
            else:  # row_pieces' three runs, the id's bytes as written above (a test checks they agree)
                s = _length_prefixed.get(stream_id) or _prefixed(stream_id)
                t = _length_prefixed.get(type_) or _prefixed(type_)
                pieces = (
                    s,
                    b"".join((_I36, event_id_utf8, t, _QQ(schema_version, ts_us))),
                    _I(len(data_utf8)) + data_utf8,
                )
        except (struct.error, UnicodeEncodeError):
            pieces = None
        return _new_tuple(cls, (stream_id, event_id, type_, schema_version, ts_us, data, None, None, pieces))

    def _refusing_non_finite(self, event: EventBase) -> NewRow:
        refuse_non_finite(event, self.data.encode("utf-8", "surrogatepass"), self.event_id)
        return self

    def check(self) -> NewRow:
        """This row, with :attr:`pieces` encoded; raises :class:`InvalidRow` unless the store
        reads it back identically (DOMAIN §5.7 D12): ``ts`` and ``recorded_at`` within 1970 …
        9999 UTC, a stream id without NUL, a ``version`` within 64 bits. The models refuse such
        values already; this guards rows built around them (``model_construct``, hand-made
        ImportRows) before the group commit. :attr:`pieces` stays None for an integer beyond 64
        bits or text that is not UTF-8: the writer then refuses the row as before."""
        for name, us in (("ts", self.ts_us), ("recorded_at", self.recorded_at_us)):
            if us is not None and not MIN_TS_US <= us <= MAX_TS_US:
                raise InvalidRow(f"event {self.event_id}: {name} ({us} µs) is outside 1970 … 9999 UTC")
        if "\x00" in self.stream_id:
            raise InvalidRow(f"event {self.event_id}: the stream id contains a NUL character")
        if self.version is not None and not 1 <= self.version <= INT64_MAX:
            raise InvalidRow(f"event {self.event_id}: version {self.version} is outside 1 … {INT64_MAX}")
        try:
            pieces = row_pieces(self.stream_id, self.event_id, self.type, self.schema_version, self.ts_us, self.data)
        except (struct.error, UnicodeEncodeError):
            return self
        return self._replace(pieces=pieces)

    @classmethod
    def from_import(cls, row: ImportRow) -> NewRow:
        """The row of an import. Raises InvalidRow for an id longer than its limit
        (:func:`events.limits.id_length_error`)."""
        record = row.record
        if (too_long := id_length_error(record.stream_id, record.data)) is not None:
            raise InvalidRow(f"event {record.event_id}: {too_long[0]}: {too_long[1]}")
        return cls(
            stream_id=record.stream_id,
            event_id=str(record.event_id),
            type=record.type,
            schema_version=record.schema_version,
            ts_us=record.ts_us,
            data=row.data_json if row.data_json is not None else dump_data(record.data),
            version=row.version,
            recorded_at_us=row.recorded_at_us,
        )


@dataclass(frozen=True, slots=True)
class ImportRow:
    """``version``: if set, the event must land at exactly this stream version (else the import
    raises ConcurrencyError); ``recorded_at_us``: keep this commit time instead of now;
    ``data_json``: the payload text to store (default: ``record.data`` dumped); ``line``:
    where it came from (a JSONL line number), named by errors about this row."""

    record: EventRecord
    version: int | None = None
    recorded_at_us: int | None = None
    data_json: str | None = None
    line: int | None = None

    @classmethod
    def from_event(
        cls, event: EventBase, *, version: int | None = None, recorded_at_us: int | None = None, line: int | None = None
    ) -> ImportRow:
        """A typed (current-version) event, stored exactly as :meth:`EventStore.append` would."""
        return cls(to_record(event), version, recorded_at_us, payload_json(event), line)


class StoredRow(NamedTuple):
    """One stored row, undecoded; a NamedTuple (cheap to build from a fetched row)."""

    position: int
    stream_id: str
    version: int
    event_id: str
    type: str
    schema_version: int
    ts_us: int
    recorded_at_us: int
    data: str
    hash: bytes | None = None  # chain link (events.chain); None only for a row the store did not write

    def decode(self) -> StoredEvent:
        """The event as its struct, upcast (:func:`events.records.decode_row`). Raises UnknownEventType, FutureSchemaVersion,
        MissingUpcaster or ValidationError (see :func:`events.records.from_record`). One row:
        no collector pause (the live ``subscribe`` path decodes row by row)."""
        decode = decode_row
        if type(self.stream_id) is not str or type(self.version) is not int:
            _retyped(self)
        event = decode(self.type, self.schema_version, self.stream_id, self.event_id, self.ts_us, self.data)
        return StoredEvent(self.position, self.stream_id, self.version, self.recorded_at_us / 1_000_000, event)


def decode_rows(rows: Iterable[StoredRow]) -> list[StoredEvent]:
    """:meth:`StoredRow.decode` over many rows (the rebuild loop: one call, locals only).

    The cyclic garbage collector is paused while the batch decodes
    (:func:`events.gc_pause.gc_paused`: the objects built are acyclic and all kept)."""
    decode = decode_row
    new = tuple.__new__  # StoredEvent's own __new__ without its Python frame
    with gc_paused():
        return [
            new(
                StoredEvent,
                (
                    r.position,
                    r.stream_id if type(r.stream_id) is str and type(r.version) is int else _retyped(r),
                    r.version,
                    r.recorded_at_us / 1_000_000,
                    decode(r.type, r.schema_version, r.stream_id, r.event_id, r.ts_us, r.data),
                ),
            )
            for r in rows
        ]


def _retyped(row: StoredRow) -> str:
    """Raise ValueError for a row whose stream id or version is not of the type the store
    writes (SQLite ``typeof``: an edit, issue 22) — which decoding would otherwise carry into
    a fold that sorts or compares them."""
    from events.chain_walk import retyped

    raise ValueError(
        f"position {row.position}: {retyped(row) or 'a value of another storage type'}: the row was edited "
        "(run `duplex-ledger verify`)"
    )
